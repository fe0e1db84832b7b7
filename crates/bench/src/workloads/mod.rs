//! The workloads of issues 6, 10, 11 and 14, one module each. Each workload but `proxy` is a
//! [`Plan`]: its empty table and its lineup of (system, driver) pairs, which [`lineup`] runs
//! against a fresh server each; the closed- and open-loop phases and the rows they make are in
//! [`measure`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::PossibleValue;

use crate::report::Table;
use crate::system::{Binaries, System};

mod big_service;
mod churn;
mod drain;
mod durable;
mod fanout;
mod lineup;
mod measure;
mod proxy;
mod query;
mod register;
mod restart;
mod scale;

/// Sizes and durations of one run.
#[derive(Debug, Clone)]
pub struct Params {
    /// Closed-loop phase length.
    pub duration: Duration,
    /// Closed-loop workers (each its own connection or session).
    pub concurrency: usize,
    /// Open-loop rate for latency (requests/s), the same for every system.
    pub open_rate: f64,
    /// Open-loop phase length.
    pub open_duration: Duration,
    /// Subscriber counts of the fan-out workload.
    pub fanout_sizes: Vec<usize>,
    /// Changes per fan-out size.
    pub fanout_changes: usize,
    /// Instances (and subscribers) of the churn workload.
    pub churn: usize,
    /// Sessions of the scale workload (each holds 10 instances).
    pub sessions: usize,
    /// Target of the largest-session-count probe (gangway only).
    pub max_sessions: usize,
    /// Pause before each RSS reading, so the server's allocator settles.
    pub settle: Duration,
    /// Service sizes at which the big-service workload measures.
    pub big_service_sizes: Vec<usize>,
    /// The persistent services the restart workload stores before it kills the server.
    pub restart_services: Vec<ServiceBatch>,
    /// How long the restarted server may take to list every instance.
    pub restart_deadline: Duration,
    /// Subscribers of the drain workload (spread over a cluster's nodes).
    pub drain_subscribers: usize,
    /// Drains of the drain workload, one after another.
    pub drains: usize,
}

/// `services` services of `instances` instances each (written `5x20000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceBatch {
    /// How many services.
    pub services: usize,
    /// Instances in each.
    pub instances: usize,
}

impl Params {
    /// The `--quick` sizes: `gangway bench all --quick` stays around a minute.
    pub fn quick() -> Self {
        Params {
            duration: Duration::from_secs(1),
            concurrency: 32,
            open_rate: 1000.0,
            open_duration: Duration::from_millis(500),
            fanout_sizes: vec![100],
            fanout_changes: 10,
            churn: 50,
            sessions: 200,
            max_sessions: 1000,
            settle: Duration::from_millis(300),
            big_service_sizes: vec![500, 2000],
            restart_services: vec![
                ServiceBatch {
                    services: 2,
                    instances: 1000,
                },
                ServiceBatch {
                    services: 20,
                    instances: 50,
                },
            ],
            restart_deadline: Duration::from_secs(60),
            drain_subscribers: 30,
            drains: 5,
        }
    }

    /// The full run's sizes (issues 6 and 10).
    pub fn full() -> Self {
        Params {
            duration: Duration::from_secs(10),
            concurrency: 64,
            open_rate: 5000.0,
            open_duration: Duration::from_secs(5),
            fanout_sizes: vec![100, 1000, 10_000],
            fanout_changes: 50,
            churn: 1000,
            sessions: 10_000,
            max_sessions: 100_000,
            settle: Duration::from_millis(1500),
            big_service_sizes: vec![1000, 2000, 5000, 10_000, 20_000],
            restart_services: vec![
                ServiceBatch {
                    services: 5,
                    instances: 20_000,
                },
                ServiceBatch {
                    services: 1000,
                    instances: 100,
                },
            ],
            restart_deadline: Duration::from_secs(300),
            drain_subscribers: 100,
            drains: 20,
        }
    }
}

impl fmt::Display for ServiceBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.services, self.instances)
    }
}

