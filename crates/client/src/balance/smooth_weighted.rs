//! nginx smooth weighted round robin.

use std::collections::HashMap;
use std::sync::Mutex;

use gangway_core::model::{Instance, InstanceKey};

use super::Balancer;

/// nginx's smooth weighted round robin (`ngx_http_upstream_get_peer`).
///
/// Each pick adds every candidate's weight to its current weight, picks the highest (the
/// first in view order on a tie) and subtracts the total weight from the winner. Over a cycle
/// each instance gets its weight's share, interleaved: weights 5, 1, 1 give `a a b a c a a`.
/// Current weights survive view changes for instances that stay; new ones start at 0.
#[derive(Debug, Default)]
pub struct SmoothWeighted {
    current: Mutex<HashMap<InstanceKey, f64>>,
}

impl SmoothWeighted {
    /// A balancer with every current weight at 0.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Balancer for SmoothWeighted {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        if candidates.is_empty() {
            return None;
        }
        // A panic elsewhere cannot leave the weights inconsistent in a harmful way.
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::with_capacity(candidates.len());
        let mut total = 0.0;
        let mut best: Option<(usize, f64)> = None;
        for (idx, c) in candidates.iter().enumerate() {
            let w = current.remove(&c.key).unwrap_or(0.0) + c.weight;
            total += c.weight;
            if best.is_none_or(|(_, bw)| w > bw) {
                best = Some((idx, w));
            }
            next.insert(c.key.clone(), w);
        }
        let (idx, _) = best?;
        let winner = candidates[idx];
        if let Some(w) = next.get_mut(&winner.key) {
            *w -= total;
        }
        *current = next;
        Some(winner.clone())
    }
}
