//! The retry budget, on top of tower's `TpsBudget`.

use std::sync::Arc;

use tower::retry::budget::{Budget, TpsBudget};

use super::RetryConfig;

/// Caps retries: every request deposits, every retry withdraws; a retry that finds the budget
/// empty is not made. Shared by all clones (an `Arc` inside). Time goes through
/// `tokio::time`, so it follows a paused test clock.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    inner: Arc<TpsBudget>,
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
        }
    }

    /// Records one request (call once per request, not per attempt).
    pub fn deposit(&self) {
        self.inner.deposit();
    }

    /// Takes one retry from the budget; `false` when it is empty.
    pub fn withdraw(&self) -> bool {
        self.inner.withdraw()
    }
}
