//! `gangway server`: run the registry until SIGINT or SIGTERM. The binary chooses the store
//! (redb under `--data-dir` by default, or etcd with `--store etcd`, the `etcd` feature) and
//! binds both ports, then hands them to `gangway_server::start`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gangway_server::config::{self, Config, ConfigError};
use tokio::net::TcpListener;

use crate::args::{format_duration, parse_duration};
use crate::error::CliError;

/// A duration flag: parses `500ms`, `3s`, `2m` (a bare number is seconds) and shows itself the
/// same way, so that a flag's default is written from the config's constant, never as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(Dur)
    }
}

/// Flags of `gangway server`. Durations take `500ms`, `3s`, `2m` (a bare number is seconds).
/// Every default is the server configuration's (`gangway_server::config`); every bound is
/// [`Config::validate`]'s.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// REST address (the Nacos HTTP port by default).
    #[arg(long, default_value = config::DEFAULT_HTTP, value_name = "ADDR")]
    pub http: SocketAddr,
    /// gRPC address for sessions (HTTP port + 1000, as Nacos).
    #[arg(long, default_value = config::DEFAULT_GRPC, value_name = "ADDR")]
    pub grpc: SocketAddr,
    /// Directory of the embedded store (persistent instances, settings, offline marks).
    #[arg(long, default_value = config::DEFAULT_DATA_DIR, value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Where durable state lives: `redb` (embedded, under --data-dir) or `etcd` (shared by
    /// the gangway nodes on one etcd cluster: --etcd-endpoints; docs/cluster.md).
    #[arg(long, value_enum, default_value_t = StoreKind::Redb, value_name = "redb|etcd")]
    pub store: StoreKind,
    /// With --store etcd: etcd client URLs, comma-separated, `http://HOST:PORT` (1-32).
    #[arg(long, value_name = "URL,...")]
    pub etcd_endpoints: Option<String>,
    /// With --store etcd: the key prefix of this registry's keys (default /gangway); starts
    /// with /, no trailing /.
    #[arg(long, value_name = "PREFIX")]
    pub etcd_prefix: Option<String>,
    /// With --store etcd: TTL of this node's etcd lease (whole seconds, 2s-60s; default 5s),
    /// renewed every third of it; shown on /v1/health.
    #[arg(long, value_name = "DURATION")]
    pub etcd_lease_ttl: Option<Dur>,
    /// With --store etcd: this node's name in the cluster (1-128 bytes, no spaces; default
    /// the --http address, e.g. 127.0.0.1:8848). Shown on /v1/cluster and on drain reports.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// HTTP/2 keepalive ping interval on sessions.
    #[arg(long, default_value_t = Dur(config::DEFAULT_KEEPALIVE_INTERVAL), value_name = "DURATION")]
    pub keepalive_interval: Dur,
    /// A session whose peer does not answer a ping within this ends (frozen client).
    #[arg(long, default_value_t = Dur(config::DEFAULT_KEEPALIVE_TIMEOUT), value_name = "DURATION")]
    pub keepalive_timeout: Dur,
    /// Lease TTL: a heartbeat-kept instance is unhealthy after this long without a heartbeat.
    #[arg(long, default_value_t = Dur(config::DEFAULT_LEASE_TTL), value_name = "DURATION")]
    pub lease_ttl: Dur,
    /// Lease delete timeout: removed after this long without a heartbeat.
    #[arg(long, default_value_t = Dur(config::DEFAULT_LEASE_DELETE_TIMEOUT), value_name = "DURATION")]
    pub lease_delete_timeout: Dur,
    /// After start, hold back snapshots this long while sessions re-register.
    #[arg(long, default_value_t = Dur(config::DEFAULT_WARMUP), value_name = "DURATION")]
    pub warmup: Dur,
    /// Forget an offline mark once its instance has been gone this long.
    #[arg(long, default_value_t = Dur(config::DEFAULT_OFFLINE_MARK_EXPIRY), value_name = "DURATION")]
    pub offline_mark_expiry: Dur,
    /// Re-send an unacked push after this long.
    #[arg(long, default_value_t = Dur(config::DEFAULT_RESEND_INTERVAL), value_name = "DURATION")]
    pub resend_interval: Dur,
    /// A jump of the registry's own clock by more than this between two ticks (200 ms apart)
    /// is its own stall (SIGSTOP, VM pause): leases are extended and expiry waits.
    #[arg(long, default_value_t = Dur(config::DEFAULT_STALL_THRESHOLD), value_name = "DURATION")]
    pub stall_threshold: Dur,
    /// After such a stall, hold back snapshots and expiry this long while sessions reconnect.
    #[arg(long, default_value_t = Dur(config::DEFAULT_STALL_RECOVERY), value_name = "DURATION")]
    pub stall_recovery: Dur,
    /// An instance whose session ended during that recovery stays this long for its client to
    /// register it again (Nacos SDKs redo 14-28 s after the resume).
    #[arg(long, default_value_t = Dur(config::DEFAULT_STALL_GRACE), value_name = "DURATION")]
    pub stall_grace: Dur,
    /// A drain or readiness wait that gives no timeout of its own waits at most this.
    #[arg(long, default_value_t = Dur(config::DEFAULT_DRAIN_TIMEOUT), value_name = "DURATION")]
    pub drain_timeout: Dur,
    /// On SIGTERM/SIGINT, stop within this: sessions are told to go away, watches and Nacos
    /// streams end, connections close; what still runs then is dropped.
    #[arg(long, default_value_t = Dur(config::DEFAULT_SHUTDOWN_TIMEOUT), value_name = "DURATION")]
    pub shutdown_timeout: Dur,
    /// HTTP: a request head must arrive within this (from its first byte; from the accept for a
    /// connection's first request), or the connection is closed (slowloris); a request body
    /// may not stall for longer either.
    #[arg(long, default_value_t = Dur(config::DEFAULT_HTTP_HEADER_TIMEOUT), value_name = "DURATION")]
    pub http_header_timeout: Dur,
    /// HTTP: a keep-alive connection with nothing in flight is closed after this.
    #[arg(long, default_value_t = Dur(config::DEFAULT_HTTP_IDLE_TIMEOUT), value_name = "DURATION")]
    pub http_idle_timeout: Dur,
    /// HTTP: a request body must be complete within this of its head, however steadily it
    /// trickles in, or the request gets 408 `request_timeout`.
    #[arg(long, default_value_t = Dur(config::DEFAULT_HTTP_BODY_TIMEOUT), value_name = "DURATION")]
    pub http_body_timeout: Dur,
    /// HTTP: most open connections; more get 503 `overloaded`. `auto`: from the open-file
    /// limit (three quarters of it shared by both ports, at most 10000 each).
    #[arg(long, default_value = "auto", value_parser = parse_max_connections, value_name = "N|auto")]
    pub http_max_connections: MaxConnections,
    /// gRPC: a connection must send the HTTP/2 preface within this of its accept.
    #[arg(long, default_value_t = Dur(config::DEFAULT_GRPC_HANDSHAKE_TIMEOUT), value_name = "DURATION")]
    pub grpc_handshake_timeout: Dur,
    /// gRPC: most open connections; more get status UNAVAILABLE. `auto` as for HTTP.
    #[arg(long, default_value = "auto", value_parser = parse_max_connections, value_name = "N|auto")]
    pub grpc_max_connections: MaxConnections,
    /// Both ports: most open connections from one client IP address; more get the port's
    /// refusal naming the limit (docs/security.md, "Limits").
    #[arg(long, default_value_t = config::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, value_name = "N")]
    pub max_connections_per_address: usize,
    /// Most subscriptions one session (native or Nacos gRPC) holds; one more is refused
    /// `limit_exceeded`.
    #[arg(long, default_value_t = config::DEFAULT_MAX_SUBSCRIPTIONS_PER_SESSION, value_name = "N")]
    pub max_subscriptions_per_session: usize,
    /// Most instances one session keeps alive; one more is refused `limit_exceeded`.
    #[arg(long, default_value_t = config::DEFAULT_MAX_INSTANCES_PER_SESSION, value_name = "N")]
    pub max_instances_per_session: usize,
    /// Users and API tokens (TOML, edited with `gangway auth`), reloaded on SIGHUP. Without
    /// it every request is allowed, so the server binds loopback addresses only.
    #[arg(long, value_name = "FILE")]
    pub auth: Option<PathBuf>,
    /// Serve without --auth on a non-loopback address anyway: anyone who reaches the ports
    /// may change everything. Warned at start and shown on /v1/health ("auth": "off").
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// /metrics requires credentials too (any valid token or user); needs --auth.
    #[arg(long)]
    pub metrics_auth: bool,
    /// PEM certificate chain (the server's own certificate first): serve both ports over TLS,
    /// with --tls-key. Re-read on SIGHUP and when a file changes (docs/security.md, "TLS").
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: every client must present a certificate signed by one of them, or
    /// its TLS handshake fails (needs --tls-cert).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `gangway_server=debug`.
    #[arg(long, default_value = "info", value_name = "FILTER", value_parser = parse_log_filter)]
    pub log: String,
}

