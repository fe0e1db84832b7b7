//! Warm-up (slow start) of instances that just registered (DESIGN §4, issue 12).
//!
//! Envoy slow start (`slow_start_config`, arch overview "Slow start mode"): during a window after
//! an endpoint joined, its weight is scaled by `max(min_weight, (elapsed / window) ^ (1 /
//! aggression))`. gangway uses the same curve, written with `curvature` = Envoy's `1 /
//! aggression` (1.0 = linear, 2.0 = slow then fast, 0.5 = fast then slow), and Envoy's defaults
//! (curvature 1, floor 10 %). Like Envoy, when every candidate is warming none is held back:
//! they all start together, so none gets less than its share.
//!
//! # Where the registration time comes from
//!
//! The **registering side** writes it into the instance's metadata, together with the window:
//! [`REGISTERED_AT_KEY`] (Unix time in ms, from its own clock) and [`WARM_UP_KEY`] (the window in
//! ms); [`warm_up_metadata`] builds both. `gangway run --warmup 30s` does it for any program.
//! Consumers read both from the view, so:
//! - every consumer ramps the instance up on the same schedule, whenever it subscribed (a
//!   consumer's own "first seen" time would make a consumer that restarts treat every instance
//!   as new, and the instance would get a different ramp from each consumer);
//! - a registry restart does not restart the ramp: the client re-registers with the same
//!   metadata, so the stamp survives;
//! - the window is the provider's choice (it knows how long it needs), the curve's shape the
//!   consumer's ([`WarmUpConfig`]).
//!
//! The cost is clock skew between the two hosts: an instance stamped in the consumer's future
//! counts as just registered (floor weight) until the consumer's clock passes the stamp, one
//! stamped in its past is ramped as if it were older. With NTP the skew is milliseconds against
//! a window of seconds. Instances without both keys (or with values that are not whole
//! numbers) are not warming.
//!
//! # How the balancers apply it
//!
//! [`WarmUp`] wraps any [`Balancer`]: the inner balancer proposes an instance; a warming one
//! with factor `f` is taken on every `1/f`-th proposal (a deterministic credit per instance,
//! not a coin), otherwise the inner balancer is asked again. For the deterministic balancers
//! (round robin, smooth weighted) that gives the warming instance exactly the share
//! `f x w / (f x w + sum of the other weights)`, the share Envoy's weight scaling gives; for
//! random and P2C the same in expectation.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gangway_core::model::{Instance, InstanceKey};

use super::Balancer;
use crate::Error;

/// Metadata key of the instance's registration time: Unix time in milliseconds, written by the
/// registering side (see the [module docs](self)).
pub const REGISTERED_AT_KEY: &str = "gangway.registered_at_ms";
/// Metadata key of the instance's warm-up window in milliseconds (0: no warm-up).
pub const WARM_UP_KEY: &str = "gangway.warmup_ms";
/// Default curvature: 1.0, a linear ramp (Envoy's default aggression 1.0).
pub const DEFAULT_CURVATURE: f64 = 1.0;
/// Default floor of the warm-up factor: 0.1 (Envoy's default `min_weight_percent`, 10 %).
pub const DEFAULT_MIN_WEIGHT: f64 = 0.1;

/// The consumer's side of warm-up: the curve's shape and floor. The window comes from each
/// instance's metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct WarmUpConfig {
    /// Exponent of the ramp, finite and above 0 (Envoy's `1 / aggression`). Default 1.0.
    pub curvature: f64,
    /// Lowest factor a warming instance gets, in (0, 1] (Envoy's `min_weight_percent` / 100).
    /// Default 0.1. 1.0 turns warm-up off.
    pub min_weight: f64,
}

/// Wraps a [`Balancer`] and holds instances in their warm-up window back (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct WarmUp<B> {
    inner: B,
    config: WarmUpConfig,
    /// Credit of each warming instance: it is taken when its credit reaches 1.
    credit: Mutex<HashMap<InstanceKey, f64>>,
}

impl Default for WarmUpConfig {
    fn default() -> Self {
        Self {
            curvature: DEFAULT_CURVATURE,
            min_weight: DEFAULT_MIN_WEIGHT,
        }
    }
}

impl WarmUpConfig {
    /// With this curvature.
    pub fn with_curvature(mut self, curvature: f64) -> Self {
        self.curvature = curvature;
        self
    }

    /// With this floor.
    pub fn with_min_weight(mut self, min_weight: f64) -> Self {
        self.min_weight = min_weight;
        self
    }