impl FromStr for ServiceBatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?}: expected SERVICESxINSTANCES, e.g. 5x20000");
        let (a, b) = s.trim().split_once('x').ok_or_else(bad)?;
        let services: usize = a.parse().map_err(|_| bad())?;
        let instances: usize = b.parse().map_err(|_| bad())?;
        if services == 0 || instances == 0 {
            return Err(bad());
        }
        Ok(ServiceBatch {
            services,
            instances,
        })
    }
}

/// What every workload needs.
pub struct Ctx {
    /// Sizes.
    pub params: Params,
    /// Server binaries.
    pub bins: Binaries,
    /// Systems to run, in order.
    pub systems: Vec<System>,
}

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// C clients register distinct ephemeral instances as fast as they can.
    Register,
    /// List a 10-instance service.
    Query,
    /// S subscribers of one service; one instance changes; time to the last subscriber.
    Fanout,
    /// 1,000 instances deregister at once with 1,000 subscribers.
    Churn,
    /// 100,000 instances held by 10,000 sessions: RSS per instance and per session.
    Scale,
    /// Persistent registrations with sync to disk before the acknowledgement.
    Durable,
    /// One service growing to 20,000 instances over one connection: cost per registration by
    /// size.
    BigService,
    /// 100,000 persistent instances stored, the server killed and started again: time until
    /// it answers health and until it lists them all.
    Restart,
    /// S subscribers over the nodes; instances drained through the last node: the drain's
    /// time.
    Drain,
    /// `gangway proxy` beside HAProxy on 3 instances: added latency, throughput (not in `all`).
    Proxy,
}

/// What `gangway bench` runs: one workload, or every workload of `all` in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// One workload.
    One(Workload),
    /// Every workload [`Workload::in_all`], in the order of [`Workload::EVERY`].
    All,
    /// The workloads with `gangway-cluster` rows ([`Workload::has_cluster_rows`]): register,
    /// fanout and drain (issue 11).
    Cluster,
}

impl Workload {
    /// Every workload, in the order of `gangway bench --help`.
    pub const EVERY: [Workload; 10] = [
        Workload::Register,
        Workload::Query,
        Workload::Fanout,
        Workload::Churn,
        Workload::Scale,
        Workload::Durable,
        Workload::BigService,
        Workload::Restart,
        Workload::Drain,
        Workload::Proxy,
    ];

    /// Whether `all` runs it: every workload but `proxy`, which needs HAProxy and wrk to say
    /// much.
    pub fn in_all(self) -> bool {
        self != Workload::Proxy
    }

    /// Whether its lineup has `gangway-cluster` rows (the `cluster` selection runs these).
    pub fn has_cluster_rows(self) -> bool {
        matches!(
            self,
            Workload::Register | Workload::Fanout | Workload::Drain
        )
    }

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Register => "register",
            Workload::Query => "query",
            Workload::Fanout => "fanout",
            Workload::Churn => "churn",
            Workload::Scale => "scale",
            Workload::Durable => "durable",
            Workload::BigService => "big-service",
            Workload::Restart => "restart",
            Workload::Drain => "drain",
            Workload::Proxy => "proxy",
        }
    }

    /// One line on what it measures (`gangway bench --help`).
    pub fn about(self) -> &'static str {
        match self {
            Workload::Register => {
                "C clients register distinct ephemeral instances as fast as they can"
            }
            Workload::Query => "List a 10-instance service",
            Workload::Fanout => {
                "S subscribers of one service; one instance changes; time to the last subscriber"
            }
            Workload::Churn => "1,000 instances deregister at once with 1,000 subscribers",
            Workload::Scale => {
                "100,000 instances held by 10,000 sessions: RSS per instance and per session"
            }
            Workload::Durable => {
                "Persistent registrations with sync to disk before the acknowledgement"
            }
            Workload::BigService => {
                "One service growing to 20,000 instances over one connection: cost per \
                 registration by size"
            }
            Workload::Restart => {
                "100,000 persistent instances, kill -9, start again: time to health and to \
                 listing them all"
            }
            Workload::Drain => {
                "S subscribers over the nodes; instances drained through the last node: the \
                 drain's call and wait"
            }
            Workload::Proxy => {
                "`gangway proxy` beside HAProxy on 3 instances: added latency, throughput (not \
                 in `all`)"
            }
        }
    }

    /// Runs this workload against every system of `ctx` and returns its table.
    pub async fn run(self, ctx: &Ctx) -> Table {
        let p = &ctx.params;
        match self {
            Workload::Register => register::plan(p).run(ctx).await,
            Workload::Query => query::plan(p).run(ctx).await,
            Workload::Fanout => fanout::plan(p).run(ctx).await,
            Workload::Churn => churn::plan(p).run(ctx).await,
            Workload::Scale => scale::plan(p).run(ctx).await,
            Workload::Durable => durable::plan(p).run(ctx).await,
            Workload::BigService => big_service::plan(p).run(ctx).await,
            Workload::Restart => restart::plan(p).run(ctx).await,
            Workload::Drain => drain::plan(p).run(ctx).await,
            Workload::Proxy => proxy::run(ctx).await,
        }
    }
}