/// The store `gangway server` keeps durable state in (`--store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// redb under `--data-dir` (the default).
    Redb,
    /// etcd at `--etcd-endpoints` under `--etcd-prefix` (needs the `etcd` feature).
    Etcd,
}

/// The store chosen by the flags, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreChoice {
    /// redb in this directory.
    Redb(PathBuf),
    /// etcd with this configuration, a node lease of this TTL, and this node name.
    #[cfg(feature = "etcd")]
    Etcd(gangway_store_etcd::EtcdConfig, Duration, String),
}

/// An opened store, and with etcd the node's lease.
pub struct OpenedStore {
    /// The store to hand to the server.
    pub store: Arc<dyn gangway_store::Store>,
    /// The node lease as `/v1/health` shows it (`--store etcd`).
    pub node_lease: Option<tokio::sync::watch::Receiver<gangway_wire::rest::NodeLease>>,
    /// Revokes the node lease (blocking; at most the etcd request timeout) at the stop.
    pub release: Option<Box<dyn FnOnce() + Send>>,
    /// The node lease's TTL (`--store etcd`): how long a stopping node waits at most for
    /// other nodes to take its instances over before it revokes its lease.
    pub lease_ttl: Option<Duration>,
}

impl StoreChoice {
    /// Opens the store; connecting to etcd blocks, so it runs on a blocking thread.
    ///
    /// Errors: the data directory cannot be opened, or etcd does not answer within its
    /// connect timeout.
    pub async fn open(self) -> anyhow::Result<OpenedStore> {
        match self {
            StoreChoice::Redb(dir) => {
                let store = gangway_store_redb::RedbStore::open(&dir)
                    .with_context(|| format!("data dir {}", dir.display()))?;
                Ok(OpenedStore {
                    store: Arc::new(store),
                    node_lease: None,
                    release: None,
                    lease_ttl: None,
                })
            }
            #[cfg(feature = "etcd")]
            StoreChoice::Etcd(config, ttl, name) => {
                let (store, node) = tokio::task::spawn_blocking(move || {
                    let store = gangway_store_etcd::EtcdStore::connect(config)?;
                    let node = store.join(&name, ttl)?;
                    Ok::<_, gangway_store::StoreError>((store, node))
                })
                .await
                .context("etcd connect task")?
                .context("--store etcd")?;
                let node_lease = forward_lease(node.lease_state(), ttl);
                tracing::info!(node = %gangway_store::Cluster::node(node.as_ref()), lease = %format!("{:016x}", gangway_store::Cluster::lease(node.as_ref())), "joined the cluster; etcd node lease granted");
                Ok(OpenedStore {
                    store: Arc::new(store),
                    node_lease: Some(node_lease),
                    release: Some(Box::new(move || {
                        if let Err(e) = node.leave() {
                            tracing::warn!(error = %e, "etcd node lease not revoked; it expires after its ttl");
                        }
                    })),
                    lease_ttl: Some(ttl),
                })
            }
        }
    }

