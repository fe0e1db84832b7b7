//! Child processes: `gangway demo-service` instances (and `gangway server` for the registry
//! restart), their machine-readable stdout lines, and signals.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader, Lines};
use tokio::process::{Child, Command};

/// How long a child may take to print its first line.
pub const STARTUP: Duration = Duration::from_secs(15);

/// The stream a [`Proc`]'s lines are read from.
type Output = Box<dyn AsyncRead + Unpin + Send>;

/// A child `gangway` process whose stdout (or stderr) is read line by line. Killed (SIGKILL) on
/// drop.
pub struct Proc {
    child: Child,
    lines: Lines<BufReader<Output>>,
    pid: i32,
}

impl Proc {
    /// Starts `exe args...` with stdout piped, stderr discarded, stdin closed.
    ///
    /// # Errors
    /// The executable cannot be started.
    pub fn spawn(exe: &Path, args: &[String]) -> anyhow::Result<Self> {
        Self::start(exe, args, false)
    }

    /// Starts `exe args...` with **stderr** piped (where `gangway run` logs its steps without
    /// `--json`) and stdout discarded, stdin closed.
    ///
    /// # Errors
    /// The executable cannot be started.
    pub fn spawn_stderr(exe: &Path, args: &[String]) -> anyhow::Result<Self> {
        Self::start(exe, args, true)
    }

    fn start(exe: &Path, args: &[String], stderr: bool) -> anyhow::Result<Self> {
        let (out, err) = if stderr {
            (Stdio::null(), Stdio::piped())
        } else {
            (Stdio::piped(), Stdio::null())
        };
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let output: Output = if stderr {
            Box::new(child.stderr.take().context("child stderr")?)
        } else {
            Box::new(child.stdout.take().context("child stdout")?)
        };
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        Ok(Self {
            child,
            lines: BufReader::new(output).lines(),
            pid,
        })
    }

    /// Process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Reads stdout until a line starts with `prefix` (bounded by `timeout`); returns the rest
    /// of that line.
    ///
    /// # Errors
    /// Timeout, or stdout ended first.
    pub async fn line(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let lines = &mut self.lines;
        let found = tokio::time::timeout(timeout, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Ok::<_, std::io::Error>(Some(rest.to_owned()));
                }
            }
            Ok(None)
        })
        .await;
        match found {
            Ok(Ok(Some(rest))) => Ok(rest),
            Ok(Ok(None)) => anyhow::bail!("process {} ended before printing {prefix:?}", self.pid),
            Ok(Err(e)) => Err(e).context("read child stdout"),
            Err(_) => anyhow::bail!(
                "process {} printed no {prefix:?} within {timeout:?}",
                self.pid
            ),
        }
    }

    /// Sends `sig`.
    ///
    /// # Errors
    /// The process is gone (and reaped).
    pub fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig)
            .with_context(|| format!("kill -{sig} {}", self.pid))
    }

    /// Waits for the exit (bounded by `timeout`); `None` on timeout.
    pub async fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// SIGKILL (a stopped process dies too) and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.wait(Duration::from_secs(5)).await;
    }
}

/// The value of `key=value` in a line of `key=value` fields.
pub fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
}
