//! Server configuration: typed, built once at start-up, defaults as constants, checked as a
//! whole ([`Config::validate`]: every problem at once). Where the server listens and which store
//! it uses are not configuration here: the binary binds the listeners and opens the store, then
//! hands both to [`start`](crate::start).

use std::fmt;
use std::time::Duration;

use crate::auth::Authority;

use gangway_core::validate::{MAX_LEASE, MIN_LEASE};

/// Default REST address (Nacos's default port).
pub const DEFAULT_HTTP: &str = "127.0.0.1:8848";
/// Default gRPC address (HTTP port + 1000, as Nacos).
pub const DEFAULT_GRPC: &str = "127.0.0.1:9848";
/// Default HTTP/2 keepalive ping interval for sessions (issue #2): 1 s.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Default HTTP/2 keepalive ping timeout: a session whose peer does not answer within it ends: 3 s.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Default lease TTL: unhealthy after this long without a heartbeat (Nacos: 15 s).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
/// Default lease delete timeout: deleted after this long without a heartbeat (Nacos: 30 s).
pub const DEFAULT_LEASE_DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default warm-up after start: no snapshots are pushed while sessions re-register: 5 s.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(5);
/// Default expiry of an offline mark whose instance is gone: 10 min.
pub const DEFAULT_OFFLINE_MARK_EXPIRY: Duration = Duration::from_secs(600);
/// Default resend interval for unacked pushes: 1 s.
pub const DEFAULT_RESEND_INTERVAL: Duration = Duration::from_secs(1);
/// Default drain timeout (also of a readiness wait) when the request gives none: 30 s.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default data directory of the embedded store, relative to the working directory.
pub const DEFAULT_DATA_DIR: &str = "./gangway-data";
/// A Nacos gRPC connection silent this long is probed with a `ClientDetectionRequest` (Nacos:
/// 20 s). HTTP/2 keepalive pings remove frozen peers much sooner; this catches a client whose
/// transport still answers pings but whose application stopped talking.
pub const DEFAULT_NACOS_DETECT_AFTER: Duration = Duration::from_secs(20);
/// A probed Nacos connection that does not answer within this is closed (Nacos: 5 s).
pub const DEFAULT_NACOS_DETECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default stall threshold: the registry's clock jumping by more than this between two looks
/// (its timer ticks every 200 ms) is its own stall (SIGSTOP, VM pause): 2 s, ten ticks, so that
/// a process starved of CPU for a moment (seen: 1.1 s on a loaded 2-core machine) is not taken
/// for a stopped one.
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(2);
/// Default stall recovery: after a stall, snapshots are held back and expiry waits this long
/// while sessions reconnect and re-register (the same as the start-up warm-up): 5 s.
pub const DEFAULT_STALL_RECOVERY: Duration = Duration::from_secs(5);
/// Default stall grace: an instance whose session ended during a stall recovery stays this long
/// (from the session's end) for its client to register it again: 60 s. Nacos SDKs reconnect
/// and redo their registrations 14-28 s after the registry resumes (measured with the Python
/// SDK: its 5 s health check, reconnect, then the 3 s redo timer), well past the recovery.
pub const DEFAULT_STALL_GRACE: Duration = Duration::from_secs(60);
/// Default shortest time between two whole-view pushes to one subscriber (Nacos SDKs, SSE
/// watchers): 100 ms. The first push after a quiet spell goes at once; under churn a
/// subscriber gets the latest view at most every 100 ms instead of every revision (Nacos merges
/// pushes for 500 ms, `pushTaskDelay`).
pub const DEFAULT_FULL_PUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Default shortest time between two pushes to a subscriber that takes deltas (native
/// sessions): 10 ms, so a burst of changes goes out as a few deltas, not one per change.
pub const DEFAULT_DELTA_PUSH_INTERVAL: Duration = Duration::from_millis(10);
/// A poller (HTTP list call with `subscriber=`) is forgotten after this long without a poll.
pub const DEFAULT_POLLER_EXPIRY: Duration = Duration::from_secs(90);
/// Default bound on a stop (SIGTERM/SIGINT): sessions are told to go away, watches and Nacos
/// streams end, connections close gracefully; whatever still runs after this is dropped: 5 s.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// Default HTTP header read timeout: a request head (request line and headers) must arrive
/// within this, counted from its first byte, or from the accept for a connection's first
/// request (hyper's default header read timeout): 30 s.
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default HTTP idle keep-alive timeout: a connection with no request in flight and no byte of
/// the next one is closed after this (nginx's `keepalive_timeout`): 75 s.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default HTTP request body timeout: a request body must be complete within this of the end
/// of its head, however steadily it trickles in; otherwise the request is answered `408`
/// `request_timeout` and the connection closed: 10 s. The largest body the API accepts (2 MiB)
/// needs 200 KiB/s for it; registry bodies are a few hundred bytes.
pub const DEFAULT_HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default gRPC handshake timeout: a connection must send the HTTP/2 client preface within this
/// of its accept; afterwards HTTP/2 keepalive pings decide: 10 s.
pub const DEFAULT_GRPC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections per port when [`Connections::http_max`] or [`Connections::grpc_max`] is
/// derived from the file descriptor limit (`None`): 10,000.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Most open connections from one client IP address, per port: 4,096, well under a port's
/// [`DEFAULT_MAX_CONNECTIONS`] so one address cannot take a port, and above what gangway's own
/// loopback benchmarks open (1,000 connections for 100,000 sessions). Beyond it a connection
/// gets the port's refusal (503 `overloaded` / UNAVAILABLE) naming the limit.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 4_096;
/// Most subscriptions one session (native gRPC session, Nacos gRPC connection) holds: 10,000.
pub const DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION: usize = 10_000;
/// Most instances one session keeps alive: 100,000 (the `big-service` benchmark registers
/// 20,000 over one session).
pub const DEFAULT_MAX_INSTANCES_PER_SESSION: usize = 100_000;

/// Everything the engine and the transports need, resolved. Build it from
/// [`Config::default`] and check it with [`Config::validate`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Session and lease timing.
    pub liveness: LivenessTiming,
    /// No snapshots are pushed for this long after start (default [`DEFAULT_WARMUP`]).
    pub warmup: Duration,
    /// Offline marks of instances gone this long are dropped (default
    /// [`DEFAULT_OFFLINE_MARK_EXPIRY`]).
    pub offline_mark_expiry: Duration,
    /// Unacked pushes are re-sent after this long (default [`DEFAULT_RESEND_INTERVAL`]).
    pub resend_interval: Duration,
    /// Pollers silent this long leave the subscriber table (default
    /// [`DEFAULT_POLLER_EXPIRY`]).
    pub poller_expiry: Duration,
    /// A clock jump larger than this between two looks is the registry's own stall (default
    /// [`DEFAULT_STALL_THRESHOLD`]).
    pub stall_threshold: Duration,
    /// After a stall, snapshots are held back and expiry waits this long (default
    /// [`DEFAULT_STALL_RECOVERY`]).
    pub stall_recovery: Duration,
    /// An instance whose session ended during a stall recovery stays in grace this long for
    /// its client to register it again (default [`DEFAULT_STALL_GRACE`], 60 s; 0-1 h).
    pub stall_grace: Duration,
    /// Shortest time between two whole-view pushes to one subscriber (default
    /// [`DEFAULT_FULL_PUSH_INTERVAL`]).
    pub full_push_interval: Duration,
    /// Shortest time between two pushes to one subscriber that takes deltas (default
    /// [`DEFAULT_DELTA_PUSH_INTERVAL`]).
    pub delta_push_interval: Duration,
    /// A drain or readiness wait that gives no timeout waits at most this (default
    /// [`DEFAULT_DRAIN_TIMEOUT`]).
    pub drain_timeout: Duration,
    /// Bound on a stop ([`RunningServer::shutdown`](crate::RunningServer::shutdown); default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]).
    pub shutdown_timeout: Duration,
    /// Connection timeouts and counts of both ports.
    pub connections: Connections,
    /// Nacos client detection timing.
    pub nacos: NacosTiming,
    /// Authentication and its options (docs/security.md).
    pub security: Security,
    /// What one session may hold (docs/security.md, "Limits").
    pub session_limits: SessionLimits,
    /// This node's etcd lease, kept by the binary with `--store etcd` (docs/cluster.md) and
    /// shown on `/v1/health`; `None` (default) without one.
    pub node_lease: Option<tokio::sync::watch::Receiver<gangway_wire::rest::NodeLease>>,
}

