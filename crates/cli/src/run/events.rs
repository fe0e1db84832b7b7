//! The wrapper's log: one line per step on stderr, with its time since the start and, once a
//! stop signal came, since that signal; `--json` makes each line a JSON object for machines.

use std::io::Write;
use std::sync::Mutex;

use serde_json::Value;
use tokio::time::Instant;

/// Where the steps of `gangway run` are written (stderr; the child keeps stdout and stderr).
#[derive(Debug)]
pub struct Events {
    json: bool,
    start: Instant,
    /// The stop signal and when it came.
    signal: Mutex<Option<(Instant, &'static str)>>,
}

impl Events {
    /// Text lines, or JSON lines with `json`; times count from now.
    pub fn new(json: bool) -> Self {
        Self {
            json,
            start: Instant::now(),
            signal: Mutex::new(None),
        }
    }

    /// Records the stop signal (`SIGTERM`, `SIGINT`): later steps also say how long after it
    /// they came. Only the first one counts.
    pub fn signalled(&self, name: &'static str) {
        let mut signal = self.signal.lock().unwrap_or_else(|p| p.into_inner());
        if signal.is_none() {
            *signal = Some((Instant::now(), name));
        }
        drop(signal);
        self.emit("signal", &[("signal", Value::from(name))]);
    }

    /// Writes one step: `event` and its fields.
    pub fn emit(&self, event: &str, fields: &[(&str, Value)]) {
        let now = Instant::now();
        let elapsed_ms = ms(now - self.start);
        let signal = *self.signal.lock().unwrap_or_else(|p| p.into_inner());
        let line = if self.json {
            // Written by hand so that `event` comes first (serde_json's maps sort their keys).
            let mut line = format!(
                "{{\"event\":{},\"elapsed_ms\":{}",
                Value::from(event),
                Value::from(elapsed_ms)
            );
            if let Some((at, _)) = signal {
                line.push_str(&format!(
                    ",\"since_signal_ms\":{}",
                    Value::from(ms(now - at))
                ));
            }
            for (k, v) in fields {
                line.push_str(&format!(",{}:{v}", Value::from(*k)));
            }
            line.push('}');
            line
        } else {
            let when = match signal {
                Some((at, name)) => format!("+{:.3}s after {name}", (now - at).as_secs_f64()),
                None => format!("{:.3}s", elapsed_ms / 1000.0),
            };
            let mut line = format!("gangway run: [{when}] {event}");
            for (k, v) in fields {
                match v {
                    Value::String(s) => line.push_str(&format!(" {k}={s}")),
                    other => line.push_str(&format!(" {k}={other}")),
                }
            }
            line
        };
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        let _ = err.flush();
    }
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}
