//! Power of two choices on requests in flight.

use std::collections::HashMap;
use std::sync::Mutex;

use gangway_core::model::{Instance, InstanceKey};
use rand::Rng;

use super::Balancer;

/// Picks two distinct candidates at random and takes the one with fewer requests in flight
/// (ties: the first drawn). Needs [`Balancer::started`] / [`Balancer::finished`] around each
/// request, which the HTTP client and the tower layers do; without them it is [`Random`](super::Random).
#[derive(Debug, Default)]
pub struct PowerOfTwoChoices {
    in_flight: Mutex<HashMap<InstanceKey, usize>>,
}

impl PowerOfTwoChoices {
    /// A balancer with nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests in flight to `instance`.
    pub fn in_flight(&self, instance: &InstanceKey) -> usize {
        self.lock().get(instance).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<InstanceKey, usize>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Balancer for PowerOfTwoChoices {
    fn pick_from(&self, candidates: &[&Instance]) -> Option<Instance> {
        match candidates.len() {
            0 => None,
            1 => Some(candidates[0].clone()),
            n => {
                let mut rng = rand::rng();
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let in_flight = self.lock();
                let load = |i: usize| in_flight.get(&candidates[i].key).copied().unwrap_or(0);
                let winner = if load(b) < load(a) { b } else { a };
                Some(candidates[winner].clone())
            }
        }
    }

    fn started(&self, instance: &InstanceKey) {
        *self.lock().entry(instance.clone()).or_default() += 1;
    }

    fn finished(&self, instance: &InstanceKey) {
        let mut in_flight = self.lock();
        if let Some(n) = in_flight.get_mut(instance) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                in_flight.remove(instance);
            }
        }
    }
}