    /// How the start-up line names the store: `data-dir=DIR`, or `store=etcd endpoints=...
    /// prefix=...`.
    pub fn describe(&self) -> String {
        match self {
            StoreChoice::Redb(dir) => format!("data-dir={}", dir.display()),
            #[cfg(feature = "etcd")]
            StoreChoice::Etcd(c, _, name) => format!(
                "store=etcd endpoints={} prefix={} node={name}",
                c.endpoints.join(","),
                c.prefix
            ),
        }
    }
}

/// The node lease's state as `/v1/health` shows it, kept current by a task that ends with
/// the lease's keep-alive.
#[cfg(feature = "etcd")]
fn forward_lease(
    mut states: tokio::sync::watch::Receiver<gangway_store_etcd::LeaseState>,
    ttl: Duration,
) -> tokio::sync::watch::Receiver<gangway_wire::rest::NodeLease> {
    use gangway_store_etcd::LeaseState;
    let ttl_s = ttl.as_secs() as i64;
    let show = move |state: &LeaseState| match state {
        LeaseState::Alive {
            id,
            ttl_s,
            renewals,
        } => gangway_wire::rest::NodeLease {
            id: format!("{id:016x}"),
            state: "alive".into(),
            ttl_s: *ttl_s,
            renewals: *renewals,
            reason: None,
        },
        LeaseState::Lost { id, reason } => gangway_wire::rest::NodeLease {
            id: format!("{id:016x}"),
            state: "lost".into(),
            ttl_s,
            renewals: 0,
            reason: Some(reason.clone()),
        },
    };
    let (tx, rx) = tokio::sync::watch::channel(show(&states.borrow_and_update()));
    tokio::spawn(async move {
        while states.changed().await.is_ok() {
            let state = states.borrow_and_update().clone();
            if let LeaseState::Lost { reason, .. } = &state {
                tracing::error!(%reason, "etcd node lease lost; granting a new one");
            }
            if tx.send(show(&state)).is_err() {
                break;
            }
        }
    });
    rx
}

