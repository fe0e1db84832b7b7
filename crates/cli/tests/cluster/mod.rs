//! Real processes for end-to-end tests: the `gangway` binary as registry server, demo-services
//! and demo-client, on 127.0.0.1 with ephemeral ports. Every child is killed on drop.

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};
use tokio::time::Instant;

/// Path of the binary under test.
pub const GANGWAY: &str = env!("CARGO_BIN_EXE_gangway");

/// The binary the processes run: `GANGWAY_TEST_BIN` when set (a copy, for a target directory
/// shared with other builds that may replace `target/debug/gangway` meanwhile), else
/// [`GANGWAY`].
pub fn gangway_bin() -> String {
    std::env::var("GANGWAY_TEST_BIN").unwrap_or_else(|_| GANGWAY.to_owned())
}

/// Longest wait for a process to print a line we expect.
pub const STARTUP: Duration = Duration::from_secs(20);

/// Environment variables every process spawned from now on (in this test process) gets, e.g.
/// `GANGWAY_RANDOM_START=0`.
pub static CHILD_ENV: Mutex<Vec<(&'static str, &'static str)>> = Mutex::new(Vec::new());

/// A child process with its stdout read line by line.
pub struct Proc {
    pub child: Child,
    pub stdout: Lines<BufReader<ChildStdout>>,
    pub stderr: Option<Lines<BufReader<ChildStderr>>>,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
        let mut command = Command::new(gangway_bin());
        command.args(args);
        Self::spawn_command(command)
    }

    /// Spawns `gangway` with its open-file limit (soft and hard) lowered to `limit` first.
    pub fn spawn_with_fd_limit(limit: u64, args: &[&str]) -> Proc {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
            .arg(gangway_bin())
            .args(args);
        Self::spawn_command(command)
    }

    fn spawn_command(mut command: Command) -> Proc {
        command.envs(CHILD_ENV.lock().unwrap().iter().copied());
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn gangway");
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let stderr = Some(BufReader::new(child.stderr.take().unwrap()).lines());
        Proc {
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id().expect("running") as i32)
    }

    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).expect("kill");
    }

    /// Reads stdout until a line starts with `prefix`; returns that line.
    pub async fn line_starting(&mut self, prefix: &str) -> String {
        let found = tokio::time::timeout(STARTUP, async {
            while let Some(line) = self.stdout.next_line().await.expect("read stdout") {
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            other => panic!("no line starting with {prefix:?} (got {other:?})"),
        }
    }

    /// Reads stderr until a line starts with `prefix`.
    pub async fn stderr_line_starting(&mut self, prefix: &str) -> String {
        self.stderr_line(&format!("starting with {prefix:?}"), |l| {
            l.starts_with(prefix)
        })
        .await
    }

    /// Reads stderr until a line contains `needle`.
    pub async fn stderr_line_containing(&mut self, needle: &str) -> String {
        self.stderr_line(&format!("with {needle:?}"), |l| l.contains(needle))
            .await
    }

    /// Reads stderr, for at most [`STARTUP`], until a line `matches`; panics naming `what`.
    async fn stderr_line(&mut self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let lines = self.stderr.as_mut().expect("stderr piped");
        let found = tokio::time::timeout(STARTUP, async {
            while let Some(line) = lines.next_line().await.expect("read stderr") {
                if matches(&line) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            other => panic!("no stderr line {what} (got {other:?})"),
        }
    }

    /// Drains stderr in the background so the child never blocks on a full pipe.
    pub fn forward_stderr(&mut self, tag: &'static str) {
        if let Some(mut lines) = self.stderr.take() {
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{tag}] {line}");
                }
            });
        }
    }

    /// Forwards stderr as [`Proc::forward_stderr`] does, and keeps every line.
    pub fn keep_stderr(&mut self, tag: &'static str) -> Arc<Mutex<Vec<String>>> {
        let kept = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut lines) = self.stderr.take() {
            let kept = kept.clone();
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{tag}] {line}");
                    kept.lock().unwrap().push(line);
                }
            });
        }
        kept
    }

    /// Everything left on stdout, once the process exits (bounded by `timeout`).
    pub async fn rest_of_stdout(&mut self, timeout: Duration) -> String {
        let mut out = String::new();
        let read = async {
            while let Ok(Some(line)) = self.stdout.next_line().await {
                out.push_str(&line);
                out.push('\n');
            }
        };
        tokio::time::timeout(timeout, read)
            .await
            .expect("process output ended in time");
        out
    }

    pub async fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .expect("exited in time")
            .expect("wait")
    }
}

