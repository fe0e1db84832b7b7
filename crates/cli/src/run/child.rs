//! The wrapped program: started in a process group of its own (so a terminal's Ctrl-C reaches
//! the wrapper only, and the wrapper decides when the program stops), signalled as a group, and
//! stopped with SIGTERM, then SIGKILL after a grace period.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

/// How the child ended when the wrapper stopped it.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// Its exit status.
    pub status: ExitStatus,
    /// Whether it needed the SIGKILL (it outlived the grace period).
    pub killed: bool,
}

/// A running child and its process group.
#[derive(Debug)]
pub struct Child {
    inner: tokio::process::Child,
    pid: i32,
}

impl Child {
    /// Starts `argv` (program and arguments, found on `PATH`) with the wrapper's stdin, stdout,
    /// stderr and environment, as the leader of a new process group.
    ///
    /// # Errors
    /// An empty `argv`, or a program that cannot be started.
    pub fn spawn(argv: &[String]) -> anyhow::Result<Self> {
        let (program, args) = argv.split_first().context("no command given after --")?;
        let inner = Command::new(program)
            .args(args)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {program:?}"))?;
        let pid = inner
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .context("the child has no pid")?;
        Ok(Self { inner, pid })
    }

    /// Its process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Waits for the exit. Cancellation safe; after the exit it returns the same status again.
    ///
    /// # Errors
    /// The wait itself failed (the OS refused).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.inner.wait().await
    }

    /// Sends `signal` to the child's whole process group. A group that is gone already is fine.
    pub fn signal(&self, signal: Signal) {
        let _ = killpg(Pid::from_raw(self.pid), signal);
    }

    /// SIGTERM to the group, then SIGKILL to it after `grace` if the child still runs.
    ///
    /// # Errors
    /// Waiting failed.
    pub async fn stop(&mut self, grace: Duration) -> std::io::Result<Stopped> {
        if let Some(status) = self.inner.try_wait()? {
            return Ok(Stopped {
                status,
                killed: false,
            });
        }
        self.signal(Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(grace, self.inner.wait()).await {
            return Ok(Stopped {
                status: status?,
                killed: false,
            });
        }
        self.signal(Signal::SIGKILL);
        Ok(Stopped {
            status: self.inner.wait().await?,
            killed: true,
        })
    }
}

/// The exit code that passes `status` on: the child's own code, or 128 + the signal that
/// ended it (the shell's convention).
pub fn exit_code(status: &ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from((128 + signal) & 0xff).unwrap_or(1),
        (None, None) => 1,
    }
}
