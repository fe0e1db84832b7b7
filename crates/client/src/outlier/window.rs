//! The per-instance sliding window of the error-rate trigger: a ring of time buckets.

use super::config::WINDOW_BUCKETS;

const BUCKETS: usize = WINDOW_BUCKETS as usize;

/// Request and error counts of one instance over the last [`WINDOW_BUCKETS`] buckets.
///
/// Buckets are numbered from the detector's epoch (`index = elapsed / bucket width`); the
/// window at bucket `i` is buckets `i - 9 ..= i`. Memory is constant whatever the rate.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestWindow {
    buckets: [Bucket; BUCKETS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    requests: u64,
    errors: u64,
}

/// Totals of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct WindowCounts {
    pub(crate) requests: u64,
    pub(crate) errors: u64,
}

impl RequestWindow {
    /// Counts one outcome in bucket `index`.
    pub(crate) fn record(&mut self, index: u64, error: bool) {
        let bucket = &mut self.buckets[(index % BUCKETS as u64) as usize];
        if bucket.index != index {
            *bucket = Bucket {
                index,
                requests: 0,
                errors: 0,
            };
        }
        bucket.requests += 1;
        bucket.errors += u64::from(error);
    }

    /// Totals of the window ending with bucket `index` (that bucket and the 9 before it).
    pub(crate) fn counts(&self, index: u64) -> WindowCounts {
        self.buckets
            .iter()
            .filter(|b| b.index <= index && index - b.index < BUCKETS as u64)
            .fold(WindowCounts::default(), |acc, b| WindowCounts {
                requests: acc.requests + b.requests,
                errors: acc.errors + b.errors,
            })
    }
}
