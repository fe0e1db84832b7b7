//! Real etcd members for cluster tests (feature `etcd`): Debian's `etcd-server` (etcd 3.4,
//! `/usr/bin/etcd`, or the binary named by `GANGWAY_ETCD`) on 127.0.0.1 with ephemeral ports and
//! data directories under one temporary directory.
//!
//! [`EtcdCluster::start`] starts 1 to 7 members, all at once (a member of a new cluster is
//! healthy only once a quorum is up), and returns once every member answers `/health` with
//! `{"health":"true"}`, or fails after [`START_DEADLINE`] with the tail of the member's log.
//! Members can be killed (`kill -9`), frozen (SIGSTOP), thawed (SIGCONT) and restarted on the
//! same ports and data directory, by PID. Dropping the cluster kills every member it started
//! (SIGKILL, then `wait`), and removes the data directories.
//!
//! The calls block (a few `std::net` requests and process calls): from an async test, call
//! them through `tokio::task::spawn_blocking` or accept the short block.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long [`EtcdCluster::start`] and [`EtcdCluster::restart`] wait for health: 20 s (a new
/// 3-member cluster on this machine is healthy in about 1 s).
pub const START_DEADLINE: Duration = Duration::from_secs(20);

/// Pause between two health looks: 20 ms.
pub const HEALTH_EVERY: Duration = Duration::from_millis(20);

/// One health request's connect and read timeout: 1 s.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// Raft heartbeat of the test members: 50 ms (etcd's default is 100 ms).
pub const HEARTBEAT_MS: u32 = 50;

/// Raft election timeout of the test members: 500 ms (etcd's default is 1 s), so a killed
/// leader is replaced within about a second.
pub const ELECTION_MS: u32 = 500;

/// Most members of one test cluster.
pub const MAX_MEMBERS: usize = 7;

/// Why a cluster could not start or a member not restart.
#[derive(Debug)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EtcdError {}

/// A running test cluster of etcd members; every member is killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    binary: PathBuf,
    // Last: the data directories go after the processes are killed.
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Member {
    name: String,
    client: SocketAddr,
    peer: SocketAddr,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl EtcdCluster {
    /// Starts `n` members (1..=[`MAX_MEMBERS`]) and waits until each is healthy.
    ///
    /// Errors: `n` out of range, no etcd binary, a member that exits or is not healthy within
    /// [`START_DEADLINE`] (the message holds the end of its log). Members already started are
    /// killed before the error returns.
    pub fn start(n: usize) -> Result<Self, EtcdError> {
        if !(1..=MAX_MEMBERS).contains(&n) {
            return Err(EtcdError(format!(
                "members must be 1-{MAX_MEMBERS}, got {n}"
            )));
        }
        let binary = binary()?;
        let dir = tempfile::tempdir().map_err(|e| EtcdError(format!("temp dir: {e}")))?;
        let ports = free_ports(2 * n)?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: SocketAddr::from(([127, 0, 0, 1], ports[2 * i])),
                peer: SocketAddr::from(([127, 0, 0, 1], ports[2 * i + 1])),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            token: format!("gangway-test-{}-{}", std::process::id(), ports[0]),
            binary,
            dir,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        let deadline = Instant::now() + START_DEADLINE;
        for i in 0..n {
            cluster.wait_healthy(i, deadline)?;
        }
        Ok(cluster)
    }

    /// Number of members (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Client URL of member `i`, `http://127.0.0.1:PORT`. Panics when `i` is out of range.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.members[i].client)
    }

    /// Client URLs of every member, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The temporary directory holding the members' data directories and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// PID of member `i`, `None` once it was killed (and not restarted).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// `kill -9` member `i` and reaps it. Nothing when it is not running.
    pub fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP member `i` (a frozen member: its sockets stay open, it answers nothing).
    pub fn freeze(&self, i: usize) {
        self.signal(i, Signal::SIGSTOP);
    }

    /// SIGCONT member `i` after [`freeze`](Self::freeze).
    pub fn thaw(&self, i: usize) {
        self.signal(i, Signal::SIGCONT);
    }

    /// Starts member `i` again on its ports and data directory (killing it first if it still
    /// runs), and waits until it is healthy.
    ///
    /// Errors: as [`start`](Self::start), for this member.
    pub fn restart(&mut self, i: usize) -> Result<(), EtcdError> {
        self.kill9(i);
        self.spawn(i)?;
        self.wait_healthy(i, Instant::now() + START_DEADLINE)
    }

    /// Starts every member again on its ports and data directory, all at once (killing those
    /// still running first), and waits until each is healthy: the way back after losing them
    /// all, since one member alone has no quorum and is never healthy (so
    /// [`restart`](Self::restart) of one member after another would wait in vain).
    ///
    /// Errors: as [`start`](Self::start), for the first member that fails.
    pub fn restart_all(&mut self) -> Result<(), EtcdError> {
        for i in 0..self.len() {
            self.kill9(i);
            self.spawn(i)?;
        }
        let deadline = Instant::now() + START_DEADLINE;
        for i in 0..self.len() {
            self.wait_healthy(i, deadline)?;
        }
        Ok(())
    }

    /// True when member `i` answers `/health` with `{"health":"true"}` within
    /// [`HEALTH_TIMEOUT`].
    pub fn is_healthy(&self, i: usize) -> bool {
        health(self.members[i].client)
    }

    /// The last `bytes` bytes of member `i`'s log (stdout and stderr).
    pub fn log_tail(&self, i: usize, bytes: usize) -> String {
        let text = std::fs::read(&self.members[i].log).unwrap_or_default();
        let from = text.len().saturating_sub(bytes);
        String::from_utf8_lossy(&text[from..]).into_owned()
    }

    fn signal(&self, i: usize, signal: Signal) {
        if let Some(pid) = self.pid(i) {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdError> {
        let m = &self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| EtcdError(format!("log {}: {e}", m.log.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| EtcdError(format!("log {}: {e}", m.log.display())))?;
        let client = format!("http://{}", m.client);
        let peer = format!("http://{}", m.peer);
        let child = Command::new(&self.binary)
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .arg(format!("--heartbeat-interval={HEARTBEAT_MS}"))
            .arg(format!("--election-timeout={ELECTION_MS}"))
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| EtcdError(format!("spawn {}: {e}", self.binary.display())))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self, i: usize, deadline: Instant) -> Result<(), EtcdError> {
        loop {
            if self.is_healthy(i) {
                return Ok(());
            }
            let exited = self.members[i]
                .child
                .as_mut()
                .map(|c| c.try_wait().ok().flatten());
            let why = match exited {
                None => Some("is not running".to_owned()),
                Some(Some(status)) => Some(format!("exited ({status})")),
                Some(None) if Instant::now() >= deadline => {
                    Some(format!("is not healthy after {START_DEADLINE:?}"))
                }
                Some(None) => None,
            };
            if let Some(why) = why {
                return Err(EtcdError(format!(
                    "etcd member {} ({}) {why}; its log ends:\n{}",
                    self.members[i].name,
                    self.endpoint(i),
                    self.log_tail(i, 2000)
                )));
            }
            std::thread::sleep(HEALTH_EVERY);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill9(i);
        }
    }
}

/// The etcd binary: `GANGWAY_ETCD`, else `/usr/bin/etcd`, else `etcd` on the `PATH`.
fn binary() -> Result<PathBuf, EtcdError> {
    if let Some(path) = std::env::var_os("GANGWAY_ETCD") {
        return Ok(PathBuf::from(path));
    }
    let debian = PathBuf::from("/usr/bin/etcd");
    if debian.exists() {
        return Ok(debian);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("etcd"))
                .find(|p| p.exists())
        })
        .ok_or_else(|| {
            EtcdError(
                "no etcd binary: install Debian's etcd-server (apt-get install etcd-server) or \
                 set GANGWAY_ETCD"
                    .into(),
            )
        })
}

