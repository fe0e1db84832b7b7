//! A subscription: the latest view of one service as a watch channel, plus a balancer.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gangway_core::model::{Instance, ServiceKey};
use gangway_core::view::View;
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::balance::{Balancer, RoundRobin, WarmUp};
use crate::session::Command;

/// The live view of one service, fed by registry pushes and the pull fallback.
///
/// Obtained from [`Client::subscribe`](crate::Client::subscribe). Before the first snapshot
/// arrives the view is empty at revision 0 (the registry sends none during its warm-up after a
/// restart); use [`wait_for`](Self::wait_for) to wait for a useful one. While the session is
/// disconnected the last view keeps being served; it is never cleared.
///
/// Cloning is cheap; clones share the balancer's state. The registry subscription ends when
/// the last clone (of this and of every other `Subscription` to the same service from the
/// same client) is dropped; receivers from [`receiver`](Self::receiver) then see the channel
/// closed.
#[derive(Clone)]
pub struct Subscription {
    service: ServiceKey,
    rx: watch::Receiver<Arc<View>>,
    balancer: Arc<dyn Balancer>,
    _guard: Arc<Guard>,
}

/// Unsubscribes when the last clone of a [`Subscription`] goes.
struct Guard {
    service: ServiceKey,
    commands: mpsc::UnboundedSender<Command>,
}

/// Whether a snapshot replaces the cached view: the snapshot-acceptance rule.
///
/// A snapshot is applied only when its revision is newer than the cached one: revisions only
/// grow on one registry (seeded from its boot time), and a pull reply and a push leave the
/// server from different tasks on one stream, so an older snapshot may arrive after a newer
/// one and must not take the cache back. The first snapshot of a subscription, and the first
/// after each reconnect, is applied whatever its revision: the registry may have restarted
/// and handed out lower revisions. Only an applied snapshot is acked with its own revision; an
/// older one is acked with the revision the cache holds (which the registry already counts),
/// so no ack ever claims a view the client does not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheState {
    /// Revision of the cached view.
    pub(crate) revision: u64,
    /// The next snapshot is applied unconditionally.
    pub(crate) fresh: bool,
}

impl Subscription {
    pub(crate) fn new(
        service: ServiceKey,
        rx: watch::Receiver<Arc<View>>,
        commands: mpsc::UnboundedSender<Command>,
    ) -> Self {
        Self {
            _guard: Arc::new(Guard {
                service: service.clone(),
                commands,
            }),
            service,
            rx,
            balancer: Arc::new(WarmUp::with_default_curve(RoundRobin::new())),
        }
    }

    /// Replaces the balancer used by [`pick`](Self::pick) (default [`RoundRobin`] inside
    /// [`WarmUp`] with its default curve). Wrap yours in [`WarmUp`] to keep warm-up.
    pub fn with_balancer(mut self, balancer: impl Balancer + 'static) -> Self {
        self.balancer = Arc::new(balancer);
        self
    }

    /// The subscribed service.
    pub fn service(&self) -> &ServiceKey {
        &self.service
    }

    /// The current view (cheap: an `Arc` clone). Never blocks.
    pub fn view(&self) -> Arc<View> {
        self.rx.borrow().clone()
    }

    /// Waits until the view changes after the last one this handle saw (through `changed`,
    /// `wait_for` or the initial value), and returns the new view.
    ///
    /// Cancellation safe. No timeout: wrap it in `tokio::time::timeout` if needed.
    ///
    /// # Errors
    /// [`Error::Closed`] when the client was closed or the subscription ended.
    pub async fn changed(&mut self) -> Result<Arc<View>, Error> {
        self.rx.changed().await.map_err(|_| Error::Closed)?;
        Ok(self.rx.borrow_and_update().clone())
    }

    /// A clone of the underlying watch receiver, e.g. to hand to another task. It does not keep
    /// the subscription alive on its own.
    pub fn receiver(&self) -> watch::Receiver<Arc<View>> {
        self.rx.clone()
    }