    /// Every problem of this config, each naming its field; empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(self.curvature.is_finite() && self.curvature > 0.0) {
            problems.push(format!(
                "warm_up.curvature: must be a finite number above 0, got {}",
                self.curvature
            ));
        }
        if !(self.min_weight > 0.0 && self.min_weight <= 1.0) {
            problems.push(format!(
                "warm_up.min_weight: must be above 0 and at most 1, got {}",
                self.min_weight
            ));
        }
        problems
    }

    /// Checks the config.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] listing every problem.
    pub fn validate(&self) -> Result<(), Error> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidConfig { problems })
        }
    }

    /// The factor (floor..=1) by which `instance`'s weight is scaled at `now`: 1 when it carries
    /// no warm-up metadata or its window has passed, else `max(min_weight, (elapsed /
    /// window) ^ curvature)`. An instance stamped after `now` (clock skew) gets the floor.
    pub fn factor(&self, instance: &Instance, now: SystemTime) -> f64 {
        let Some((registered_at, window)) = warm_up_of(instance) else {
            return 1.0;
        };
        let elapsed = now.duration_since(registered_at).unwrap_or(Duration::ZERO);
        if window.is_zero() || elapsed >= window {
            return 1.0;
        }
        let ratio = elapsed.as_secs_f64() / window.as_secs_f64();
        ratio.powf(self.curvature).max(self.min_weight).min(1.0)
    }
}

/// The registration time and window an instance's metadata carries, if both are there and
/// are whole numbers.
pub fn warm_up_of(instance: &Instance) -> Option<(SystemTime, Duration)> {
    let number = |key: &str| instance.metadata.get(key)?.trim().parse::<u64>().ok();
    let registered_at =
        UNIX_EPOCH.checked_add(Duration::from_millis(number(REGISTERED_AT_KEY)?))?;
    Some((registered_at, Duration::from_millis(number(WARM_UP_KEY)?)))
}

/// The metadata a provider registers with to be warmed up over `window` from `registered_at`
/// (usually `SystemTime::now()` right before registering): [`REGISTERED_AT_KEY`] and
/// [`WARM_UP_KEY`], in milliseconds. Merge it into the registration's metadata.
pub fn warm_up_metadata(window: Duration, registered_at: SystemTime) -> BTreeMap<String, String> {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let since_epoch = registered_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    BTreeMap::from([
        (
            REGISTERED_AT_KEY.to_owned(),
            millis(since_epoch).to_string(),
        ),
        (WARM_UP_KEY.to_owned(), millis(window).to_string()),
    ])
}

impl<B: Balancer> WarmUp<B> {
    /// `inner` with warm-up as `config` says.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a bad `config` (see [`WarmUpConfig::problems`]).
    pub fn new(inner: B, config: WarmUpConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            inner,
            config,
            credit: Mutex::new(HashMap::new()),
        })
    }

    /// `inner` with the default curve ([`WarmUpConfig::default`]); infallible.
    pub fn with_default_curve(inner: B) -> Self {
        Self {
            inner,
            config: WarmUpConfig::default(),
            credit: Mutex::new(HashMap::new()),
        }
    }

    /// The wrapped balancer.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// [`Balancer::pick_from`] at the time `now` (tests, simulations).
    pub fn pick_from_at(&self, candidates: &[&Instance], now: SystemTime) -> Option<Instance> {
        let factors: Vec<f64> = candidates
            .iter()
            .map(|c| self.config.factor(c, now))
            .collect();
        let warming = factors.iter().filter(|f| **f < 1.0).count();
        let mut credit = self.credit.lock().unwrap_or_else(|p| p.into_inner());
        credit.retain(|key, _| {
            candidates
                .iter()
                .zip(&factors)
                .any(|(c, f)| c.key == *key && *f < 1.0)
        });
        // Nothing warming, or everything: no one is held back.
        if warming == 0 || warming == candidates.len() {
            return self.inner.pick_from(candidates);
        }
        // Each refusal adds at least `min_weight` to a warming instance's credit, so within
        // ceil(1 / min_weight) proposals of it, it is taken: the loop always ends by itself,
        // the bound only makes that visible.
        let per_instance = (1.0 / self.config.min_weight).ceil() as usize;
        let bound = warming.saturating_mul(per_instance).saturating_add(1);
        let mut last = None;
        for _ in 0..bound {
            let pick = self.inner.pick_from(candidates)?;
            let factor = candidates
                .iter()
                .zip(&factors)
                .find(|(c, _)| c.key == pick.key)
                .map_or(1.0, |(_, f)| *f);
            if factor >= 1.0 {
                return Some(pick);
            }
            let c = credit.entry(pick.key.clone()).or_insert(0.0);
            *c += factor;
            if *c >= 1.0 {
                *c -= 1.0;
                return Some(pick);
            }
            last = Some(pick);
        }
        last
    }
}

impl<B: Balancer> Balancer for WarmUp<B> {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        self.pick_from_at(candidates, SystemTime::now())
    }

    fn started(&self, instance: &InstanceKey) {
        self.inner.started(instance);
    }

    fn finished(&self, instance: &InstanceKey) {
        self.inner.finished(instance);
    }
}

impl Balancer for Box<dyn Balancer> {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        (**self).pick_from(candidates)
    }

    fn started(&self, instance: &InstanceKey) {
        (**self).started(instance);
    }

    fn finished(&self, instance: &InstanceKey) {
        (**self).finished(instance);
    }
}

#[cfg(test)]
mod tests;
