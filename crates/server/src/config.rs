//! Server configuration: typed, built once at start-up, defaults as constants.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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
/// Default drain timeout: 30 s.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default stall threshold: the registry's clock jumping by more than this between two looks
/// (its timer ticks every 200 ms) is its own stall (SIGSTOP, VM pause): 2 s, ten ticks, so that
/// a process starved of CPU for a moment (seen: 1.1 s on a loaded 2-core machine) is not taken
/// for a stopped one.
pub const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(2);
/// Default stall recovery: after a stall, snapshots are held back and expiry waits this long
/// while sessions reconnect and re-register (the same as the start-up warm-up): 5 s.
pub const DEFAULT_STALL_RECOVERY: Duration = Duration::from_secs(5);
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
/// Default gRPC handshake timeout: a connection must send the HTTP/2 client preface within this
/// of its accept; afterwards HTTP/2 keepalive pings decide: 10 s.
pub const DEFAULT_GRPC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections per port when [`Connections::http_max`] or [`Connections::grpc_max`] is
/// derived from the file descriptor limit (`None`): 10,000.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Everything the server needs, resolved.
#[derive(Debug, Clone)]
pub struct Config {
    /// REST address; port 0 picks a free port.
    pub http: SocketAddr,
    /// gRPC address; port 0 picks a free port.
    pub grpc: SocketAddr,
    /// Data directory for the redb store; `None` keeps durable state in memory (tests only).
    pub data_dir: Option<PathBuf>,
    /// Session and lease timing.
    pub liveness: Liveness,
    /// No snapshots are pushed for this long after start.
    pub warmup: Duration,
    /// Offline marks of instances gone this long are dropped.
    pub offline_mark_expiry: Duration,
    /// Unacked pushes are re-sent after this long.
    pub resend_interval: Duration,
    /// Pollers silent this long leave the subscriber table.
    pub poller_expiry: Duration,
    /// A clock jump larger than this between two looks is the registry's own stall.
    pub stall_threshold: Duration,
    /// After a stall, snapshots are held back and expiry waits this long.
    pub stall_recovery: Duration,
    /// Shortest time between two whole-view pushes to one subscriber.
    pub full_push_interval: Duration,
    /// Shortest time between two pushes to one subscriber that takes deltas.
    pub delta_push_interval: Duration,
    /// Bound on a stop ([`RunningServer::shutdown`](crate::RunningServer::shutdown)).
    pub shutdown_timeout: Duration,
    /// Connection timeouts and counts of both ports.
    pub connections: Connections,
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
}

impl Default for Connections {
    fn default() -> Self {
        Self {
            http_header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            http_idle_timeout: DEFAULT_HTTP_IDLE_TIMEOUT,
            http_max: None,
            grpc_handshake_timeout: DEFAULT_GRPC_HANDSHAKE_TIMEOUT,
            grpc_max: None,
        }
    }
}

/// Liveness timing (DESIGN §3).
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// HTTP/2 keepalive ping interval on session connections.
    pub keepalive_interval: Duration,
    /// HTTP/2 keepalive ping timeout.
    pub keepalive_timeout: Duration,
    /// Lease TTL (server default; instances may set their own).
    pub lease_ttl: Duration,
    /// Lease delete timeout (server default; instances may set their own).
    pub lease_delete_timeout: Duration,
}

impl Default for Liveness {
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
            http: DEFAULT_HTTP.parse().expect("valid default"),
            grpc: DEFAULT_GRPC.parse().expect("valid default"),
            data_dir: Some(PathBuf::from("./gangway-data")),
            liveness: Liveness::default(),
            warmup: DEFAULT_WARMUP,
            offline_mark_expiry: DEFAULT_OFFLINE_MARK_EXPIRY,
            resend_interval: DEFAULT_RESEND_INTERVAL,
            poller_expiry: DEFAULT_POLLER_EXPIRY,
            stall_threshold: DEFAULT_STALL_THRESHOLD,
            stall_recovery: DEFAULT_STALL_RECOVERY,
            full_push_interval: DEFAULT_FULL_PUSH_INTERVAL,
            delta_push_interval: DEFAULT_DELTA_PUSH_INTERVAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            connections: Connections::default(),
        }
    }
}

impl Config {
    /// Loopback, free ports, in-memory store, no warm-up: for tests.
    pub fn for_tests() -> Self {
        Self {
            http: "127.0.0.1:0".parse().expect("valid"),
            grpc: "127.0.0.1:0".parse().expect("valid"),
            data_dir: None,
            warmup: Duration::ZERO,
            ..Self::default()
        }
    }
}
