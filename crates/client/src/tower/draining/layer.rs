//! The draining layer and its switch: configuration only.

use std::sync::Arc;

use tokio::sync::watch;
use tower::Layer;

use super::Draining;

/// The drain switch of one provider: off until [`start`](Self::start), then on for good.
///
/// Cheap to clone (an `Arc` inside); clones share the state.
#[derive(Debug, Clone)]
pub struct DrainSignal {
    state: Arc<watch::Sender<bool>>,
}

/// Wraps a service in [`Draining`] (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct DrainingLayer {
    signal: DrainSignal,
}

impl Default for DrainSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl DrainSignal {
    /// A switch that is off.
    pub fn new() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Turns draining on: every response from now on says so. Idempotent; there is no way
    /// back (an instance that drains leaves).
    pub fn start(&self) {
        self.state.send_replace(true);
    }

    /// Whether [`start`](Self::start) was called.
    pub fn is_draining(&self) -> bool {
        *self.state.borrow()
    }

    /// Resolves once [`start`](Self::start) was called (at once if it was). Cancellation safe.
    pub async fn started(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|draining| *draining).await;
    }
}

impl DrainingLayer {
    /// A layer switched by `signal`.
    pub fn new(signal: DrainSignal) -> Self {
        Self { signal }
    }
}

impl<S> Layer<S> for DrainingLayer {
    type Service = Draining<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Draining::new(inner, self.signal.clone())
    }
}
