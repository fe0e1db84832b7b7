//! The consumer view of a service and the protect threshold (DESIGN §2).

use serde::{Deserialize, Serialize};

use crate::model::Instance;

/// What consumers of a service see at one revision.
///
/// Normally: the enabled, healthy instances with weight > 0. When healthy ÷ enabled <= the
/// service's protect threshold (Nacos rule, `ServiceUtil.selectInstancesWithHealthyProtection`),
/// the view holds **all** enabled instances, each with its *real* health flag (unlike Nacos,
/// which rewrites them to healthy), and `protection_triggered` is true; consumers then spread
/// load over all of them but can prefer the healthy ones. With no enabled instance nothing fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct View {
    /// Service revision this view was built at.
    pub revision: u64,
    /// Instances, sorted by key.
    pub instances: Vec<Instance>,
    /// The protect threshold fired.
    pub protection_triggered: bool,
}

impl View {
    /// Builds the view from every instance of a service (any order, any state).
    /// `protect_threshold` is a ratio 0..=1.
    pub fn build<'a>(
        revision: u64,
        instances: impl IntoIterator<Item = &'a Instance>,
        protect_threshold: f64,
    ) -> View {
        let enabled: Vec<&Instance> = instances.into_iter().filter(|i| i.enabled).collect();
        let healthy = enabled.iter().filter(|i| i.healthy).count();
        let protection_triggered =
            !enabled.is_empty() && (healthy as f64 / enabled.len() as f64) <= protect_threshold;
        let mut picked: Vec<Instance> = enabled
            .into_iter()
            .filter(|i| protection_triggered || i.is_serving())
            .cloned()
            .collect();
        picked.sort_by(|a, b| a.key.cmp(&b.key));
        View {
            revision,
            instances: picked,
            protection_triggered,
        }
    }

    /// Whether an instance with this key is in the view.
    pub fn contains(&self, key: &crate::model::InstanceKey) -> bool {
        self.instances.iter().any(|i| &i.key == key)
    }
}

/// The counts a service's consumer view is derived from, kept up to date as instances change so
/// that no change has to look at the whole service: whether the protect threshold fires, how
/// many instances the view holds and whether one instance is in it, each in O(1).
///
/// Agrees with [`View::build`] on every set of instances (a property test checks it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Enabled instances.
    pub enabled: usize,
    /// Enabled and healthy instances.
    pub healthy: usize,
    /// Serving instances: enabled, healthy, weight > 0 ([`Instance::is_serving`]).
    pub serving: usize,
}

impl Tally {
    /// Counts `instance` in.
    pub fn add(&mut self, instance: &Instance) {
        let (e, h, s) = Self::parts(instance);
        self.enabled += e;
        self.healthy += h;
        self.serving += s;
    }

    /// Counts `instance` out (it must have been counted in with the same fields).
    pub fn remove(&mut self, instance: &Instance) {
        let (e, h, s) = Self::parts(instance);
        self.enabled -= e;
        self.healthy -= h;
        self.serving -= s;
    }

    fn parts(i: &Instance) -> (usize, usize, usize) {
        (
            usize::from(i.enabled),
            usize::from(i.enabled && i.healthy),
            usize::from(i.is_serving()),
        )
    }

    /// The protect threshold fires: healthy ÷ enabled <= `threshold` (ratio 0..=1), with at
    /// least one enabled instance (the rule of [`View`]).
    pub fn protection_triggered(&self, threshold: f64) -> bool {
        self.enabled > 0 && (self.healthy as f64 / self.enabled as f64) <= threshold
    }

    /// Whether `instance` (counted in this tally) is in the view.
    pub fn in_view(&self, instance: &Instance, threshold: f64) -> bool {
        instance.enabled && (instance.is_serving() || self.protection_triggered(threshold))
    }

    /// How many instances the view holds.
    pub fn view_len(&self, threshold: f64) -> usize {
        if self.protection_triggered(threshold) {
            self.enabled
        } else {
            self.serving
        }
    }
}

#[cfg(test)]
mod tests;