/// A maximum connection count: a number, or derived from the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxConnections {
    /// Derived from `RLIMIT_NOFILE` by the server.
    Auto,
    /// This many.
    Count(usize),
}

impl MaxConnections {
    fn get(self) -> Option<usize> {
        match self {
            MaxConnections::Auto => None,
            MaxConnections::Count(n) => Some(n),
        }
    }
}

/// `auto` or a count of 1-1000000.
fn parse_max_connections(s: &str) -> Result<MaxConnections, String> {
    if s == "auto" {
        return Ok(MaxConnections::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(MaxConnections::Count(n)),
        _ => Err(format!("must be auto or 1-1000000, got {s:?}")),
    }
}

/// Checks a `--log` filter (tracing `EnvFilter` syntax): a typo fails here rather than silently
/// logging nothing.
fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map_err(|e| format!("not a log filter ({e}); e.g. info, warn, gangway_server=debug"))?;
    Ok(s.to_owned())
}

impl ServerArgs {
    /// The server configuration these flags describe, checked by [`Config::validate`].
    ///
    /// Errors (a [`CliError::Usage`], exit status 2 like every bad argument): every flag out of
    /// its bounds, each named, in one message.
    pub fn config(&self) -> Result<Config, CliError> {
        let mut c = Config::default();
        c.liveness.keepalive_interval = self.keepalive_interval.0;
        c.liveness.keepalive_timeout = self.keepalive_timeout.0;
        c.liveness.lease_ttl = self.lease_ttl.0;
        c.liveness.lease_delete_timeout = self.lease_delete_timeout.0;
        c.warmup = self.warmup.0;
        c.offline_mark_expiry = self.offline_mark_expiry.0;
        c.resend_interval = self.resend_interval.0;
        c.stall_threshold = self.stall_threshold.0;
        c.stall_recovery = self.stall_recovery.0;
        c.stall_grace = self.stall_grace.0;
        c.drain_timeout = self.drain_timeout.0;
        c.shutdown_timeout = self.shutdown_timeout.0;
        c.connections.http_header_timeout = self.http_header_timeout.0;
        c.connections.http_idle_timeout = self.http_idle_timeout.0;
        c.connections.http_body_timeout = self.http_body_timeout.0;
        c.connections.http_max = self.http_max_connections.get();
        c.connections.grpc_handshake_timeout = self.grpc_handshake_timeout.0;
        c.connections.grpc_max = self.grpc_max_connections.get();
        c.connections.per_address_max = self.max_connections_per_address;
        c.session_limits.subscriptions = self.max_subscriptions_per_session;
        c.session_limits.instances = self.max_instances_per_session;
        c.validate().map_err(flag_problems)?;
        self.check_exposure()?;
        c.security.metrics_auth = self.metrics_auth;
        c.security.insecure_no_auth = self.insecure_no_auth && self.auth.is_none();
        Ok(c)
    }

