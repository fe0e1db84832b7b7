//! The ejection layer: configuration only.

use std::sync::Arc;

use gangway_core::model::Instance;
use gangway_core::view::View;
use tokio::sync::watch;
use tower::Layer;

use super::Ejection;
use crate::outlier::OutlierDetector;
use crate::tower::DefaultClassify;

/// Wraps the service of one instance in an [`Ejection`] (see the [module docs](super)).
///
/// One layer per instance (it names the instance), cheap to build inside
/// [`ViewDiscover`](crate::tower::ViewDiscover)'s `make`:
///
/// ```
/// use std::sync::Arc;
///
/// use gangway_client::Subscription;
/// use gangway_client::outlier::OutlierDetector;
/// use gangway_client::tower::{EjectionLayer, ViewDiscover};
/// use tower::{Layer, ServiceExt};
///
/// fn discover(orders: &Subscription, detector: Arc<OutlierDetector>) {
///     let views = orders.receiver();
///     let discover = ViewDiscover::new(orders, move |instance| {
///         let addr = instance.key.addr();
///         let service = tower::service_fn(move |_: http::Request<String>| {
///             let addr = addr.clone();
///             async move { Ok::<_, std::io::Error>(http::Response::new(addr)) }
///         });
///         EjectionLayer::new(detector.clone(), views.clone(), instance).layer(service)
///     });
///     # let _ = discover;
/// }
/// ```
#[derive(Debug, Clone)]
pub struct EjectionLayer<C = DefaultClassify> {
    pub(super) detector: Arc<OutlierDetector>,
    pub(super) views: watch::Receiver<Arc<View>>,
    pub(super) instance: Instance,
    pub(super) classify: C,
}

impl EjectionLayer {
    /// A layer for `instance`, recording into `detector` (the service's, shared by every
    /// instance) with the [`DefaultClassify`] classifier. `views` (usually
    /// [`Subscription::receiver`](crate::Subscription::receiver)) gives the number of
    /// pickable instances, which bounds ejection, and tells when all are ejected.
    pub fn new(
        detector: Arc<OutlierDetector>,
        views: watch::Receiver<Arc<View>>,
        instance: &Instance,
    ) -> Self {
        Self {
            detector,
            views,
            instance: instance.clone(),
            classify: DefaultClassify,
        }
    }
}

impl<C> EjectionLayer<C> {
    /// With another classifier (a [`Classify`](crate::tower::Classify) implementation or a
    /// closure `Fn(Result<&Res, &E>) -> Option<Failure> + Clone`).
    pub fn with_classify<C2>(self, classify: C2) -> EjectionLayer<C2> {
        EjectionLayer {
            detector: self.detector,
            views: self.views,
            instance: self.instance,
            classify,
        }
    }
}

impl<S, C: Clone> Layer<S> for EjectionLayer<C> {
    type Service = Ejection<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Ejection::new(inner, self.clone())
    }
}