/// `n` distinct free loopback ports: all bound at once, then released.
fn free_ports(n: usize) -> Result<Vec<u16>, EtcdError> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| EtcdError(format!("free port: {e}")))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| EtcdError(format!("free port: {e}")))
}

/// One `GET /health` over HTTP/1.0, bounded by [`HEALTH_TIMEOUT`] per step.
fn health(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, HEALTH_TIMEOUT) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(HEALTH_TIMEOUT));
    let _ = stream.set_write_timeout(Some(HEALTH_TIMEOUT));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    // The answer is a few hundred bytes; read at most 64 KiB.
    let mut answer = Vec::new();
    let _ = stream.take(64 * 1024).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.starts_with("HTTP/1.") && answer.contains(r#""health":"true""#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_count_out_of_range_is_refused() {
        for n in [0, MAX_MEMBERS + 1] {
            let e = EtcdCluster::start(n).expect_err("refused");
            assert!(e.0.contains("members must be 1-7"), "{e}");
        }
    }

    #[test]
    fn one_member_starts_freezes_thaws_restarts_and_dies_with_the_cluster() {
        let mut cluster = EtcdCluster::start(1).expect("start");
        assert_eq!(cluster.endpoints().len(), 1);
        assert!(cluster.is_healthy(0));
        let pid = cluster.pid(0).expect("running");

        cluster.freeze(0);
        assert!(!cluster.is_healthy(0), "a frozen member answers nothing");
        cluster.thaw(0);
        let deadline = Instant::now() + START_DEADLINE;
        cluster.wait_healthy(0, deadline).expect("healthy again");

        cluster.kill9(0);
        assert_eq!(cluster.pid(0), None);
        assert!(!cluster.is_healthy(0));
        cluster.restart(0).expect("restart");
        let new_pid = cluster.pid(0).expect("running again");
        assert_ne!(new_pid, pid);

        let dir = cluster.dir().to_path_buf();
        drop(cluster);
        // Killed and reaped: the PID is gone (kill with no signal fails) and so is the data.
        assert!(kill(Pid::from_raw(new_pid as i32), None).is_err());
        assert!(!dir.exists());
    }
}
