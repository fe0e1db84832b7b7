//! Plain round robin.

use std::sync::atomic::{AtomicUsize, Ordering};

use gangway_core::model::Instance;

use super::Balancer;

/// Every pickable instance in turn (weights only matter as 0 = never).
///
/// A single atomic counter; when the view changes the rotation continues from the counter
/// modulo the new number of instances.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// A balancer starting at the view's first pickable instance.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Balancer for RoundRobin {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        if candidates.is_empty() {
            return None;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        Some(candidates[n % candidates.len()].clone())
    }
}