/// What one session may hold; beyond it a subscribe or register is refused with
/// `limit_exceeded` naming the limit, and nothing changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Subscriptions per session (default [`DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION`]).
    pub subscriptions: usize,
    /// Instances a session keeps alive (default [`DEFAULT_MAX_INSTANCES_PER_SESSION`]).
    pub instances: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            subscriptions: DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION,
            instances: DEFAULT_MAX_INSTANCES_PER_SESSION,
        }
    }
}

/// Authentication and what it covers. Default: off ([`Authority::off`]), which only a
/// loopback-bound server should run with (`gangway server` refuses otherwise unless
/// `--insecure-no-auth`).
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Users and tokens; [`Authority::off`] lets every request through.
    pub authority: Authority,
    /// `/metrics` requires credentials too (`--metrics-auth`); otherwise it is open.
    pub metrics_auth: bool,
    /// Auth is off on a non-loopback address by the operator's explicit choice
    /// (`--insecure-no-auth`): `/v1/health` says `"auth": "off"`.
    pub insecure_no_auth: bool,
    /// TLS on both ports (`--tls-cert`, `--tls-key`, `--tls-client-ca`; cargo feature
    /// `tls`). `None` (default): plain TCP. `/v1/health` says `"tls": "off"`, `"on"` or
    /// `"mutual"` (client certificates required).
    #[cfg(feature = "tls")]
    pub tls: Option<crate::tls::Tls>,
}

