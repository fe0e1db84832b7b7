//! Uniform random choice.

use gangway_core::model::Instance;
use rand::Rng;

use super::Balancer;

/// Each pickable instance with equal probability (weights only matter as 0 = never). Stateless.
#[derive(Debug, Default, Clone, Copy)]
pub struct Random;

impl Random {
    /// A random balancer.
    pub fn new() -> Self {
        Self
    }
}

impl Balancer for Random {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        if candidates.is_empty() {
            return None;
        }
        let i = rand::rng().random_range(0..candidates.len());
        Some(candidates[i].clone())
    }
}
