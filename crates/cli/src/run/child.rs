//! The wrapped program and the `--on-drain` hook: each started in a process group of its own (so
//! a terminal's Ctrl-C reaches the wrapper only, and the wrapper decides when they stop),
//! signalled as a group (what they started goes too), and stopped with SIGTERM, then SIGKILL
//! after a grace period.
//!
//! On Linux each also gets **PR_SET_PDEATHSIG = SIGKILL** between fork and exec: if the wrapper
//! dies without stopping it (SIGKILL, OOM kill, a crash), the kernel kills the process at once,
//! as it kills a container's processes with the container. The signal reaches the direct child
//! only, not what it started (in a container the PID namespace covers those). The kernel sends
//! it when the *thread* that forked ends, so children are spawned from the wrapper's main thread
//! (the future `block_on` drives), which lives as long as the process.

use std::process::ExitStatus;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

/// The signal a child gets from the kernel when the wrapper dies (Linux): SIGKILL.
pub const PARENT_DEATH_SIGNAL: Signal = Signal::SIGKILL;

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
    /// stderr and environment, as the leader of a new process group, killed by the kernel if
    /// the wrapper dies first ([`PARENT_DEATH_SIGNAL`], Linux). Call it from the main thread
    /// (see the [module docs](self)).
    ///
    /// # Errors
    /// An empty `argv`, or a program that cannot be started.
    pub fn spawn(argv: &[String]) -> anyhow::Result<Self> {
        let (program, args) = argv.split_first().context("no command given after --")?;
        let mut command = Command::new(program);
        command.args(args).process_group(0).kill_on_drop(true);
        die_with_parent(&mut command);
        let inner = command
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

    /// SIGKILL to the group; waits for the child.
    ///
    /// # Errors
    /// Waiting failed.
    pub async fn kill(&mut self) -> std::io::Result<ExitStatus> {
        self.signal(Signal::SIGKILL);
        self.inner.wait().await
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

/// Makes the process `command` starts die with the wrapper: PR_SET_PDEATHSIG between fork and
/// exec, and a check that the wrapper did not die before that (the child would then be an
/// orphan already, and is not started).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: it makes two system calls (prctl, getppid) through nix, which
    // allocate nothing and take no lock, and builds an io::Error from a plain errno value.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(PARENT_DEATH_SIGNAL)?;
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere the child outlives a wrapper that was killed (no parent-death signal).
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

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