/// Nacos gRPC client detection (Nacos's `ClientDetectionRequest`): a connection that sent
/// nothing for `detect_after` is probed and closed (its instances go) when no answer comes
/// within `detect_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NacosTiming {
    /// Silence before a probe (default [`DEFAULT_NACOS_DETECT_AFTER`]).
    pub detect_after: Duration,
    /// Time to answer a probe (default [`DEFAULT_NACOS_DETECT_TIMEOUT`]).
    pub detect_timeout: Duration,
}

impl Default for NacosTiming {
    fn default() -> Self {
        Self {
            detect_after: DEFAULT_NACOS_DETECT_AFTER,
            detect_timeout: DEFAULT_NACOS_DETECT_TIMEOUT,
        }
    }
}

/// One thing wrong with a [`Config`]: the field (as `liveness.lease_ttl`) and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The field, dotted from [`Config`].
    pub field: &'static str,
    /// What is wrong, with the bound and the value.
    pub message: String,
}

/// Everything wrong with a [`Config`], found at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// Each problem, in field order.
    pub problems: Vec<ConfigProblem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<String> = self
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect();
        f.write_str(&text.join("; "))
    }
}

/// Connection bounds of the two ports (docs/operations.md, "Connections").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    /// HTTP: the request head must arrive within this (default
    /// [`DEFAULT_HTTP_HEADER_TIMEOUT`]).
    pub http_header_timeout: Duration,
    /// HTTP: an idle keep-alive connection is closed after this (default
    /// [`DEFAULT_HTTP_IDLE_TIMEOUT`]).
    pub http_idle_timeout: Duration,
    /// HTTP: a request body must be complete within this of the end of its head (default
    /// [`DEFAULT_HTTP_BODY_TIMEOUT`]); a body that stalls for [`Connections::http_header_timeout`]
    /// fails earlier. Either way: `408` `request_timeout`.
    pub http_body_timeout: Duration,
    /// HTTP: most open connections; further ones get a 503 `overloaded` JSON error and are
    /// closed. `None` (default): derived from the file descriptor limit, at most
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub http_max: Option<usize>,
    /// gRPC: the HTTP/2 preface must arrive within this of the accept (default
    /// [`DEFAULT_GRPC_HANDSHAKE_TIMEOUT`]).
    pub grpc_handshake_timeout: Duration,
    /// gRPC: most open connections; further ones get gRPC status UNAVAILABLE and are closed.
    /// `None` (default): derived as for [`Connections::http_max`].
    pub grpc_max: Option<usize>,
    /// Both ports: most open connections from one client IP address (default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_ADDRESS`]).
    pub per_address_max: usize,
    /// The open-file limit the maximums and the budget of both ports together (three quarters
    /// of it) are derived from. `None` (default): the process's soft `RLIMIT_NOFILE`. Set it
    /// lower to keep a server to a share of the process's descriptors (several servers in one
    /// process, tests).
    pub fd_limit: Option<u64>,
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            http_header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            http_idle_timeout: DEFAULT_HTTP_IDLE_TIMEOUT,
            http_body_timeout: DEFAULT_HTTP_BODY_TIMEOUT,
            http_max: None,
            grpc_handshake_timeout: DEFAULT_GRPC_HANDSHAKE_TIMEOUT,
            grpc_max: None,
            per_address_max: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            fd_limit: None,
        }
    }
}

