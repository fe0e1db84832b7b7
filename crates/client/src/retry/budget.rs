//! The retry budget, on top of tower's `TpsBudget`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tower::retry::budget::{Budget, TpsBudget};

use super::RetryConfig;

/// Caps retries: every request deposits, every retry withdraws; a retry that finds the budget
/// empty is not made. Shared by all clones (an `Arc` inside). Time goes through
/// `tokio::time`, so it follows a paused test clock.
///
/// It also counts what went through it since it was made ([`stats`](Self::stats)), for
/// diagnostics such as the admin endpoint of `gangway proxy`; tower's budget does not expose
/// its balance.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    inner: Arc<TpsBudget>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    deposits: AtomicU64,
    granted: AtomicU64,
    refused: AtomicU64,
}

/// What a [`RetryBudget`] saw since it was made (counters only grow; saturating at
/// `u64::MAX`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetStats {
    /// Requests recorded ([`RetryBudget::deposit`]).
    pub requests: u64,
    /// Retries the budget granted ([`RetryBudget::withdraw`] returned `true`).
    pub retries: u64,
    /// Retries refused because the budget was empty.
    pub refused: u64,
}

impl RetryBudget {
    /// A budget from `config`'s window, floor and ratio. Panics never: values are clamped to
    /// tower's accepted ranges (ratio 0-1000, window 1 s-60 s).
    pub fn new(config: &RetryConfig) -> Self {
        let window = config.budget_window.clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(60),
        );
        let ratio = config.retry_ratio.clamp(0.0, 1000.0);
        Self {
            inner: Arc::new(TpsBudget::new(window, config.min_retries_per_second, ratio)),
            counts: Arc::default(),
        }
    }

    /// Records one request (call once per request, not per attempt).
    pub fn deposit(&self) {
        self.inner.deposit();
        self.counts.deposits.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget; `false` when it is empty.
    pub fn withdraw(&self) -> bool {
        let granted = self.inner.withdraw();
        let counter = if granted {
            &self.counts.granted
        } else {
            &self.counts.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        granted
    }

    /// Requests, granted and refused retries so far (shared by every clone).
    pub fn stats(&self) -> BudgetStats {
        BudgetStats {
            requests: self.counts.deposits.load(Ordering::Relaxed),
            retries: self.counts.granted.load(Ordering::Relaxed),
            refused: self.counts.refused.load(Ordering::Relaxed),
        }
    }
}