    /// Waits until `predicate` holds for the current or a later view, at most `timeout`.
    /// Returns immediately when it already holds.
    ///
    /// # Errors
    /// [`Error::Timeout`] (operation `"wait_for"`) after `timeout`; [`Error::Closed`] when the
    /// subscription ended first.
    pub async fn wait_for(
        &mut self,
        mut predicate: impl FnMut(&View) -> bool,
        timeout: Duration,
    ) -> Result<Arc<View>, Error> {
        match tokio::time::timeout(timeout, self.rx.wait_for(|v| predicate(v))).await {
            Ok(Ok(view)) => Ok(view.clone()),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => Err(Error::Timeout {
                operation: "wait_for",
                after: timeout,
            }),
        }
    }

    /// Picks an instance of the current view through the balancer; `None` when it holds no
    /// pickable instance (empty, or only weight 0).
    pub fn pick(&self) -> Option<Instance> {
        let view = self.view();
        self.balancer.pick(&view)
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("service", &self.service)
            .field("revision", &self.rx.borrow().revision)
            .finish_non_exhaustive()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The session task may be gone already (client closed); nothing to undo then.
        let _ = self.commands.send(Command::Unsubscribe {
            service: self.service.clone(),
        });
    }
}

impl CacheState {
    /// No snapshot applied yet.
    pub(crate) fn new() -> Self {
        Self {
            revision: 0,
            fresh: true,
        }
    }

    /// Records a delta from `base` to `revision`; `true` when it applies to the cached view
    /// (held at a revision from `base` to before `revision`): then `self.revision` becomes
    /// `revision`. A fresh cache (nothing held since the last reconnect) takes no delta.
    pub(crate) fn accept_delta(&mut self, base: u64, revision: u64) -> bool {
        let apply = !self.fresh && base <= self.revision && revision > self.revision;
        if apply {
            self.revision = revision;
        }
        apply
    }

    /// Records a snapshot at `revision`; `true` when it must replace the cached view (then
    /// `self.revision` becomes `revision`; otherwise it stays).
    pub(crate) fn accept(&mut self, revision: u64) -> bool {
        let apply = self.fresh || revision > self.revision;
        if apply {
            self.revision = revision;
            self.fresh = false;
        }
        apply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_snapshot_is_applied_even_at_revision_zero() {
        let mut c = CacheState::new();
        assert!(c.accept(0));
        assert!(!c.accept(0), "same revision again is not re-applied");
    }

    #[test]
    fn only_a_newer_revision_is_applied() {
        let mut c = CacheState::new();
        assert!(c.accept(5));
        assert!(!c.accept(5));
        assert!(c.accept(6));
        assert!(
            !c.accept(4),
            "an older snapshot (a pull reply overtaken by a push) must not take the cache back"
        );
        assert_eq!(c.revision, 6);
        assert!(c.accept(7));
        assert_eq!(c.revision, 7);
    }

    #[test]
    fn a_delta_applies_only_from_its_base_on() {
        let mut c = CacheState::new();
        assert!(!c.accept_delta(0, 5), "nothing held yet: no delta");
        assert!(c.accept(5));
        assert!(
            !c.accept_delta(6, 8),
            "we hold 5, the delta needs 6 or later"
        );
        assert_eq!(c.revision, 5);
        assert!(c.accept_delta(3, 8), "a delta from 3 applies to 5");
        assert_eq!(c.revision, 8);
        assert!(!c.accept_delta(3, 8), "not again");
        assert!(!c.accept_delta(3, 7), "older");
        c.fresh = true;
        assert!(!c.accept_delta(8, 9), "after a reconnect only a whole view");
    }

    #[test]
    fn after_reconnect_the_first_snapshot_is_applied_whatever_its_revision() {
        let mut c = CacheState::new();
        assert!(c.accept(7));
        c.fresh = true; // what the session task does on disconnect
        assert!(c.accept(7), "restarted registry may reuse the revision");
        assert!(!c.accept(7));
        c.fresh = true;
        assert!(c.accept(1));
        assert_eq!(
            c,
            CacheState {
                revision: 1,
                fresh: false
            }
        );
    }
}