/// Liveness timing (DESIGN §3).
#[derive(Debug, Clone, Copy)]
pub struct LivenessTiming {
    /// HTTP/2 keepalive ping interval on session connections.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
    /// Lease TTL (server default; instances may set their own).
    pub lease_ttl: Duration,
    /// Lease delete timeout (server default; instances may set their own).
    pub lease_delete_timeout: Duration,
}

impl Default for LivenessTiming {
    fn default() -> Self {
        Self {
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_delete_timeout: DEFAULT_LEASE_DELETE_TIMEOUT,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            liveness: LivenessTiming::default(),
            warmup: DEFAULT_WARMUP,
            offline_mark_expiry: DEFAULT_OFFLINE_MARK_EXPIRY,
            resend_interval: DEFAULT_RESEND_INTERVAL,
            poller_expiry: DEFAULT_POLLER_EXPIRY,
            stall_threshold: DEFAULT_STALL_THRESHOLD,
            stall_recovery: DEFAULT_STALL_RECOVERY,
            stall_grace: DEFAULT_STALL_GRACE,
            full_push_interval: DEFAULT_FULL_PUSH_INTERVAL,
            delta_push_interval: DEFAULT_DELTA_PUSH_INTERVAL,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            connections: Connections::default(),
            nacos: NacosTiming::default(),
            security: Security::default(),
            session_limits: SessionLimits::default(),
            node_lease: None,
        }
    }
}

/// `d` as `500ms`, `3s`, `2m` (whole seconds and minutes where exact).
fn show(d: Duration) -> String {
    gangway_core::duration::format(d)
}

impl Config {
    /// No warm-up (the rest default): for tests.
    pub fn for_tests() -> Self {
        Self {
            warmup: Duration::ZERO,
            ..Self::default()
        }
    }

