//! A `tower::discover::Discover` fed by a subscription.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use gangway_core::model::{Instance, InstanceKey};
use gangway_core::view::View;
use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tower::discover::Change;

use crate::Subscription;
use crate::balance::pickable;
use crate::outlier::OutlierDetector;

/// When an instance that stays in the view gets a new service (a `Change::Insert` with its
/// key again, which makes tower's balancer replace the old service once the new one is ready).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rebuild {
    /// When its metadata changed (default): `make` may read metadata (a protocol, a TLS
    /// name, a path prefix). Weight and health changes only decide membership (through the
    /// pickable rule) and keep the service and its connections.
    #[default]
    OnMetadataChange,
    /// When any field of the [`Instance`] changed (weight, health, enabled, ephemeral,
    /// metadata): for a `make` that reads them. Costs a new service (and its connections) on
    /// every weight change.
    OnAnyChange,
    /// Never: a service lives as long as its key stays pickable.
    Never,
}

/// A [`Discover`](tower::discover::Discover) of the pickable instances of a subscribed
/// service, for `tower::balance::p2c::Balance` and friends.
///
/// It is a `Stream` of `Result<Change<InstanceKey, S>, Infallible>`. The first poll yields a
/// `Change::Insert` for every pickable instance of the current view (see
/// [`balance::pickable`](crate::balance::pickable): enabled, weight > 0, healthy unless
/// none is); then, on every view change, the difference with the previous view:
/// - `Change::Remove(key)` for every instance that is no longer pickable (left, disabled,
///   weight 0, unhealthy while healthy ones remain), first, in key order;
/// - `Change::Insert(key, make(&instance))` for every new pickable instance, and for one whose
///   fields changed as [`Rebuild`] says (default: metadata), in key order.
///
/// Views are read from a `tokio::sync::watch` channel, so a burst of changes between two polls
/// collapses into one diff against the latest view. When the subscription ends (its client
/// closed) the stream ends without removing anything: the balancer keeps the last set, as a
/// [`Subscription`] keeps serving its last view.
///
/// `make` builds the per-instance service: typically a connection pool to
/// `instance.key.addr()` wrapped in an [`EjectionLayer`](super::EjectionLayer). It is called
/// on the task polling the balancer and must not block. Dropping a removed service is how its
/// idle connections close (issue 3 §4).
///
/// ```
/// use gangway_client::Subscription;
/// use gangway_client::tower::ViewDiscover;
/// use tower::balance::p2c::Balance;
/// use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
/// use tower::{BoxError, Service, ServiceExt};
///
/// async fn call_one(orders: &Subscription) -> Result<String, BoxError> {
///     // One (toy) service per instance: answers with the instance's address.
///     let discover = ViewDiscover::new(orders, |instance| {
///         let addr = instance.key.addr();
///         tower::service_fn(move |_: ()| {
///             let addr = addr.clone();
///             async move { Ok::<_, std::io::Error>(addr) }
///         })
///     });
///     // p2c needs a load metric per service: requests in flight.
///     let mut balance =
///         Balance::new(PendingRequestsDiscover::new(discover, CompleteOnResponse::default()));
///     balance.ready().await?.call(()).await
/// }
/// ```
pub struct ViewDiscover<S> {
    views: WatchStream<Arc<View>>,
    make: Box<dyn FnMut(&Instance) -> S + Send>,
    rebuild: Rebuild,
    detector: Option<Arc<OutlierDetector>>,
    /// The pickable instances of the last view, by key.
    current: BTreeMap<InstanceKey, Instance>,
    /// Changes computed from the last view, not yet yielded.
    pending: VecDeque<Change<InstanceKey, S>>,
    /// Keeps the registry subscription alive as long as the balancer lives.
    _subscription: Option<Subscription>,
}

// No field is ever pinned structurally: services only sit in a `VecDeque` until yielded.
impl<S> Unpin for ViewDiscover<S> {}

impl<S> ViewDiscover<S> {
    /// A discover of `subscription`'s pickable instances; `make` builds the service of each.
    /// Holds a clone of `subscription`, so the registry subscription lasts as long as this
    /// discover (and the balancer that owns it).
    pub fn new(
        subscription: &Subscription,
        make: impl FnMut(&Instance) -> S + Send + 'static,
    ) -> Self {
        let mut discover = Self::from_receiver(subscription.receiver(), make);
        discover._subscription = Some(subscription.clone());
        discover
    }

    /// A discover of the views of a watch channel (e.g. [`Subscription::receiver`], or views
    /// built by hand in tests). A receiver alone does not keep a subscription alive: when the
    /// last `Subscription` clone goes, the channel closes and the stream ends.
    pub fn from_receiver(
        views: watch::Receiver<Arc<View>>,
        make: impl FnMut(&Instance) -> S + Send + 'static,
    ) -> Self {
        Self {
            views: WatchStream::new(views),
            make: Box::new(make),
            rebuild: Rebuild::default(),
            detector: None,
            current: BTreeMap::new(),
            pending: VecDeque::new(),
            _subscription: None,
        }
    }

