//! What the rollout and cold-start suites share: a registry in this process, a consumer of it,
//! and instances of three kinds (a classic lease-kept `demo-service`, a session-kept one, and a
//! `demo-service --no-register` wrapped in `gangway run`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gangway_client::http::{HttpClient, HttpConfig};
use gangway_client::retry::RetryConfig;
use gangway_client::{Client, ClientConfig, Subscription};
use gangway_core::View;
use gangway_core::model::ServiceKey;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::process::{Proc, STARTUP, field};
use crate::scenario::{Mode, Params, SERVICE};

/// A gangway registry the lab runs in this process on free loopback ports (not the engine's
/// [`gangway_server::Registry`]: this one owns the running server and its addresses).
pub struct LabRegistry {
    server: gangway_server::RunningServer,
    /// Its REST address.
    pub http: SocketAddr,
    /// Its gRPC address.
    pub grpc: SocketAddr,
}

/// A consumer of [`SERVICE`]: the HTTP client it routes with and the view it routes by.
pub struct Consumer {
    /// Routes `http://lab/...` through the view.
    pub http: HttpClient,
    /// The consumer's view (pushed, or polled every R in classic mode).
    pub views: watch::Receiver<Arc<View>>,
    session: Option<(Client, Subscription)>,
    poller: Option<(JoinHandle<()>, watch::Sender<Option<tokio::time::Instant>>)>,
}

/// How an instance is kept in the registry.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `demo-service --lease-ttl`: REST registration, heartbeats every TTL/3.
    Classic {
        /// The lease TTL.
        ttl: Duration,
    },
    /// `demo-service`: registers itself on a session at start, drains on SIGTERM.
    Session,
    /// `gangway run -- demo-service --no-register`: ready-gated, ack readiness, ack drain.
    Wrapped {
        /// `--ready`: `None` is `tcp`, `Some(path)` is `http://127.0.0.1:PORT{path}`.
        ready_path: Option<&'static str>,
        /// `--warmup`.
        warmup: Option<Duration>,
    },
}

/// One running instance.
pub struct Instance {
    proc: Proc,
    /// Its address, `127.0.0.1:PORT`.
    pub addr: String,
    /// The wrapped program's pid (its own process group), for [`Kind::Wrapped`].
    child_pid: Option<i32>,
}

impl LabRegistry {
    /// Starts one for `mode` (classic: lease TTL as the mode says, delete after 2 x TTL).
    ///
    /// # Errors
    /// The registry does not start.
    pub async fn start(mode: Mode, params: &Params) -> anyhow::Result<Self> {
        let mut config = gangway_server::Config::for_tests();
        config.liveness.keepalive_interval = params.keepalive_interval;
        config.liveness.keepalive_timeout = params.keepalive_timeout;
        if let Mode::Classic { ttl, .. } = mode {
            config.liveness.lease_ttl = ttl;
            config.liveness.lease_delete_timeout = ttl * 2;
        }
        let server = gangway_server::start_in_memory(config)
            .await
            .context("start the registry")?;
        Ok(Self {
            http: server.http_addr,
            grpc: server.grpc_addr,
            server,
        })
    }

    /// Stops it.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

impl Consumer {
    /// A consumer as `mode` says (classic: polls every R; gangway: a subscription), without
    /// outlier ejection, with one retry if `retry`, attempts bounded by `params.timeout`.
    ///
    /// # Errors
    /// The registry is unreachable.
    pub async fn start(
        mode: Mode,
        registry: &LabRegistry,
        params: &Params,
        retry: bool,
    ) -> anyhow::Result<Self> {
        let retry = if retry {
            RetryConfig::default().with_max_attempts(2)
        } else {
            RetryConfig::disabled()
        };
        let config = HttpConfig::default()
            .with_retry(retry)
            .with_outlier(None)
            .with_attempt_timeout(params.timeout);
        let key = ServiceKey::named(SERVICE);
        match mode {
            Mode::Classic { refresh, .. } => {
                let (anchor, anchor_rx) = watch::channel(None);
                let (task, views) =
                    crate::classic::poller(registry.http, SERVICE, refresh, anchor_rx);
                let http = HttpClient::from_views(vec![(key, views.clone())], config)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(Self {
                    http,
                    views,
                    session: None,
                    poller: Some((task, anchor)),
                })
            }
            Mode::Gangway => {
                let client = Client::connect(
                    ClientConfig::new(registry.grpc.to_string()).with_client_name("lab-consumer"),
                )
                .await
                .context("consumer: connect to the registry")?;
                let subscription = client.subscribe(key).await.context("subscribe")?;
                let views = subscription.receiver();
                let http =
                    HttpClient::new(client.clone(), config).map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(Self {
                    http,
                    views,
                    session: Some((client, subscription)),
                    poller: None,
                })
            }
        }
    }

    /// Waits until the view holds `n` instances, then sends one request per instance so the
    /// connections are warm.
    ///
    /// # Errors
    /// Not within [`STARTUP`].
    pub async fn wait_for(&mut self, n: usize) -> anyhow::Result<()> {
        tokio::time::timeout(STARTUP, self.views.wait_for(|v| v.instances.len() >= n))
            .await
            .map_err(|_| anyhow::anyhow!("the consumer did not see {n} instances in {STARTUP:?}"))?
            .context("view channel closed")?;
        let url = format!("http://{SERVICE}/ping");
        futures::future::join_all((0..n).map(|_| self.http.get(&url))).await;
        Ok(())
    }

