//! A Server-Sent Events parser (the subset the registry's `watch` stream uses): `event:` and
//! `data:` fields, comments, LF or CRLF line ends, events split across arbitrary chunks.

use std::collections::VecDeque;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event:` field, `message` when absent.
    pub(crate) name: String,
    /// The `data:` lines joined with `\n`.
    pub(crate) data: String,
}

/// Incremental parser: [`push`](Self::push) bytes as they arrive, take events with
/// [`next_event`](Self::next_event).
#[derive(Debug, Default)]
pub(crate) struct EventParser {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    name: Option<String>,
    data: Option<String>,
    ready: VecDeque<Event>,
}

impl EventParser {
    /// Feeds a chunk of the stream.
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        for &b in chunk {
            if b == b'\n' {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.line_done(&String::from_utf8_lossy(&line));
            } else {
                self.line.push(b);
            }
        }
    }

    /// The oldest complete event not yet taken.
    pub(crate) fn next_event(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    fn line_done(&mut self, line: &str) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                let name = self.name.take().unwrap_or_else(|| "message".to_owned());
                self.ready.push_back(Event { name, data });
            }
            self.name = None;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.name = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(p: &mut EventParser) -> Vec<Event> {
        std::iter::from_fn(|| p.next_event()).collect()
    }

    #[test]
    fn parses_named_events_split_at_every_byte() {
        let stream = b": keep-alive\nevent: snapshot\ndata: {\"revision\":1}\n\nevent: snapshot\r\ndata: a\r\ndata: b\r\n\r\n";
        let mut p = EventParser::default();
        for b in stream.iter() {
            p.push(std::slice::from_ref(b));
        }
        assert_eq!(
            all(&mut p),
            vec![
                Event {
                    name: "snapshot".into(),
                    data: "{\"revision\":1}".into()
                },
                Event {
                    name: "snapshot".into(),
                    data: "a\nb".into()
                },
            ]
        );
    }

    #[test]
    fn an_unfinished_event_waits_for_its_blank_line() {
        let mut p = EventParser::default();
        p.push(b"event: snapshot\ndata: x\n");
        assert_eq!(p.next_event(), None);
        p.push(b"\n");
        assert_eq!(p.next_event().map(|e| e.data), Some("x".to_owned()));
    }

    #[test]
    fn unnamed_events_are_messages_and_dataless_events_are_dropped() {
        let mut p = EventParser::default();
        p.push(b"event: ping\n\ndata:no-space\n\n");
        assert_eq!(
            all(&mut p),
            vec![Event {
                name: "message".into(),
                data: "no-space".into()
            }]
        );
    }
}