    /// Checks every bound at once. The bounds: keepalive interval and timeout 100 ms-1 h;
    /// lease TTL and delete timeout within the per-instance bounds of
    /// `gangway_core::validate` (100 ms-24 h), the delete timeout at least the TTL; warm-up
    /// and stall recovery 0-1 h; offline-mark expiry 1 s-30 days; resend interval 10 ms-60 s;
    /// poller expiry 1 s-1 h; stall threshold 400 ms-1 h; push intervals 0-10 s; drain
    /// timeout 1 ms-1 h; shutdown timeout 100 ms-10 min; HTTP header and idle timeouts and gRPC
    /// handshake timeout 100 ms-1 h; connection maximums (per port and per address) and session
    /// limits 1-1,000,000; Nacos detection 1 s-1 h.
    ///
    /// Errors: every field out of its bounds, each named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        let hour = s(3600);
        let durations = [
            (
                "liveness.keepalive_interval",
                self.liveness.keepalive_interval,
                ms(100),
                hour,
            ),
            (
                "liveness.keepalive_timeout",
                self.liveness.keepalive_timeout,
                ms(100),
                hour,
            ),
            (
                "liveness.lease_ttl",
                self.liveness.lease_ttl,
                MIN_LEASE,
                MAX_LEASE,
            ),
            (
                "liveness.lease_delete_timeout",
                self.liveness.lease_delete_timeout,
                MIN_LEASE,
                MAX_LEASE,
            ),
            ("warmup", self.warmup, Duration::ZERO, hour),
            (
                "offline_mark_expiry",
                self.offline_mark_expiry,
                s(1),
                30 * 24 * hour,
            ),
            ("resend_interval", self.resend_interval, ms(10), s(60)),
            ("poller_expiry", self.poller_expiry, s(1), hour),
            ("stall_threshold", self.stall_threshold, ms(400), hour),
            ("stall_recovery", self.stall_recovery, Duration::ZERO, hour),
            ("stall_grace", self.stall_grace, Duration::ZERO, hour),
            (
                "full_push_interval",
                self.full_push_interval,
                Duration::ZERO,
                s(10),
            ),
            (
                "delta_push_interval",
                self.delta_push_interval,
                Duration::ZERO,
                s(10),
            ),
            ("drain_timeout", self.drain_timeout, ms(1), hour),
            ("shutdown_timeout", self.shutdown_timeout, ms(100), s(600)),
            (
                "connections.http_header_timeout",
                self.connections.http_header_timeout,
                ms(100),
                hour,
            ),
            (
                "connections.http_idle_timeout",
                self.connections.http_idle_timeout,
                ms(100),
                hour,
            ),
            (
                "connections.http_body_timeout",
                self.connections.http_body_timeout,
                ms(100),
                hour,
            ),
            (
                "connections.grpc_handshake_timeout",
                self.connections.grpc_handshake_timeout,
                ms(100),
                hour,
            ),
            ("nacos.detect_after", self.nacos.detect_after, s(1), hour),
            (
                "nacos.detect_timeout",
                self.nacos.detect_timeout,
                s(1),
                hour,
            ),
        ];
        let mut problems: Vec<ConfigProblem> = durations
            .into_iter()
            .filter(|(_, value, min, max)| value < min || value > max)
            .map(|(field, value, min, max)| ConfigProblem {
                field,
                message: format!("must be {}-{}, got {}", show(min), show(max), show(value)),
            })
            .collect();
        if self.liveness.lease_delete_timeout < self.liveness.lease_ttl {
            problems.push(ConfigProblem {
                field: "liveness.lease_delete_timeout",
                message: format!(
                    "must be at least liveness.lease_ttl ({}), got {}",
                    show(self.liveness.lease_ttl),
                    show(self.liveness.lease_delete_timeout)
                ),
            });
        }
        for (field, max) in [
            ("connections.http_max", self.connections.http_max),
            ("connections.grpc_max", self.connections.grpc_max),
            (
                "connections.per_address_max",
                Some(self.connections.per_address_max),
            ),
            (
                "session_limits.subscriptions",
                Some(self.session_limits.subscriptions),
            ),
            (
                "session_limits.instances",
                Some(self.session_limits.instances),
            ),
        ] {
            if let Some(n) = max.filter(|n| !(1..=1_000_000).contains(n)) {
                problems.push(ConfigProblem {
                    field,
                    message: format!("must be 1-1000000, got {n}"),
                });
            }
        }
        if let Some(n) = self.connections.fd_limit.filter(|n| *n < 16) {
            problems.push(ConfigProblem {
                field: "connections.fd_limit",
                message: format!("must be at least 16, got {n}"),
            });
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems })
        }
    }
}