    /// Ends its session or poller.
    pub fn stop(self) {
        if let Some((client, _subscription)) = self.session {
            client.close();
        }
        if let Some((task, _)) = self.poller {
            task.abort();
        }
    }
}

/// A free port on 127.0.0.1 (bound and released: another process may take it meanwhile, which
/// the instance's start then reports).
///
/// # Errors
/// No port could be bound.
pub fn free_port() -> anyhow::Result<u16> {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(socket.local_addr()?.port())
}

impl Instance {
    /// Starts one of `kind` named `name` and waits for its readiness signal: the
    /// demo-service's `ready` line (registered), or for a wrapped one the wrapper's `ready`
    /// event (every subscriber acked its registration). `extra` goes to the demo-service.
    ///
    /// # Errors
    /// It does not start or never says ready within [`STARTUP`].
    pub async fn start(
        exe: &Path,
        kind: &Kind,
        registry: &LabRegistry,
        params: &Params,
        name: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let s = |v: &str| v.to_owned();
        let demo = |listen: &str| {
            let mut a = vec![
                s("demo-service"),
                s("--service"),
                s(SERVICE),
                s("--name"),
                s(name),
                s("--delay"),
                format!("{}ms", params.delay.as_millis()),
                s("--listen"),
                s(listen),
            ];
            a.extend(extra.iter().cloned());
            a
        };
        match kind {
            Kind::Classic { ttl } => {
                let mut args = demo("127.0.0.1:0");
                args.extend([
                    s("--lease-ttl"),
                    format!("{}ms", ttl.as_millis()),
                    s("--registry-http"),
                    registry.http.to_string(),
                ]);
                Self::demo_service(exe, &args).await
            }
            Kind::Session => {
                let mut args = demo("127.0.0.1:0");
                args.extend([
                    s("--registry"),
                    registry.grpc.to_string(),
                    s("--drain-timeout"),
                    format!("{}ms", params.drain_timeout.as_millis()),
                ]);
                Self::demo_service(exe, &args).await
            }
            Kind::Wrapped { ready_path, warmup } => {
                let port = free_port()?;
                let mut args = vec![
                    s("run"),
                    s("--json"),
                    s("--service"),
                    s(SERVICE),
                    s("--port"),
                    port.to_string(),
                    s("--registry"),
                    registry.grpc.to_string(),
                    s("--drain-timeout"),
                    format!("{}ms", params.drain_timeout.as_millis()),
                    s("--grace"),
                    s("5s"),
                    s("--ack-timeout"),
                    s("5s"),
                ];
                if let Some(path) = ready_path {
                    args.extend([s("--ready"), format!("http://127.0.0.1:{port}{path}")]);
                }
                if let Some(w) = warmup {
                    args.extend([s("--warmup"), format!("{}ms", w.as_millis())]);
                }
                args.push(s("--"));
                args.push(exe.display().to_string());
                args.extend(demo(&format!("127.0.0.1:{port}")));
                args.push(s("--no-register"));
                // `--json`: the steps are JSON lines on stdout (with the program's output).
                let mut proc = Proc::spawn(exe, &args)?;
                let started = proc.line("{\"event\":\"started\"", STARTUP).await?;
                let child_pid = json_field(&started, "pid")
                    .and_then(|p| p.as_i64())
                    .and_then(|p| i32::try_from(p).ok());
                let mut instance = Self {
                    proc,
                    addr: format!("127.0.0.1:{port}"),
                    child_pid,
                };
                // Never ready: the wrapped program is in a process group of its own, so it
                // would outlive the wrapper's kill-on-drop.
                if let Err(e) = instance.proc.line("{\"event\":\"ready\"", STARTUP).await {
                    instance.kill().await;
                    return Err(e);
                }
                Ok(instance)
            }
        }
    }

    async fn demo_service(exe: &Path, args: &[String]) -> anyhow::Result<Self> {
        let mut proc = Proc::spawn(exe, args)?;
        let ready = proc.line("ready ", STARTUP).await?;
        let addr = field(&ready, "addr").context("ready line without addr=")?;
        Ok(Self {
            proc,
            addr,
            child_pid: None,
        })
    }

    /// Sends `signal` to the instance's process (the wrapper, for a wrapped one).
    ///
    /// # Errors
    /// The process is gone.
    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        self.proc.signal(signal)
    }

    /// Waits for the exit, at most `timeout`; whether it exited.
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        self.proc.wait(timeout).await.is_some()
    }

    /// SIGKILL to it and, for a wrapped one, to the wrapped program's process group.
    pub async fn kill(&mut self) {
        self.proc.kill().await;
        if let Some(pid) = self.child_pid {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// The value of `key` in a JSON line (with whatever text surrounds the object: none).
fn json_field(rest_of_line: &str, key: &str) -> Option<serde_json::Value> {
    // `Proc::line` strips the matched prefix; put the object back together.
    let line = format!("{{\"event\":\"x\"{rest_of_line}");
    serde_json::from_str::<serde_json::Value>(&line)
        .ok()?
        .get(key)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields_are_read_from_the_rest_of_an_event_line() {
        let rest = ",\"elapsed_ms\":12.5,\"pid\":4242,\"command\":\"x y\"}";
        assert_eq!(json_field(rest, "pid"), Some(serde_json::json!(4242)));
        assert_eq!(json_field(rest, "nope"), None);
        assert_eq!(json_field("garbage", "pid"), None);
    }
}