    /// When an instance that stays pickable gets a new service (default
    /// [`Rebuild::OnMetadataChange`]).
    pub fn with_rebuild(mut self, rebuild: Rebuild) -> Self {
        self.rebuild = rebuild;
        self
    }

    /// Calls [`OutlierDetector::retain`] with the pickable keys of every new view, so the
    /// detector forgets instances that left (their outcomes and ejections). Use it with the
    /// detector given to [`EjectionLayer`](super::EjectionLayer).
    pub fn with_detector(mut self, detector: Arc<OutlierDetector>) -> Self {
        self.detector = Some(detector);
        self
    }

    /// Diffs `view` against the current set and queues the changes.
    fn apply(&mut self, view: &View) {
        let next: BTreeMap<InstanceKey, Instance> = pickable(view)
            .into_iter()
            .map(|i| (i.key.clone(), i.clone()))
            .collect();
        if let Some(detector) = &self.detector {
            let live: Vec<InstanceKey> = next.keys().cloned().collect();
            detector.retain(&live);
        }
        for key in self.current.keys() {
            if !next.contains_key(key) {
                self.pending.push_back(Change::Remove(key.clone()));
            }
        }
        for (key, instance) in &next {
            let insert = match self.current.get(key) {
                None => true,
                Some(old) => match self.rebuild {
                    Rebuild::OnMetadataChange => old.metadata != instance.metadata,
                    Rebuild::OnAnyChange => old != instance,
                    Rebuild::Never => false,
                },
            };
            if insert {
                let service = (self.make)(instance);
                self.pending.push_back(Change::Insert(key.clone(), service));
            }
        }
        self.current = next;
    }
}

impl<S> Stream for ViewDiscover<S> {
    type Item = Result<Change<InstanceKey, S>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(change) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(change)));
            }
            match Pin::new(&mut this.views).poll_next(cx) {
                Poll::Ready(Some(view)) => this.apply(&view),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S> fmt::Debug for ViewDiscover<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ViewDiscover")
            .field("instances", &self.current.keys().collect::<Vec<_>>())
            .field("pending", &self.pending.len())
            .field("rebuild", &self.rebuild)
            .finish_non_exhaustive()
    }
}

/// The pickable instances of `subscription` as tonic endpoints (`http://ip:port`, each passed
/// through `configure` for timeouts, TLS, keep-alive...), in the shape
/// `tonic::transport::Channel::balance_channel` consumes. Instances whose address is not a
/// valid URI authority are skipped with a warning (registered keys are validated, so this
/// does not happen with a gangway registry). The items are tonic's own `Change` type (not
/// tower's), which `balance_channel`'s sender takes.
///
/// Endpoints are rebuilt on metadata changes ([`Rebuild::OnMetadataChange`]). The stream
/// holds a clone of `subscription` and ends when it does. See [`balance_channel`] for the
/// whole wiring.
pub fn tonic_endpoints(
    subscription: &Subscription,
    configure: impl Fn(&Instance, tonic::transport::Endpoint) -> tonic::transport::Endpoint
    + Send
    + 'static,
) -> impl Stream<Item = tonic::transport::channel::Change<InstanceKey, tonic::transport::Endpoint>>
+ Send
+ Unpin
+ 'static {
    use tonic::transport::channel::Change as TonicChange;

    let discover = ViewDiscover::new(subscription, move |instance: &Instance| {
        let uri = format!("http://{}", instance.key.addr());
        match tonic::transport::Endpoint::from_shared(uri) {
            Ok(endpoint) => Some(configure(instance, endpoint)),
            Err(error) => {
                tracing::warn!(instance = %instance.key, %error, "instance skipped: not a valid endpoint");
                None
            }
        }
    });
    tokio_stream::StreamExt::filter_map(discover, |change| match change {
        Ok(Change::Insert(key, Some(endpoint))) => Some(TonicChange::Insert(key, endpoint)),
        Ok(Change::Insert(_, None)) => None,
        Ok(Change::Remove(key)) => Some(TonicChange::Remove(key)),
        Err(never) => match never {},
    })
}

/// A tonic `Channel` balanced over `subscription`'s pickable instances:
/// `Channel::balance_channel(capacity)` fed by [`tonic_endpoints`] from a spawned task.
///
/// `capacity` is the size of the channel of endpoint changes between that task and the
/// balancer (a few dozen is plenty). The task ends when the subscription ends or when every
/// clone of the returned `Channel` is dropped. Must be called inside a tokio runtime (it
/// spawns).
pub fn balance_channel(
    subscription: &Subscription,
    capacity: usize,
    configure: impl Fn(&Instance, tonic::transport::Endpoint) -> tonic::transport::Endpoint
    + Send
    + 'static,
) -> tonic::transport::Channel {
    let (channel, sender) = tonic::transport::Channel::balance_channel::<InstanceKey>(capacity);
    let mut changes = tonic_endpoints(subscription, configure);
    tokio::spawn(async move {
        loop {
            let change = tokio::select! {
                change = tokio_stream::StreamExt::next(&mut changes) => change,
                () = sender.closed() => None,
            };
            let Some(change) = change else { break };
            if sender.send(change).await.is_err() {
                break;
            }
        }
    });
    channel
}

#[cfg(test)]
mod tests;