    /// The store of --store, --data-dir, --etcd-endpoints and --etcd-prefix.
    ///
    /// Errors (a [`CliError::Usage`], exit 2), one line naming the flag: an --etcd-* flag
    /// without --store etcd; --store etcd without --etcd-endpoints, or in a gangway built
    /// without the `etcd` feature; an endpoint or prefix that breaks its rule.
    pub fn store_choice(&self) -> Result<StoreChoice, CliError> {
        match self.store {
            StoreKind::Redb => {
                for (flag, set) in [
                    ("--etcd-endpoints", self.etcd_endpoints.is_some()),
                    ("--etcd-prefix", self.etcd_prefix.is_some()),
                    ("--etcd-lease-ttl", self.etcd_lease_ttl.is_some()),
                    ("--node-name", self.node_name.is_some()),
                ] {
                    if set {
                        return Err(CliError::usage(
                            flag,
                            format!("{flag} needs --store etcd (the store is redb)"),
                        ));
                    }
                }
                Ok(StoreChoice::Redb(self.data_dir.clone()))
            }
            StoreKind::Etcd => self.etcd_choice(),
        }
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd_choice(&self) -> Result<StoreChoice, CliError> {
        Err(CliError::usage(
            "--store",
            "--store etcd: this gangway was built without etcd support \
             (cargo build -p gangway-cli --features etcd; docs/cluster.md)",
        ))
    }

    #[cfg(feature = "etcd")]
    fn etcd_choice(&self) -> Result<StoreChoice, CliError> {
        use gangway_store_etcd::config::{self as etcd, EtcdConfig};
        let Some(list) = &self.etcd_endpoints else {
            return Err(CliError::usage(
                "--etcd-endpoints",
                "--store etcd needs --etcd-endpoints http://HOST:PORT,... (the etcd client URLs)",
            ));
        };
        let endpoints = etcd::parse_endpoints(list)
            .map_err(|m| CliError::usage("--etcd-endpoints", format!("--etcd-endpoints {m}")))?;
        let config = EtcdConfig {
            endpoints,
            prefix: self
                .etcd_prefix
                .clone()
                .unwrap_or_else(|| etcd::DEFAULT_PREFIX.to_owned()),
            ..EtcdConfig::default()
        };
        if let Err(e) = config.validate() {
            let p = &e.problems[0];
            let flag = match p.field {
                "endpoints" => "--etcd-endpoints",
                _ => "--etcd-prefix",
            };
            return Err(CliError::usage(flag, format!("{flag} {}", p.message)));
        }
        use gangway_store_etcd::lease::{DEFAULT_TTL, MAX_TTL, MIN_TTL};
        let ttl = self.etcd_lease_ttl.map_or(DEFAULT_TTL, |d| d.0);
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) || ttl.subsec_nanos() != 0 {
            return Err(CliError::usage(
                "--etcd-lease-ttl",
                format!(
                    "--etcd-lease-ttl must be whole seconds, 2s-60s, got {}",
                    format_duration(ttl)
                ),
            ));
        }
        let name = self
            .node_name
            .clone()
            .unwrap_or_else(|| self.http.to_string());
        if name.is_empty() || name.len() > 128 || name.contains(char::is_whitespace) {
            return Err(CliError::usage(
                "--node-name",
                format!("--node-name must be 1-128 bytes without spaces, got {name:?}"),
            ));
        }
        Ok(StoreChoice::Etcd(config, ttl, name))
    }

