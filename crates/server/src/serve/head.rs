//! Limits on HTTP/1 request heads, enforced below hyper's so that an oversized head gets the
//! one JSON error shape of `/v1` (docs/api.md) instead of hyper's empty-body 414 or 431.
//!
//! hyper's parser rejects a request line over 64 KiB (414), a head over its ~400 KiB buffer or
//! with more than 100 header fields (431) and answers them itself, before any service sees the
//! request; there is no hook for the body of those answers. So the connection's reader
//! ([`super::activity::TrackedIo`]) runs every byte of a head through a [`Scan`] *before*
//! hyper sees it, with smaller limits ([`MAX_LINE`], [`MAX_HEAD`], [`MAX_HEADERS`]); when one is
//! passed, hyper never gets the bytes and the reader answers with an [`ApiError`] itself.
//! The scan only finds line ends (it does not parse HTTP): the request line, header lines, the
//! empty line that ends the head, and the `Content-Length` of the body, to know where the next
//! head starts. When it cannot know (`Transfer-Encoding`, a pipelined request read while the
//! previous one ran), it stops for that connection and hyper's own limits remain.

use crate::error::ApiError;

/// Longest request line or header line, bytes (nginx's `large_client_header_buffers` line
/// size): a longer request line gets 414, a longer header line 431.
pub const MAX_LINE: usize = 8 * 1024;
/// Largest request head (request line and every header line), bytes: beyond it, 431.
pub const MAX_HEAD: usize = 32 * 1024;
/// Most header fields in one request: the next one gets 431 (hyper refuses more than 100).
pub const MAX_HEADERS: usize = 100;

/// The HTTP/2 `SETTINGS_MAX_HEADER_LIST_SIZE` of the REST port, bytes: twice [`MAX_HEAD`],
/// since HTTP/2 counts 32 bytes more per field (RFC 9113 §6.5.2), so that every head [`check`]
/// refuses reaches it and gets the JSON answer (hyper's default, 16 KiB, would refuse heads
/// HTTP/1 accepts, with an empty 431).
pub const H2_MAX_HEADER_LIST: u32 = 2 * MAX_HEAD as u32;

/// The start of every HTTP/2 connection: `PRI * HTTP/2.0`, read as a request line.
const H2_REQUEST_LINE: &[u8] = b"PRI * HTTP/2.0";
/// Bytes of each line kept to recognise `Content-Length` and `Transfer-Encoding`.
const PREFIX: usize = 40;

/// What [`Scan::feed`] found.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Pass the bytes on.
    Pass,
    /// The connection speaks HTTP/2 (prior knowledge): nothing more to scan.
    Http2,
    /// Refuse the request with this error; the bytes must not reach hyper.
    Reject(ApiError),
}

/// The body length a head announced.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BodyLen {
    Known(u64),
    Unknown,
}

#[derive(Debug)]
enum State {
    /// Reading a head.
    Head {
        /// Bytes of the head so far.
        seen: usize,
        /// Bytes of the current line so far.
        line: usize,
        /// Complete lines so far (the request line is the first).
        lines: usize,
        /// The first bytes of the current line.
        prefix: Vec<u8>,
        body: BodyLen,
    },
    /// The head ended: counting what the reader gets until the request's response ends.
    AfterHead { body: BodyLen, extra: u64 },
    /// The response ended before its request's body was read: skipping the rest of it.
    Body { remaining: u64 },
    /// Not scanning: HTTP/2, or out of step with the request boundaries.
    Off,
}

/// The scan of one connection's request heads.
#[derive(Debug)]
pub(super) struct Scan {
    state: State,
}

impl Default for Scan {
    fn default() -> Self {
        Self { state: head() }
    }
}

fn head() -> State {
    State::Head {
        seen: 0,
        line: 0,
        lines: 0,
        prefix: Vec::with_capacity(PREFIX),
        body: BodyLen::Known(0),
    }
}

/// The body length after one more header line, from what came before.
fn body_after(line: &[u8], before: BodyLen) -> BodyLen {
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return before;
    };
    let name = line[..colon].trim_ascii();
    if name.eq_ignore_ascii_case(b"transfer-encoding") {
        return BodyLen::Unknown;
    }
    if !name.eq_ignore_ascii_case(b"content-length") {
        return before;
    }
    let value = std::str::from_utf8(line[colon + 1..].trim_ascii())
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    match (value, before) {
        // A second, different Content-Length: hyper refuses the request; stop counting.
        (Some(n), BodyLen::Known(0)) => BodyLen::Known(n),
        (Some(n), BodyLen::Known(m)) if n == m => before,
        _ => BodyLen::Unknown,
    }
}

impl Scan {
    /// Looks at bytes just read, before hyper sees them. `busy`: a request of this connection
    /// is in flight.
    pub(super) fn feed(&mut self, bytes: &[u8], busy: bool) -> Verdict {
        match &mut self.state {
            State::Off => Verdict::Pass,
            State::AfterHead { extra, .. } => {
                *extra += bytes.len() as u64;
                Verdict::Pass
            }
            State::Body { remaining } => {
                let n = bytes.len() as u64;
                if n <= *remaining {
                    *remaining -= n;
                    return Verdict::Pass;
                }
                let rest = &bytes[*remaining as usize..];
                self.state = head();
                self.feed(rest, busy)
            }
            State::Head { seen: 0, .. } if busy => {
                // A head that starts while a request runs: pipelining, which the scan cannot
                // follow.
                self.state = State::Off;
                Verdict::Pass
            }
            State::Head { .. } => self.feed_head(bytes),
        }
    }