/// Runs the real binary with `--server server` and `args`, in a clean environment for its own
/// variables; its output once it exited.
pub async fn gangway(server: &str, args: &[&str]) -> std::process::Output {
    Command::new(GANGWAY)
        .arg("--server")
        .arg(server)
        .args(args)
        .env_remove("GANGWAY_SERVER")
        .env_remove("GANGWAY_NAMESPACE")
        .env_remove("GANGWAY_GROUP")
        .env_remove("RUST_LOG")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run gangway")
}

/// Starts `gangway demo-client --registry registry --service demo --rate rate --duration
/// duration --min-instances min_instances --json` plus `extra`; returns once it sends (its
/// `sending N requests` line, where N is `rate` x `duration`), its stderr forwarded.
pub async fn demo_client(
    registry: &str,
    rate: u32,
    duration: Duration,
    min_instances: usize,
    extra: &[&str],
) -> Proc {
    let (rate_text, duration_text) = (rate.to_string(), format!("{}ms", duration.as_millis()));
    let min_text = min_instances.to_string();
    let mut args = vec![
        "demo-client",
        "--registry",
        registry,
        "--service",
        "demo",
        "--rate",
        &rate_text,
        "--duration",
        &duration_text,
        "--min-instances",
        &min_text,
        "--json",
    ];
    args.extend_from_slice(extra);
    let mut client = Proc::spawn(&args);
    let requests = (f64::from(rate) * duration.as_secs_f64()).round();
    client
        .stderr_line_starting(&format!("sending {requests} requests"))
        .await;
    client.forward_stderr("demo-client");
    client
}

/// A registry server process and its addresses.
pub struct Server {
    pub proc: Proc,
    pub http: String,
    pub grpc: String,
}

fn addr_field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .to_owned()
}

impl Server {
    /// Starts `gangway server` on the given addresses (use `127.0.0.1:0` for fresh ports).
    pub async fn start(data_dir: &Path, http: &str, grpc: &str, extra: &[&str]) -> Server {
        let mut server = Self::spawn(data_dir, http, grpc, extra, None).await;
        server.proc.forward_stderr("server");
        server
    }

    /// Starts `gangway server` on fresh ports and keeps every line of its stderr (the log).
    pub async fn start_logged(
        data_dir: &Path,
        extra: &[&str],
    ) -> (Server, Arc<Mutex<Vec<String>>>) {
        let mut server = Self::spawn(data_dir, "127.0.0.1:0", "127.0.0.1:0", extra, None).await;
        let log = server.proc.keep_stderr("server");
        (server, log)
    }

    /// Starts `gangway server` on the given addresses and keeps every line of its stderr (the
    /// log), forwarded with `tag` (e.g. the node's name in a cluster test).
    pub async fn start_tagged(
        data_dir: &Path,
        http: &str,
        grpc: &str,
        extra: &[&str],
        tag: &'static str,
    ) -> (Server, Arc<Mutex<Vec<String>>>) {
        let mut server = Self::spawn(data_dir, http, grpc, extra, None).await;
        let log = server.proc.keep_stderr(tag);
        (server, log)
    }

    /// Starts `gangway server` with fresh ports and its open-file limit lowered to `fd_limit`;
    /// its stderr is left to the caller.
    pub async fn start_with_fd_limit(data_dir: &Path, fd_limit: u64, extra: &[&str]) -> Server {
        Self::spawn(
            data_dir,
            "127.0.0.1:0",
            "127.0.0.1:0",
            extra,
            Some(fd_limit),
        )
        .await
    }

