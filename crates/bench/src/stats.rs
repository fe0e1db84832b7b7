//! What the kernel says about a process (`/proc/<pid>/stat`, `/proc/<pid>/status`) and about the
//! machine (`/proc/meminfo`), so client and server costs can be read side by side.

use std::time::Duration;

use serde::Serialize;

/// CPU time (user + system) a process has used so far. `None` when it cannot be read (the
/// process is gone, or this is not Linux).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&text, clock_ticks())
}

/// CPU time of this process (the load generator).
pub fn own_cpu_time() -> Option<Duration> {
    cpu_time(std::process::id())
}

/// Resident set size in bytes (`VmRSS`), `None` when unreadable.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_kb_field(&text, "VmRSS:")
}

/// `USER_HZ`: the unit of `/proc/<pid>/stat` times, 100 on every Linux user-space ABI.
fn clock_ticks() -> u64 {
    100
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its closing `)`.
fn parse_stat_cpu(text: &str, ticks_per_s: u64) -> Option<Duration> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")" the first field is field 3 (state); utime is field 14, so index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = utime + stime;
    Some(Duration::from_micros(
        ticks * 1_000_000 / ticks_per_s.max(1),
    ))
}

/// A `Name:   123 kB` field of `/proc/*/status` or `/proc/meminfo`, in bytes.
fn parse_kb_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// The machine the numbers were taken on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Cores available to this process.
    pub cores: usize,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// `uname -r`-like kernel release, when readable.
    pub kernel: String,
    /// Processor model name, when readable.
    pub cpu_model: String,
}

impl Machine {
    /// Reads the machine's description; unknown parts are 0 or empty.
    pub fn current() -> Self {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_bytes: parse_kb_field(&meminfo, "MemTotal:").unwrap_or(0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .unwrap_or("")
                .trim()
                .to_owned(),
        }
    }
}

/// Raises this process's open-file limit to its hard limit (children inherit it), so thousands
/// of sessions fit. Returns the new soft limit.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_spaces_in_the_name() {
        let line = "4242 (my (odd) name) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat_cpu(line, 100), Some(Duration::from_secs(3)));
        assert_eq!(parse_stat_cpu("garbage", 100), None);
        assert_eq!(parse_stat_cpu("1 (x) S 1 2", 100), None);
    }

    #[test]
    fn kb_fields() {
        let status = "Name:\tgangway\nVmRSS:\t  2048 kB\nThreads: 3\n";
        assert_eq!(parse_kb_field(status, "VmRSS:"), Some(2048 * 1024));
        assert_eq!(parse_kb_field(status, "VmHWM:"), None);
    }

    #[test]
    fn own_process_is_readable() {
        assert!(own_cpu_time().is_some());
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
        let m = Machine::current();
        assert!(m.cores >= 1 && m.memory_bytes > 0);
    }
}