    /// Without --auth only loopback addresses are served, unless --insecure-no-auth says
    /// otherwise; --metrics-auth needs --auth.
    fn check_exposure(&self) -> Result<(), CliError> {
        if self.auth.is_some() {
            return Ok(());
        }
        if self.metrics_auth {
            return Err(CliError::usage(
                "--metrics-auth",
                "--metrics-auth needs --auth FILE (the users and tokens to check)",
            ));
        }
        if self.insecure_no_auth {
            return Ok(());
        }
        for (flag, addr) in [("--http", self.http), ("--grpc", self.grpc)] {
            if !addr.ip().is_loopback() {
                return Err(CliError::usage(
                    flag,
                    format!(
                        "{flag} {addr} is reachable from other hosts and no --auth is given: \
                         add --auth FILE (see `gangway auth --help`), or --insecure-no-auth"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// How often `gangway server` looks at the TLS files' modification times and sizes, to reload
/// them when they change (a renewed certificate, a Kubernetes secret swapped): every 2 s. A
/// look is three `stat` calls.
pub const TLS_FILE_POLL: Duration = Duration::from_secs(2);

impl ServerArgs {
    /// The TLS files of --tls-cert, --tls-key and --tls-client-ca, loaded; `None` without
    /// --tls-cert.
    ///
    /// Errors (a [`CliError::Usage`], exit 2): the first file that cannot be used, naming its
    /// flag, the file and the problem.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Result<Option<gangway_server::tls::Tls>, CliError> {
        use gangway_server::tls::{Tls, TlsFiles};
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.tls_client_ca.clone(),
        };
        Tls::load(files).map(Some).map_err(|e| {
            let flag = tls_flag(&e);
            CliError::usage(flag, format!("{flag} {}: {}", e.path.display(), e.reason))
        })
    }

    /// Without TLS support any TLS flag is refused.
    #[cfg(not(feature = "tls"))]
    pub fn tls(&self) -> Result<Option<std::convert::Infallible>, CliError> {
        match self.tls_cert {
            Some(_) => Err(CliError::usage(
                "--tls-cert",
                format!("--tls-cert: {}", crate::tls::NO_TLS),
            )),
            None => Ok(None),
        }
    }
}

/// The flag that names the file of `e`.
#[cfg(feature = "tls")]
fn tls_flag(e: &gangway_server::tls::TlsError) -> &'static str {
    use gangway_server::tls::TlsFileKind;
    match e.kind {
        TlsFileKind::Cert => "--tls-cert",
        TlsFileKind::Key => "--tls-key",
        TlsFileKind::ClientCa => "--tls-client-ca",
    }
}

/// Reloads the TLS files (after SIGHUP, or when `changed_only`, if a file changed) and logs
/// the outcome in one line; nothing without TLS, or when nothing changed.
#[cfg(feature = "tls")]
fn reload_tls(tls: Option<&gangway_server::tls::Tls>, trigger: &str, changed_only: bool) {
    let Some(tls) = tls else { return };
    let outcome = if changed_only {
        match tls.reload_if_changed() {
            Some(outcome) => outcome,
            None => return,
        }
    } else {
        tls.reload()
    };
    match outcome {
        Ok(()) => tracing::info!(
            cert = %tls.files().cert.display(),
            "{trigger}: TLS files reloaded; new connections get them"
        ),
        Err(e) => tracing::warn!(
            "{trigger}: TLS files not reloaded, the old ones stay: {} {}: {}",
            tls_flag(&e),
            e.path.display(),
            e.reason
        ),
    }
}

/// The config's field names as the flags that set them (`liveness.lease_ttl` is
/// `--lease-ttl`, `connections.http_max` is `--http-max-connections`).
fn flag_of(field: &str) -> String {
    let name = field.rsplit('.').next().unwrap_or(field);
    let name = match name {
        "http_max" => "http_max_connections",
        "grpc_max" => "grpc_max_connections",
        "per_address_max" => "max_connections_per_address",
        "subscriptions" => "max_subscriptions_per_session",
        "instances" => "max_instances_per_session",
        other => other,
    };
    format!("--{}", name.replace('_', "-"))
}

fn flag_problems(e: ConfigError) -> CliError {
    let message: Vec<String> = e
        .problems
        .iter()
        .map(|p| {
            let flag = flag_of(p.field);
            let text = p.message.replace("liveness.lease_ttl", "--lease-ttl");
            format!("{flag} {text}")
        })
        .collect();
    let first = e
        .problems
        .first()
        .map(|p| flag_of(p.field))
        .unwrap_or_default();
    CliError::usage(&first, message.join("; "))
}

/// Runs the registry until SIGINT/SIGTERM, then stops within `--shutdown-timeout`.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    let store = args.store_choice()?;
    let tls = args.tls()?;
    // Handlers first, so that a signal sent right after the start-up line is never lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    // Every connection holds a descriptor: take what the hard limit allows.
    let fd_limit = gangway_server::serve::raise_fd_limit()
        .map(|n| n.to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    // Bind first: a taken port must not leave a new data directory behind.
    let http = TcpListener::bind(args.http)
        .await
        .with_context(|| format!("bind HTTP {}", args.http))?;
    let grpc = TcpListener::bind(args.grpc)
        .await
        .with_context(|| format!("bind gRPC {}", args.grpc))?;
    let store_line = store.describe();
    let opened = store.open().await?;
    let mut config = config;
    #[cfg(feature = "tls")]
    {
        config.security.tls = tls.clone();
    }
    let tls_mode = tls.as_ref().map_or("off", |t| {
        #[cfg(feature = "tls")]
        return t.mode();
        #[cfg(not(feature = "tls"))]
        match *t {}
    });
    if let Some(path) = &args.auth {
        config.security.authority = gangway_server::auth::Authority::load(path)
            .with_context(|| "--auth: cannot load the users and tokens")?;
    } else if config.security.insecure_no_auth {
        tracing::warn!(
            http = %args.http,
            grpc = %args.grpc,
            "--insecure-no-auth: no authentication; anyone who reaches these ports may \
             register, offline, drain and delete anything"
        );
    }
    let authority = config.security.authority.clone();
    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    config.node_lease = opened.node_lease.clone();
    // Held until the end: in cluster mode the store's runtime carries the watch that sees
    // other nodes take this node's instances over after the stop.
    let store_kept = opened.store.clone();
    let server = gangway_server::start(config.clone(), opened.store, http, grpc).await?;
    // The ports answer health (503 LOADING) while the store loads; the line below says that
    // everything is served.
    server.loaded().await?;
    let (http_max, grpc_max) = server.max_connections;
    println!(
        "gangway server {} listening: http={} grpc={} {store_line} warm-up={} \
         max-connections={http_max}/{grpc_max} budget={} fd-limit={fd_limit} auth={} \
         tls={tls_mode}",
        env!("CARGO_PKG_VERSION"),
        server.http_addr,
        server.grpc_addr,
        format_duration(config.warmup),
        server.connection_budget,
        if authority.is_on() { "on" } else { "off" },
    );
    let mut tls_poll = tokio::time::interval(TLS_FILE_POLL);
    tls_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break }
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break }
            _ = hup.recv() => {
                match authority.reload() {
                    Ok((users, tokens)) if authority.is_on() => {
                        tracing::info!(users, tokens, "SIGHUP: auth file reloaded");
                    }
                    Ok(_) => tracing::info!("SIGHUP: no --auth file to reload"),
                    Err(e) => tracing::warn!(error = %e, "SIGHUP: auth file not reloaded, the old one stays"),
                }
                #[cfg(feature = "tls")]
                reload_tls(tls.as_ref(), "SIGHUP", false);
            }
            _ = tls_poll.tick(), if tls.is_some() => {
                #[cfg(feature = "tls")]
                reload_tls(tls.as_ref(), "TLS files changed", true);
            }
        }
    }
    let registry = server.registry.clone();
    let report = server.shutdown().await;
    if let Some(release) = opened.release {
        // Cluster mode: the stop ended this node's sessions, so their clients reconnect to
        // other nodes and re-register, taking the instances over under those nodes' leases.
        // Revoking first would publish removals meanwhile: the lease is revoked once no record
        // of this node is left, or after its TTL (when it would have expired anyway).
        let wait = opened.lease_ttl.unwrap_or_default();
        registry
            .own_records_gone(tokio::time::Instant::now() + wait)
            .await;
        let _ = tokio::task::spawn_blocking(release).await;
    }
    drop(store_kept);
    let dropped = report.http.dropped + report.grpc.dropped;
    println!(
        "gangway server stopped in {} ms: {} connections closed, {dropped} dropped at the \
         {} timeout; store {}",
        report.elapsed.as_millis(),
        report.http.closed + report.grpc.closed,
        format_duration(config.shutdown_timeout),
        if report.engine.store_released {
            "released"
        } else {
            "released when its last write ends"
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use gangway_server::config;

    use super::ServerArgs;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        server: ServerArgs,
    }

    fn parse(args: &[&str]) -> Result<ServerArgs, clap::Error> {
        Args::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
            .map(|a| a.server)
    }

    #[test]
    fn stop_and_connection_flags_default_to_the_documented_constants() {
        let c = parse(&[]).unwrap().config().unwrap();
        assert_eq!(c.shutdown_timeout, config::DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(c.connections, config::Connections::default());
        assert_eq!(c.connections.http_header_timeout, Duration::from_secs(30));
        assert_eq!(c.connections.http_idle_timeout, Duration::from_secs(75));
        assert_eq!(c.connections.http_body_timeout, Duration::from_secs(10));
        assert_eq!(
            c.connections.grpc_handshake_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(c.connections.http_max, None, "auto");
    }

    #[test]
    fn without_auth_only_loopback_is_served_unless_insecure() {
        assert!(parse(&[]).unwrap().config().is_ok());
        for flags in [
            &["--http", "0.0.0.0:8848"][..],
            &["--grpc", "192.0.2.1:9848"][..],
        ] {
            let e = parse(flags).unwrap().config().unwrap_err().to_string();
            assert!(
                e.contains("reachable from other hosts") && e.contains("--insecure-no-auth"),
                "{e}"
            );
        }
        let c = parse(&["--http", "0.0.0.0:8848", "--insecure-no-auth"])
            .unwrap()
            .config()
            .unwrap();
        assert!(c.security.insecure_no_auth);
        let c = parse(&["--http", "0.0.0.0:8848", "--auth", "/nonexistent"])
            .unwrap()
            .config()
            .unwrap();
        assert!(!c.security.insecure_no_auth);
        let e = parse(&["--metrics-auth"])
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(e.contains("--metrics-auth needs --auth"), "{e}");
    }

    #[test]
    fn the_store_is_redb_by_default_and_etcd_flags_need_store_etcd() {
        let choice = parse(&["--data-dir", "/tmp/x"])
            .unwrap()
            .store_choice()
            .unwrap();
        assert_eq!(choice, super::StoreChoice::Redb("/tmp/x".into()));
        assert_eq!(choice.describe(), "data-dir=/tmp/x");
        for (flag, value) in [
            ("--etcd-endpoints", "http://127.0.0.1:2379"),
            ("--etcd-prefix", "/x"),
            ("--etcd-lease-ttl", "5s"),
        ] {
            let e = parse(&[flag, value])
                .unwrap()
                .store_choice()
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("{flag} needs --store etcd")), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = parse(&["--store", "zookeeper"]).err().unwrap().to_string();
        assert!(e.contains("--store") && e.contains("redb"), "{e}");
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn store_etcd_without_the_feature_is_refused_naming_it() {
        let e = parse(&[
            "--store",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379",
        ])
        .unwrap()
        .store_choice()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--store etcd: this gangway was built without etcd"),
            "{e}"
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn store_etcd_flags_are_read_and_checked_one_line_naming_the_flag() {
        let choice = parse(&[
            "--store",
            "etcd",
            "--etcd-endpoints",
            "http://127.0.0.1:2379,http://127.0.0.1:22379",
        ])
        .unwrap()
        .store_choice()
        .unwrap();
        let super::StoreChoice::Etcd(c, ttl, _) = &choice else {
            panic!("{choice:?}")
        };
        assert_eq!(*ttl, Duration::from_secs(5));
        assert_eq!(
            c.endpoints,
            ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]
        );
        assert_eq!(c.prefix, "/gangway");
        assert_eq!(
            choice.describe(),
            "store=etcd endpoints=http://127.0.0.1:2379,http://127.0.0.1:22379 prefix=/gangway \
             node=127.0.0.1:8848"
        );
        for (flags, says) in [
            (
                &["--store", "etcd"][..],
                "--store etcd needs --etcd-endpoints",
            ),
            (
                &["--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"][..],
                "--etcd-endpoints \"127.0.0.1:2379\" must look like http://HOST:PORT",
            ),
            (
                &["--store", "etcd", "--etcd-endpoints", "http://a:1,"][..],
                "--etcd-endpoints an empty endpoint",
            ),
            (
                &["--store", "etcd", "--etcd-endpoints", "https://a:1"][..],
                "--etcd-endpoints \"https://a:1\": TLS to etcd is not supported yet",
            ),
            (
                &[
                    "--store",
                    "etcd",
                    "--etcd-endpoints",
                    "http://a:1",
                    "--etcd-prefix",
                    "g/",
                ][..],
                "--etcd-prefix must start with / and not end with /",
            ),
            (
                &[
                    "--store",
                    "etcd",
                    "--etcd-endpoints",
                    "http://a:1",
                    "--etcd-lease-ttl",
                    "1s",
                ][..],
                "--etcd-lease-ttl must be whole seconds, 2s-60s, got 1s",
            ),
        ] {
            let e = parse(flags)
                .unwrap()
                .store_choice()
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{flags:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn connection_flags_are_read_and_checked() {
        let c = parse(&[
            "--shutdown-timeout",
            "2s",
            "--http-header-timeout",
            "5s",
            "--http-idle-timeout",
            "1m",
            "--http-body-timeout",
            "3s",
            "--http-max-connections",
            "100",
            "--grpc-max-connections",
            "auto",
            "--grpc-handshake-timeout",
            "500ms",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(c.shutdown_timeout, Duration::from_secs(2));
        assert_eq!(c.connections.http_header_timeout, Duration::from_secs(5));
        assert_eq!(c.connections.http_idle_timeout, Duration::from_secs(60));
        assert_eq!(c.connections.http_body_timeout, Duration::from_secs(3));
        assert_eq!(c.connections.http_max, Some(100));
        assert_eq!(c.connections.grpc_max, None);
        assert_eq!(
            c.connections.grpc_handshake_timeout,
            Duration::from_millis(500)
        );

        for bad in ["0", "lots", "1000001", "1.5"] {
            let e = parse(&["--http-max-connections", bad])
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains("--http-max-connections") && e.contains("must be auto or 1-1000000"),
                "{bad}: {e}"
            );
        }
        let e = parse(&["--shutdown-timeout", "0s", "--http-idle-timeout", "2h"])
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--shutdown-timeout must be 100ms-10m, got 0ms"),
            "{e}"
        );
        assert!(
            e.contains("--http-idle-timeout must be 100ms-60m, got 120m"),
            "{e}"
        );
    }
}