    async fn spawn(
        data_dir: &Path,
        http: &str,
        grpc: &str,
        extra: &[&str],
        fd_limit: Option<u64>,
    ) -> Server {
        let mut args = vec!["server", "--http", http, "--grpc", grpc];
        if !extra.contains(&"--log") {
            args.extend(["--log", "warn"]);
        }
        let dir = data_dir.to_str().unwrap().to_owned();
        args.extend(["--data-dir", &dir]);
        args.extend_from_slice(extra);
        let mut proc = match fd_limit {
            Some(limit) => Proc::spawn_with_fd_limit(limit, &args),
            None => Proc::spawn(&args),
        };
        let line = match tokio::time::timeout(STARTUP, proc.stdout.next_line()).await {
            Ok(Ok(Some(line))) if line.starts_with("gangway server") => line,
            other => {
                // Exited (or said something else) before its start line: show its stderr.
                let _ = proc.child.start_kill();
                let mut stderr = String::new();
                if let Some(lines) = proc.stderr.as_mut() {
                    let read = async {
                        while let Ok(Some(l)) = lines.next_line().await {
                            stderr.push_str(&l);
                            stderr.push('\n');
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
                }
                panic!("gangway server {args:?} gave no start line ({other:?}); stderr:\n{stderr}");
            }
        };
        Server {
            http: addr_field(&line, "http"),
            grpc: addr_field(&line, "grpc"),
            proc,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    pub async fn get(&self, path: &str) -> Value {
        reqwest::get(self.url(path))
            .await
            .expect("GET")
            .json()
            .await
            .expect("JSON")
    }
}

/// A demo-service process.
pub struct DemoService {
    pub proc: Proc,
    pub addr: String,
}

impl DemoService {
    pub async fn start(registry: &str, name: &str) -> DemoService {
        Self::start_with(registry, name, &[]).await
    }

    pub async fn start_with(registry: &str, name: &str, flags: &[&str]) -> DemoService {
        let mut args = vec![
            "demo-service",
            "--registry",
            registry,
            "--service",
            "demo",
            "--name",
            name,
        ];
        args.extend_from_slice(flags);
        let mut proc = Proc::spawn(&args);
        let line = proc.line_starting("ready ").await;
        proc.forward_stderr("demo-service");
        DemoService {
            addr: addr_field(&line, "addr"),
            proc,
        }
    }
}

/// Runs `gangway auth --file FILE ARGS` (standard input: `stdin`); returns its stdout.
pub fn gangway_auth(file: &Path, args: &[&str], stdin: &str) -> String {
    let mut child = std::process::Command::new(GANGWAY)
        .args(["auth", "--file", file.to_str().unwrap()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gangway auth");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("gangway auth");
    assert!(
        out.status.success(),
        "gangway auth {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// POSTs `body` as JSON to `url`; returns the status.
pub async fn post_status(http: &reqwest::Client, url: &str, body: &Value) -> u16 {
    http.post(url)
        .json(body)
        .send()
        .await
        .expect("POST")
        .status()
        .as_u16()
}

/// Polling with a deadline (not every test file polls).
#[allow(unused_imports)]
pub use gangway_testkit::poll;

/// Addresses in a listing answer.
pub fn addresses(listing: &Value) -> Vec<String> {
    listing["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| format!("{}:{}", i["ip"].as_str().unwrap_or(""), i["port"]))
                .collect()
        })
        .unwrap_or_default()
}

/// A registry, three demo-services (`a`, `b`, `c`) and a demo-client at 60 req/s for 8 s.
pub struct Run {
    pub server: Server,
    pub services: Vec<DemoService>,
    pub client: Proc,
    /// When the client started sending.
    pub started: Instant,
    pub data: tempfile::TempDir,
}

impl Run {
    /// Starts everything; returns once the client sends. `first_flags` go to demo-service `a` only,
    /// `client_flags` to the demo-client.
    pub async fn setup(server_flags: &[&str], first_flags: &[&str], client_flags: &[&str]) -> Run {
        let data = tempfile::tempdir().unwrap();
        let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", server_flags).await;
        let mut services = Vec::new();
        for name in ["a", "b", "c"] {
            let flags = if name == "a" { first_flags } else { &[] };
            services.push(DemoService::start_with(&server.grpc, name, flags).await);
        }
        let client = demo_client(&server.grpc, 60, Duration::from_secs(8), 3, client_flags).await;
        let started = Instant::now();
        Run {
            server,
            services,
            client,
            started,
            data,
        }
    }

    /// Waits for the client's JSON summary (exit 0 when nothing failed, 1 otherwise).
    pub async fn finish(&mut self) -> Value {
        let run = self;
        let out = run.client.rest_of_stdout(Duration::from_secs(30)).await;
        let status = run.client.wait(Duration::from_secs(5)).await;
        let report: Value = serde_json::from_str(out.trim()).expect("demo-client JSON summary");
        // demo-client exits 1 when some request failed, 0 when none did.
        let expected = if report["failed"] == 0 { 0 } else { 1 };
        assert_eq!(status.code(), Some(expected), "demo-client exit status");
        report
    }
}
