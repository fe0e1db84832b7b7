//! gangway's fuzz harness, on stable Rust: every parser of outside input driven in process with
//! random bytes and with structure-aware mutations of valid inputs (docs/fuzz.md).
//!
//! Targets ([`Target`]): the REST router, the Nacos HTTP routes, the Nacos gRPC payloads and
//! the native session protocol (both through the gRPC router the server serves, without
//! sockets), and the CLI's argument parsers. Per input the harness checks: no panic (in the
//! handler or in any task it spawned); the answer is a success or the one error shape of its
//! protocol; and a rejected input left the registry as it was (a digest of every service's
//! revision, instances with their leases, settings and subscribers, before and after).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let report = gangway_fuzz::run(gangway_fuzz::Target::Cli, &gangway_fuzz::Options::default()).await?;
//! assert!(report.failures.is_empty());
//! # Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_server::Registry;
use gangway_server::config::Config;

pub mod mutate;
pub mod targets;

pub use mutate::Gen;

/// A parser family under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// REST `/v1/` routes: JSON bodies, query strings, path segments.
    Rest,
    /// Nacos v1/v3 HTTP routes: forms and query strings.
    NacosHttp,
    /// Nacos gRPC: `Payload` protobuf and the JSON body of each request type.
    NacosGrpc,
    /// Native gRPC session: `ClientMessage` protobuf fed to the session handler.
    Native,
    /// CLI parsers: `--meta`, instance and server addresses, names, weights, ports, durations.
    Cli,
}

impl Target {
    /// Every target, in run order.
    pub const ALL: [Target; 5] = [
        Target::Rest,
        Target::NacosHttp,
        Target::NacosGrpc,
        Target::Native,
        Target::Cli,
    ];

    /// The name used on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Target::Rest => "rest",
            Target::NacosHttp => "nacos-http",
            Target::NacosGrpc => "nacos-grpc",
            Target::Native => "native",
            Target::Cli => "cli",
        }
    }
}

/// How long and how a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Inputs to run per target.
    pub inputs: u64,
    /// Stop a target after this long even if `inputs` were not all run (`None`: no limit).
    pub time_limit: Option<Duration>,
    /// Seed of the random source; a run is reproducible from it.
    pub seed: u64,
    /// A fresh registry every this many inputs (keeps state small, and leases far from expiry).
    pub reset_every: u64,
    /// Where failing inputs are written.
    pub out_dir: PathBuf,
    /// Stop a target after this many failures.
    pub max_failures: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            inputs: 10_000,
            time_limit: None,
            seed: 1,
            reset_every: 2_000,
            out_dir: PathBuf::from("target/fuzz-failures"),
            max_failures: 10,
        }
    }
}

/// One broken invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Index of the input in the run.
    pub index: u64,
    /// What broke.
    pub reason: String,
    /// The input, as a readable description.
    pub input: String,
    /// File the input was saved to.
    pub saved: Option<PathBuf>,
}

/// The figures of one target's run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The target.
    pub target: Target,
    /// Inputs run.
    pub inputs: u64,
    /// Inputs the parser refused (error answers).
    pub rejections: u64,
    /// Inputs that were answered too slowly and made the harness start a fresh registry
    /// (drains and waits that wait on acks).
    pub timeouts: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Broken invariants.
    pub failures: Vec<Failure>,
}

impl Report {
    /// Inputs per second.
    pub fn rate(&self) -> f64 {
        self.inputs as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What one input did.
#[derive(Debug)]
pub enum Outcome {
    /// Accepted.
    Accepted,
    /// Refused with a well-formed error; the registry must be unchanged.
    Rejected,
    /// No answer in time: the registry is replaced (state unknown, not checked).
    TimedOut,
    /// An invariant broke.
    Broken(String),
}

/// One input with what it was, for the failure file.
pub struct Case {
    /// Readable description (method, path, query, body as text).
    pub description: String,
    /// The raw bytes that were fed (a body, a protobuf message), saved next to the description.
    pub raw: Vec<u8>,
}

static PANICS: AtomicU64 = AtomicU64::new(0);
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Replaces the panic hook with one that counts panics (in any thread or task) and keeps the
/// last message, so a panic in a task the handler spawned is seen too.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        let location = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = format!("{payload}{location}");
    }));
}

/// Panics seen so far.
pub fn panics() -> u64 {
    PANICS.load(Ordering::SeqCst)
}