    fn feed_head(&mut self, bytes: &[u8]) -> Verdict {
        let State::Head {
            seen,
            line,
            lines,
            prefix,
            body,
        } = &mut self.state
        else {
            return Verdict::Pass;
        };
        for (i, &b) in bytes.iter().enumerate() {
            if *lines == 0 && *line == 0 && (b == b'\r' || b == b'\n') {
                continue; // empty lines before a request line are allowed (and skipped by hyper)
            }
            *seen += 1;
            if *seen > MAX_HEAD {
                return Verdict::Reject(ApiError::HeadersTooLarge {
                    message: format!("the request head is larger than {MAX_HEAD} bytes"),
                });
            }
            if b == b'\n' {
                let content = prefix.strip_suffix(b"\r").unwrap_or(prefix);
                let empty = *line <= 1 && content.is_empty();
                if *lines == 0 && content == H2_REQUEST_LINE {
                    self.state = State::Off;
                    return Verdict::Http2;
                }
                if *lines > 0 && empty {
                    let extra = (bytes.len() - i - 1) as u64;
                    self.state = State::AfterHead { body: *body, extra };
                    return Verdict::Pass;
                }
                if *lines > 0 {
                    *body = body_after(content, *body);
                }
                *lines += 1;
                *line = 0;
                prefix.clear();
                continue;
            }
            if *line == 0 && *lines > MAX_HEADERS && b != b'\r' {
                return Verdict::Reject(ApiError::HeadersTooLarge {
                    message: format!("more than {MAX_HEADERS} header fields"),
                });
            }
            *line += 1;
            if *line > MAX_LINE {
                return Verdict::Reject(if *lines == 0 {
                    ApiError::UriTooLong { limit: MAX_LINE }
                } else {
                    ApiError::HeadersTooLarge {
                        message: format!("a header field is longer than {MAX_LINE} bytes"),
                    }
                });
            }
            if prefix.len() < PREFIX {
                prefix.push(b);
            }
        }
        Verdict::Pass
    }

    /// hyper called the service: the head is complete. A scan that did not see it end is out
    /// of step and stops.
    pub(super) fn request_started(&mut self) {
        if matches!(self.state, State::Head { seen, .. } if seen > 0) {
            self.state = State::Off;
        }
    }

    /// The connection's last response ended: the next bytes start the next head, once the
    /// body of this request (if it was not read yet) has passed.
    pub(super) fn request_ended(&mut self) {
        self.state = match std::mem::replace(&mut self.state, State::Off) {
            State::AfterHead {
                body: BodyLen::Known(len),
                extra,
            } if extra <= len => {
                if extra == len {
                    head()
                } else {
                    State::Body {
                        remaining: len - extra,
                    }
                }
            }
            State::Head { seen: 0, .. } => head(),
            // Unknown body length, bytes beyond the body (a pipelined request), or a state the
            // scan cannot place: hyper's own limits remain.
            _ => State::Off,
        };
    }
}

/// The limits of [`Scan`] applied to a parsed request, as its head would be written in
/// HTTP/1.1 at its shortest (`METHOD TARGET HTTP/1.1`, `name:value` lines ending in `\n`, so
/// that no head the scan let through is refused here): a target longer than [`MAX_LINE`]
/// gets 414, a longer header line, more than [`MAX_HEADERS`] fields or a head over
/// [`MAX_HEAD`] get 431.
pub(super) fn check<B>(request: &http::Request<B>) -> Option<ApiError> {
    let target = match request.uri().path_and_query() {
        // HTTP/2 and origin-form: the path; absolute-form: the whole URI.
        Some(p)
            if request.uri().scheme().is_none() || request.version() >= http::Version::HTTP_2 =>
        {
            p.as_str().len()
        }
        _ => request.uri().to_string().len(),
    };
    let request_line = request.method().as_str().len() + 1 + target + " HTTP/1.1".len();
    if request_line > MAX_LINE {
        return Some(ApiError::UriTooLong { limit: MAX_LINE });
    }
    let headers = request.headers();
    if headers.len() > MAX_HEADERS {
        return Some(ApiError::HeadersTooLarge {
            message: format!("more than {MAX_HEADERS} header fields"),
        });
    }
    let mut head = request_line + 1;
    for (name, value) in headers {
        let line = name.as_str().len() + 1 + value.len();
        if line > MAX_LINE {
            return Some(ApiError::HeadersTooLarge {
                message: format!("a header field is longer than {MAX_LINE} bytes"),
            });
        }
        head += line + 1;
    }
    (head > MAX_HEAD).then(|| ApiError::HeadersTooLarge {
        message: format!("the request head is larger than {MAX_HEAD} bytes"),
    })
}

/// The bytes of an HTTP/1.1 answer carrying `error` (its status and JSON body) that closes the
/// connection.
pub(super) fn answer(error: &ApiError) -> Vec<u8> {
    let status = error.status();
    let body = error.json_body();
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}
