//! A `gangway` process left running (a registry, `watch`, `register --keep-alive`): its output
//! is collected as it comes, and SIGINT stops it like Ctrl-C. Shared by the process tests.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;

/// A `gangway` process left running: its output is collected as it comes.
pub struct Running {
    child: tokio::process::Child,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    /// The two pipe readers; they end at EOF, once the process is gone.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Starts `gangway --server SERVER ARGS...` (`server` empty: no `--server`).
    pub fn start(server: &str, args: &[&str]) -> Running {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gangway"));
        if !server.is_empty() {
            cmd.arg("--server").arg(server);
        }
        let mut child = cmd
            .args(args)
            .env_remove("GANGWAY_SERVER")
            .env_remove("GANGWAY_NAMESPACE")
            .env_remove("GANGWAY_GROUP")
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start gangway");
        let collect = |mut pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
            let text = Arc::new(Mutex::new(String::new()));
            let sink = text.clone();
            let reader = tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
            (text, reader)
        };
        let (out, out_reader) = collect(Box::new(child.stdout.take().unwrap()));
        let (err, err_reader) = collect(Box::new(child.stderr.take().unwrap()));
        Running {
            child,
            out,
            err,
            readers: vec![out_reader, err_reader],
        }
    }

    /// Output so far: (stdout, stderr).
    pub fn output(&self) -> (String, String) {
        (
            self.out.lock().unwrap().clone(),
            self.err.lock().unwrap().clone(),
        )
    }

    /// Waits (up to 20 s) until `done(stdout, stderr)` holds.
    pub async fn wait_for(&mut self, done: impl Fn(&str, &str) -> bool) {
        for _ in 0..2000 {
            let (out, err) = self.output();
            if done(&out, &err) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("gangway exited ({status}) early:\n{out}\n{err}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "timed out; stdout:\n{}\nstderr:\n{}",
            self.out.lock().unwrap(),
            self.err.lock().unwrap()
        );
    }

    /// Sends SIGINT (Ctrl-C) and returns the exit status and all output.
    pub async fn interrupt(self) -> (ExitStatus, String, String) {
        self.stop(nix::sys::signal::Signal::SIGINT).await
    }

    /// Sends `signal` and returns the exit status and all output.
    pub async fn stop(mut self, signal: nix::sys::signal::Signal) -> (ExitStatus, String, String) {
        let pid = self.child.id().expect("running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("gangway stops on SIGINT")
            .unwrap();
        // The readers end at EOF: then all output is in.
        for reader in std::mem::take(&mut self.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        let out = self.out.lock().unwrap().clone();
        let err = self.err.lock().unwrap().clone();
        (status, out, err)
    }
}
