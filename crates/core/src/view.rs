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

#[cfg(test)]
mod tests;
