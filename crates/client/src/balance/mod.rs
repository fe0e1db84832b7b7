//! Load balancers: pick one instance of a [`View`] per request (DESIGN §5).
//!
//! - [`RoundRobin`]: every pickable instance in turn, ignoring weights beyond 0;
//! - [`SmoothWeighted`]: nginx's smooth weighted round robin, spreading heavy instances out
//!   (weights 5, 1, 1 give `a a b a c a a`);
//! - [`Random`]: uniformly at random (weights only matter as 0 = never);
//! - [`PowerOfTwoChoices`]: two distinct instances at random, the one with fewer requests in
//!   flight wins (Mitzenmacher; what Envoy and Linkerd call P2C / least request).
//!
//! Each can be wrapped in [`WarmUp`], which holds instances in their warm-up window back
//! (Envoy slow start; the window and registration time come from the instance's metadata, see
//! [`warm_up`](self::warm_up)). The HTTP client and [`Subscription`](crate::Subscription) wrap
//! their balancer in it by default.
//!
//! All share the pickable set: instances that are enabled with a weight > 0 (finite); of
//! those the healthy ones, or all of them when none is healthy. A view only holds unhealthy
//! instances when the registry's protect threshold fired (`protection_triggered`): the
//! balancers then prefer the healthy ones and fall back to any.

use gangway_core::model::{Instance, InstanceKey};
use gangway_core::view::View;

mod p2c;
mod random;
mod round_robin;
mod smooth_weighted;
pub mod warm_up;

pub use p2c::PowerOfTwoChoices;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use smooth_weighted::SmoothWeighted;
pub use warm_up::{WarmUp, WarmUpConfig};

/// Picks an instance for one request.
///
/// Implementations keep their rotation state behind interior mutability and are shared
/// between threads, so `pick` takes `&self`. A view change between calls is fine: state for
/// instances that left is dropped.
pub trait Balancer: Send + Sync {
    /// One of `candidates` (already filtered: pickable, not yet tried, not ejected), or `None`
    /// when there is none.
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance>;

    /// One instance of `view`, or `None` when it holds no pickable instance.
    fn pick(&self, view: &View) -> Option<Instance> {
        self.pick_from(&pickable(view))
    }

    /// A request to `instance` starts (load-aware balancers count it). Default: nothing.
    fn started(&self, _instance: &InstanceKey) {}

    /// A request to `instance` ended, whatever its outcome. Default: nothing.
    fn finished(&self, _instance: &InstanceKey) {}
}

/// The pickable instances of a view, in view order (see the module docs).
pub fn pickable(view: &View) -> Vec<&Instance> {
    let eligible: Vec<&Instance> = view
        .instances
        .iter()
        .filter(|i| i.enabled && i.weight > 0.0 && i.weight.is_finite())
        .collect();
    if eligible.iter().any(|i| i.healthy) {
        eligible.into_iter().filter(|i| i.healthy).collect()
    } else {
        eligible
    }
}

#[cfg(test)]
mod tests;