impl Selection {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Selection::One(w) => w.name(),
            Selection::All => "all",
            Selection::Cluster => "cluster",
        }
    }

    /// The workloads it runs, in order.
    pub fn workloads(self) -> Vec<Workload> {
        match self {
            Selection::One(w) => vec![w],
            Selection::All => Workload::EVERY.into_iter().filter(|w| w.in_all()).collect(),
            Selection::Cluster => Workload::EVERY
                .into_iter()
                .filter(|w| w.has_cluster_rows())
                .collect(),
        }
    }
}

/// Every selection, in the order of `gangway bench --help`.
const SELECTIONS: [Selection; 12] = [
    Selection::One(Workload::Register),
    Selection::One(Workload::Query),
    Selection::One(Workload::Fanout),
    Selection::One(Workload::Churn),
    Selection::One(Workload::Scale),
    Selection::One(Workload::Durable),
    Selection::One(Workload::BigService),
    Selection::One(Workload::Restart),
    Selection::One(Workload::Drain),
    Selection::One(Workload::Proxy),
    Selection::All,
    Selection::Cluster,
];

impl clap::ValueEnum for Selection {
    fn value_variants<'a>() -> &'a [Self] {
        &SELECTIONS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            Selection::One(w) => PossibleValue::new(w.name()).help(w.about()),
            Selection::All => PossibleValue::new("all").help("Every workload but proxy, in turn"),
            Selection::Cluster => PossibleValue::new("cluster").help(
                "register, fanout and drain: the workloads with gangway-cluster rows (--peers \
                 gangway,gangway-cluster)",
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    #[test]
    fn every_workload_is_selectable_by_its_name() {
        for w in Workload::EVERY {
            assert_eq!(
                Selection::from_str(w.name(), false),
                Ok(Selection::One(w)),
                "{w:?}"
            );
        }
        assert_eq!(Selection::from_str("all", false), Ok(Selection::All));
        assert_eq!(
            Selection::from_str("cluster", false),
            Ok(Selection::Cluster)
        );
        assert_eq!(
            Selection::Cluster.workloads(),
            vec![Workload::Register, Workload::Fanout, Workload::Drain]
        );
        let all = Selection::All.workloads();
        assert!(!all.contains(&Workload::Proxy));
        assert!(all.contains(&Workload::Restart));
        assert!(all.contains(&Workload::Drain));
        assert_eq!(all.len(), Workload::EVERY.len() - 1);
        assert!(Selection::from_str("every", false).is_err());
    }

    #[test]
    fn service_batches_parse_and_refuse() {
        let b: ServiceBatch = "5x20000".parse().unwrap();
        assert_eq!(
            b,
            ServiceBatch {
                services: 5,
                instances: 20_000
            }
        );
        assert_eq!(b.to_string(), "5x20000");
        for bad in ["", "5", "x3", "0x10", "5x0", "ax1"] {
            assert!(bad.parse::<ServiceBatch>().is_err(), "{bad}");
        }
    }
}
