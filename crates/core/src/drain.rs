//! Drain bookkeeping (DESIGN §4): which subscribers have acked a revision, which lag, and the
//! report a drain or readiness wait ends with.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One subscriber of a service and the newest revision it acked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriberAck {
    /// Subscriber id, e.g. `s-3` (session), `w-7` (watch stream), `p-orders-1` (poller).
    pub id: String,
    /// Remote address as `ip:port`.
    pub address: String,
    /// Newest revision acked (0 = nothing yet).
    pub acked_revision: u64,
    /// The gangway node holding it, in cluster mode (docs/cluster.md); empty for a single
    /// node, and then left out of the JSON.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
}

/// The outcome of a drain (every live subscriber acked a revision *without* the instance) or
/// of a readiness wait (every live subscriber acked a revision *with* it): what the engine
/// returns and what REST (`waited_ms` as in the JSON), the native protocol's `DrainResult` and
/// the SDK carry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Revision waited for: subscribers had to ack this or later. For a drain the first
    /// revision that excludes the instance, for a readiness wait one that contains it.
    pub revision: u64,
    /// Time waited for acks, ms (see [`DrainReport::waited`]).
    pub waited_ms: u64,
    /// Every live subscriber acked in time (false: the timeout ended the wait).
    pub complete: bool,
    /// Subscribers that acked `revision` or later.
    #[serde(default)]
    pub acked: Vec<SubscriberAck>,
    /// Subscribers that had not when the wait ended.
    #[serde(default)]
    pub laggards: Vec<SubscriberAck>,
    /// Readable remarks (for example: no subscriber at all, the timeout).
    #[serde(default)]
    pub notes: Vec<String>,
}

impl DrainReport {
    /// [`waited_ms`](Self::waited_ms) as a `Duration` (millisecond resolution).
    pub fn waited(&self) -> Duration {
        Duration::from_millis(self.waited_ms)
    }
}

/// Where a drain stands: subscribers that acked >= the target revision, and the laggards.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckProgress {
    /// Subscribers whose acked revision is >= the target.
    pub acked: Vec<SubscriberAck>,
    /// Subscribers still below the target.
    pub laggards: Vec<SubscriberAck>,
}

impl AckProgress {
    /// Splits live subscribers by whether they acked `target` or later.
    pub fn of<'a>(target: u64, subscribers: impl IntoIterator<Item = &'a SubscriberAck>) -> Self {
        let (acked, laggards) = subscribers
            .into_iter()
            .cloned()
            .partition(|s| s.acked_revision >= target);
        AckProgress { acked, laggards }
    }

    /// Every live subscriber has acked.
    pub fn is_complete(&self) -> bool {
        self.laggards.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(id: &str, acked: u64) -> SubscriberAck {
        SubscriberAck {
            id: id.into(),
            address: "127.0.0.1:1".into(),
            acked_revision: acked,
            node: String::new(),
        }
    }

    #[test]
    fn splits_on_the_target_revision() {
        let subs = [sub("a", 4), sub("b", 5), sub("c", 6)];
        let p = AckProgress::of(5, &subs);
        let ids = |v: &[SubscriberAck]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&p.acked), ["b", "c"]);
        assert_eq!(ids(&p.laggards), ["a"]);
        assert!(!p.is_complete());
        assert!(AckProgress::of(4, &subs).is_complete());
    }

    #[test]
    fn no_subscriber_means_complete() {
        assert!(AckProgress::of(100, &[]).is_complete());
    }

    #[test]
    fn a_report_reads_its_wait_in_milliseconds_and_its_lists_may_be_absent() {
        let r: DrainReport =
            serde_json::from_str(r#"{"revision":3,"waited_ms":1500,"complete":true}"#).unwrap();
        assert_eq!(r.waited(), Duration::from_millis(1500));
        assert!(r.acked.is_empty() && r.laggards.is_empty() && r.notes.is_empty());
        assert!(serde_json::from_str::<DrainReport>(r#"{"revision":3}"#).is_err());
    }
}