/// The message of the last panic.
pub fn last_panic() -> String {
    LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Longest a registry lives before the harness replaces it. Persistent instances are probed by
/// the registry (TCP connect or HTTP GET to the instance's address), and the fuzzed addresses are
/// anything: a registry closed before its first probe can fire (one probe interval after the
/// registration, at least 100 ms) never connects anywhere. Closing aborts every probe task.
pub const MAX_REGISTRY_LIFE: Duration = Duration::from_millis(50);

/// Longest wait for one answer before the registry is replaced (drains and waits on acks);
/// with [`MAX_REGISTRY_LIFE`] it keeps every registry's life under the shortest probe interval.
pub const ANSWER_TIMEOUT: Duration = Duration::from_millis(40);

/// Closes a registry the harness is done with (its probes stop at once).
pub async fn retire(registry: &Registry) {
    registry
        .close(tokio::time::Instant::now() + Duration::from_secs(1))
        .await;
}

/// The registry configuration of a run: no warm-up, leases far longer than a registry lives.
pub fn config() -> Config {
    let mut config = Config::for_tests();
    config.drain_timeout = Duration::from_millis(50);
    config
}

/// A fresh in-memory registry.
pub fn registry() -> (Registry, prometheus_client::registry::Registry) {
    let mut prom = prometheus_client::registry::Registry::default();
    let metrics = gangway_server::metrics::Metrics::register(&mut prom);
    let registry = Registry::start(
        Arc::new(gangway_store::MemoryStore::default()),
        config(),
        metrics,
    )
    .expect("an in-memory registry starts");
    (registry, prom)
}

/// Everything a refused request could have changed: each service's revision, its instances with
/// their liveness and owner, its settings and its subscribers (without their delivery progress).
pub fn digest(registry: &Registry) -> String {
    let mut services = registry.services(None, None);
    services.sort_by(|a, b| a.key.cmp(&b.key));
    services
        .into_iter()
        .map(|s| {
            let (revision, mut entries) = registry.entries(&s.key);
            entries.sort_by(|a, b| a.instance.key.cmp(&b.instance.key));
            let settings = registry.settings(&s.key).ok();
            // Who subscribes, not how far their pushes got: delivery runs in its own tasks and
            // moves on while the next request is handled.
            let mut subscribers: Vec<_> = registry
                .subscribers(&s.key)
                .into_iter()
                .map(|r| {
                    (
                        r.id,
                        r.address,
                        r.kind,
                        r.client_name,
                        r.ignores_empty_lists,
                    )
                })
                .collect();
            subscribers.sort_by(|a, b| a.0.cmp(&b.0));
            format!(
                "{} r{revision} {entries:?} {settings:?} {subscribers:?}\n",
                s.key
            )
        })
        .collect()
}

/// Runs `target` for `options.inputs` inputs (or its time limit).
///
/// Errors: the failure directory cannot be written.
pub async fn run(target: Target, options: &Options) -> anyhow::Result<Report> {
    match target {
        Target::Rest => targets::rest::run(options, false).await,
        Target::NacosHttp => targets::rest::run(options, true).await,
        Target::NacosGrpc => targets::grpc::run_nacos(options).await,
        Target::Native => targets::grpc::run_native(options).await,
        Target::Cli => Ok(targets::cli::run(options)),
    }
}

/// Drives one target's loop: calls `step` per input, checks for panics, counts, saves failures.
pub(crate) struct Runner<'a> {
    options: &'a Options,
    target: Target,
    started: Instant,
    report: Report,
}

impl<'a> Runner<'a> {
    pub(crate) fn new(target: Target, options: &'a Options) -> Self {
        Self {
            options,
            target,
            started: Instant::now(),
            report: Report {
                target,
                inputs: 0,
                rejections: 0,
                timeouts: 0,
                elapsed: Duration::ZERO,
                failures: Vec::new(),
            },
        }
    }

    /// Whether another input should run.
    pub(crate) fn more(&self) -> bool {
        self.report.inputs < self.options.inputs
            && self.report.failures.len() < self.options.max_failures
            && self
                .options
                .time_limit
                .is_none_or(|l| self.started.elapsed() < l)
    }

    /// Whether a registry born at `born` is due for replacement before the next input: every
    /// [`Options::reset_every`] inputs, and always after [`MAX_REGISTRY_LIFE`].
    pub(crate) fn reset_due(&self, born: Instant) -> bool {
        self.report.inputs % self.options.reset_every.max(1) == 0
            || born.elapsed() >= MAX_REGISTRY_LIFE
    }

    /// Records one input's outcome; `panics_before` is [`panics`] before it ran.
    pub(crate) fn record(&mut self, case: &Case, outcome: Outcome, panics_before: u64) {
        let index = self.report.inputs;
        self.report.inputs += 1;
        let reason = if panics() != panics_before {
            Some(format!("panic: {}", last_panic()))
        } else {
            match outcome {
                Outcome::Accepted => None,
                Outcome::Rejected => {
                    self.report.rejections += 1;
                    None
                }
                Outcome::TimedOut => {
                    self.report.timeouts += 1;
                    None
                }
                Outcome::Broken(reason) => Some(reason),
            }
        };
        if let Some(reason) = reason {
            let saved = self.save(index, &reason, case);
            self.report.failures.push(Failure {
                index,
                reason,
                input: case.description.clone(),
                saved,
            });
        }
    }

    fn save(&self, index: u64, reason: &str, case: &Case) -> Option<PathBuf> {
        let dir = &self.options.out_dir;
        std::fs::create_dir_all(dir).ok()?;
        let stem = format!("{}-seed{}-{index}", self.target.name(), self.options.seed);
        let text = dir.join(format!("{stem}.txt"));
        std::fs::write(
            &text,
            format!(
                "target: {}\nreason: {reason}\n\n{}\n",
                self.target.name(),
                case.description
            ),
        )
        .ok()?;
        std::fs::write(dir.join(format!("{stem}.bin")), &case.raw).ok()?;
        Some(text)
    }

    pub(crate) fn finish(mut self) -> Report {
        self.report.elapsed = self.started.elapsed();
        self.report
    }
}
