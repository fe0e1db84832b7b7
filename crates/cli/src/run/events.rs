//! The wrapper's log: one line per step, with its time since the start and, once a stop signal
//! came, since that signal. For people (the default) the lines go to stderr, with the other
//! logs; with `--json` each line is a JSON object on **stdout**, the CLI's machine output
//! (every command's `--json` answer goes there), while logs stay on stderr. The child shares
//! both streams: a reader of the JSON takes the lines that start with `{"event":`.

use std::io::Write;
use std::sync::Mutex;

use serde_json::Value;
use tokio::time::Instant;

/// Where the steps of `gangway run` are written: stderr, or stdout with `--json` (the child
/// keeps both).
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

    /// Writes one step: `event` and its fields, as one write of one line (a pipe keeps it
    /// whole among the child's output).
    pub fn emit(&self, event: &str, fields: &[(&str, Value)]) {
        let mut line = self.render(event, fields, Instant::now());
        line.push('\n');
        // A closed stream (`| head`) is no reason to stop the lifecycle.
        let _ = if self.json {
            write_line(std::io::stdout().lock(), &line)
        } else {
            write_line(std::io::stderr().lock(), &line)
        };
    }

    /// The wrapper gives up (exit 1): its error as every command prints one, after the steps.
    /// With `--json` the CLI's one error shape on stdout, `{"error": {"code", "message",
    /// "field"}}`; else `error: MESSAGE` on stderr.
    pub fn give_up(&self, code: &str, message: &str, field: Option<&str>) {
        let _ = if self.json {
            let line = format!("{}\n", crate::error::error_json(code, message, field));
            write_line(std::io::stdout().lock(), &line)
        } else {
            write_line(std::io::stderr().lock(), &format!("error: {message}\n"))
        };
    }

    /// The line for one step at `now`.
    fn render(&self, event: &str, fields: &[(&str, Value)], now: Instant) -> String {
        let elapsed_ms = ms(now - self.start);
        let signal = *self.signal.lock().unwrap_or_else(|p| p.into_inner());
        if self.json {
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
        }
    }
}

fn write_line(mut out: impl Write, line: &str) -> std::io::Result<()> {
    out.write_all(line.as_bytes())?;
    out.flush()
}

fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lines_count_from_the_start_then_from_the_signal() {
        let json = Events::new(true);
        let text = Events::new(false);
        tokio::time::advance(std::time::Duration::from_millis(1500)).await;
        let fields = [("pid", Value::from(42)), ("command", Value::from("a b"))];
        assert_eq!(
            json.render("started", &fields, Instant::now()),
            r#"{"event":"started","elapsed_ms":1500.0,"pid":42,"command":"a b"}"#
        );
        assert_eq!(
            text.render("started", &fields, Instant::now()),
            "gangway run: [1.500s] started pid=42 command=a b"
        );
        json.signalled("SIGTERM");
        text.signalled("SIGINT");
        text.signalled("SIGTERM"); // the first signal counts
        tokio::time::advance(std::time::Duration::from_millis(12)).await;
        let done = [("complete", Value::from(true))];
        let line: Value =
            serde_json::from_str(&json.render("drained", &done, Instant::now())).unwrap();
        assert_eq!(line["since_signal_ms"], 12.0);
        assert_eq!(line["elapsed_ms"], 1512.0);
        assert_eq!(
            text.render("drained", &done, Instant::now()),
            "gangway run: [+0.012s after SIGINT] drained complete=true"
        );
    }
}
