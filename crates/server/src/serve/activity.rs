//! What one connection is doing, and when it must be closed for it.
//!
//! [`TrackedIo`] (the socket as hyper reads it) and [`Counted`] (the service hyper calls) keep
//! an [`Activity`] up to date: bytes read, requests in flight (a request counts until its
//! response body has been sent or dropped, so an SSE watch or a drain wait is in flight for as
//! long as it runs). [`Activity::expired`] resolves when the connection's [`Policy`] says it
//! has waited too long.
//!
//! hyper's own HTTP/1 header read timeout is not used: it also starts when a keep-alive
//! connection goes idle, so it cannot express "a head within 30 s, but an idle connection for
//! 75 s"; hyper has no idle timeout of its own.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::ConnectInfo;
use futures::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::head::{self, Scan, Verdict};

/// Length of the HTTP/2 client preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`).
const PREFACE_LEN: u64 = 24;
/// After answering an oversized head, what the client still sends is read and discarded for
/// at most this long...
const LINGER_TIME: Duration = Duration::from_secs(1);
/// ...or this many bytes, before the connection closes (closing with unread bytes would reset
/// it, and the client could lose the answer).
const LINGER_BYTES: usize = 1024 * 1024;

/// When a connection is closed for waiting (docs/operations.md, "Connections").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// The REST port. With no request in flight: the head of the next request must arrive
    /// within `header` of its first byte (of the accept, for the first request), and an idle
    /// keep-alive connection is closed after `idle`. Heads are scanned ([`head`]).
    Http {
        /// Header read timeout.
        header: Duration,
        /// Idle keep-alive timeout.
        idle: Duration,
        /// Request body timeout: the whole body within this of the end of its head.
        body: Duration,
    },
    /// The gRPC port: the HTTP/2 preface must arrive within `handshake` of the accept; later,
    /// HTTP/2 keepalive pings decide.
    Grpc {
        /// Handshake timeout.
        handshake: Duration,
    },
    /// A refused connection: closed `limit` after its accept at the latest.
    Refusal {
        /// Longest life.
        limit: Duration,
    },
}

/// The state behind the lock.
struct Phase {
    in_flight: usize,
    /// When the last request ended (the accept, before the first).
    idle_since: Instant,
    /// A request was served on this connection.
    served: bool,
    /// First byte read since the connection went idle: a head is arriving (HTTP/1).
    head_started: Option<Instant>,
    read_total: u64,
    /// The connection speaks HTTP/2: bytes while idle are frames (pings), not a head.
    h2: bool,
    scan: Option<Scan>,
    /// A request head was refused for its size.
    head_refused: bool,
}

/// One connection's activity. Shared by its reader, its service and its task.
pub(crate) struct Activity {
    policy: Policy,
    accepted: Instant,
    phase: Mutex<Phase>,
    /// Notified when a deadline may have moved earlier, or a request ended.
    changed: Notify,
}

impl Activity {
    pub(crate) fn new(policy: Policy) -> Self {
        let now = Instant::now();
        Self {
            policy,
            accepted: now,
            phase: Mutex::new(Phase {
                in_flight: 0,
                idle_since: now,
                served: false,
                head_started: None,
                read_total: 0,
                h2: false,
                scan: matches!(policy, Policy::Http { .. }).then(Scan::default),
                head_refused: false,
            }),
            changed: Notify::new(),
        }
    }

    /// The connection's policy.
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the connection must be closed, as things stand (`None`: not for waiting).
    fn deadline(&self, p: &Phase) -> Option<Instant> {
        match self.policy {
            Policy::Http { header, idle, .. } => {
                if p.in_flight > 0 {
                    None
                } else if let Some(started) = p.head_started {
                    Some(started + header)
                } else if p.served {
                    Some(p.idle_since + idle)
                } else {
                    Some(self.accepted + header)
                }
            }
            Policy::Grpc { handshake } => {
                (p.read_total < PREFACE_LEN).then_some(self.accepted + handshake)
            }
            Policy::Refusal { limit } => Some(self.accepted + limit),
        }
    }

    /// Resolves when the connection has waited longer than its policy allows. Cancel-safe.
    pub(crate) async fn expired(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            let deadline = self.deadline(&self.lock());
            match deadline {
                Some(at) if at <= Instant::now() => return,
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = &mut changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Resolves once a request was served and none is in flight. Cancel-safe.
    pub(crate) async fn served(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            {
                let p = self.lock();
                if p.served && p.in_flight == 0 {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Whether a stop may close the connection at once: no request of it is being handled.
    /// An HTTP/1 connection with none in flight (idle, or its next head still arriving) and a
    /// gRPC connection that has not sent its preface hold nothing a client waits for; a stop
    /// would otherwise wait its whole timeout for a half-sent head (a port scanner).
    /// HTTP/2 connections get their GOAWAY through the graceful shutdown.
    pub(crate) fn closable_at_stop(&self) -> bool {
        let p = self.lock();
        match self.policy {
            Policy::Http { .. } => !p.h2 && p.in_flight == 0,
            Policy::Grpc { .. } => p.read_total < PREFACE_LEN,
            Policy::Refusal { .. } => false,
        }
    }

    /// A request head was refused for its size ([`head`]).
    pub(crate) fn head_refused(&self) -> bool {
        self.lock().head_refused
    }

    /// Bytes just read, before hyper sees them. `Some`: refuse the request with this answer.
    fn on_read(&self, bytes: &[u8]) -> Option<crate::ApiError> {
        let mut p = self.lock();
        p.read_total += bytes.len() as u64;
        let idle = p.in_flight == 0;
        let mut moved = false;
        if idle && !p.h2 && p.head_started.is_none() {
            p.head_started = Some(Instant::now());
            moved = true;
        }
        let verdict = match p.scan.as_mut() {
            Some(scan) => scan.feed(bytes, !idle),
            None => Verdict::Pass,
        };
        let rejected = match verdict {
            Verdict::Pass => None,
            Verdict::Http2 => {
                p.h2 = true;
                p.head_started = None;
                None
            }
            Verdict::Reject(e) => {
                p.head_refused = true;
                Some(e)
            }
        };
        drop(p);
        if moved {
            self.changed.notify_one();
        }
        rejected
    }

    fn request_started(self: &Arc<Self>) -> RequestGuard {
        let mut p = self.lock();
        p.in_flight += 1;
        p.head_started = None;
        if let Some(scan) = p.scan.as_mut() {
            scan.request_started();
        }
        drop(p);
        self.changed.notify_one();
        RequestGuard {
            activity: self.clone(),
        }
    }

    fn request_ended(&self) {
        let mut p = self.lock();
        p.in_flight -= 1;
        if p.in_flight == 0 {
            p.idle_since = Instant::now();
            p.served = true;
            p.head_started = None;
            if let Some(scan) = p.scan.as_mut() {
                scan.request_ended();
            }
        }
        drop(p);
        self.changed.notify_one();
    }
}

/// Counts a request until its response body is gone.
struct RequestGuard {
    activity: Arc<Activity>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.activity.request_ended();
    }
}

/// A response body that keeps its request counted while it is sent.
pub(crate) struct TrackedBody<B> {
    inner: B,
    _guard: RequestGuard,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a request body could not be read in time: the error [`TimedBody`] fails with, found
/// by walking an extractor rejection's `source()` chain ([`BodyTimeout::find`]); the REST
/// and Nacos handlers answer it with `408`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyTimeout {
    /// No byte of the body arrived for this long.
    #[error("the request body stalled for more than {} ms", .0.as_millis())]
    Stalled(Duration),
    /// The body was not complete this long after the request head.
    #[error("the request body was not complete within {} ms of the request head", .0.as_millis())]
    Total(Duration),
}

impl BodyTimeout {
    /// The [`BodyTimeout`] in `error` or its sources, if any.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(found) = e.downcast_ref::<BodyTimeout>() {
                return Some(found);
            }
            next = e.source();
        }
        None
    }
}

/// A request body that must keep arriving and end in time: once it has been waited for
/// longer than `gap` without a frame, or is not complete by `deadline` however steadily it
/// trickles, reading it fails with a [`BodyTimeout`] (the handler answers 408), so a client
/// that sends slowly or stops half-way holds its connection no longer than a slow head would.
pub(crate) struct TimedBody<B> {
    inner: B,
    gap: Duration,
    total: Duration,
    deadline: Pin<Box<Sleep>>,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<B> TimedBody<B> {
    /// `inner` with the deadline `total` from now and the longest gap `gap`.
    pub(crate) fn new(inner: B, gap: Duration, total: Duration) -> Self {
        Self {
            inner,
            gap,
            total,
            deadline: Box::pin(tokio::time::sleep(total)),
            waiting: None,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = axum::body::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.inner.is_end_stream() {
            return Poll::Ready(None);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(BodyTimeout::Total(this.total).into())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let gap = this.gap;
                let waiting = this
                    .waiting
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                ready!(waiting.as_mut().poll(cx));
                Poll::Ready(Some(Err(BodyTimeout::Stalled(gap).into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The service of one connection: the port's router, with the peer's address in the request
/// extensions (axum's [`ConnectInfo`] and tonic's `TcpConnectInfo`, which `remote_addr()`
/// reads), counting requests in its [`Activity`].
#[derive(Clone)]
pub(crate) struct Counted {
    router: axum::Router,
    activity: Arc<Activity>,
    local: SocketAddr,
    peer: SocketAddr,
}

impl Counted {
    pub(crate) fn new(
        router: axum::Router,
        activity: Arc<Activity>,
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Self {
        Self {
            router,
            activity,
            local,
            peer,
        }
    }
}

impl tower::Service<http::Request<Incoming>> for Counted {
    type Response = http::Response<TrackedBody<axum::body::Body>>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<http::Request<Incoming>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut request: http::Request<Incoming>) -> Self::Future {
        let guard = self.activity.request_started();
        let extensions = request.extensions_mut();
        extensions.insert(ConnectInfo(self.peer));
        extensions.insert(tonic::transport::server::TcpConnectInfo {
            local_addr: Some(self.local),
            remote_addr: Some(self.peer),
        });
        if matches!(self.activity.policy, Policy::Http { .. })
            && let Some(error) = head::check(&request)
        {
            tracing::debug!(code = error.code().as_str(), version = ?request.version(), "request head refused");
            self.activity.lock().head_refused = true;
            let response = axum::response::IntoResponse::into_response(error);
            return Box::pin(async move {
                Ok(response.map(|inner| TrackedBody {
                    inner,
                    _guard: guard,
                }))
            });
        }
        let request = match self.activity.policy {
            // On the REST port a body must keep coming, like a head; a gRPC request body is a
            // session's stream, which may rest for as long as the session lives.
            Policy::Http { header, body, .. } => {
                request.map(|inner| axum::body::Body::new(TimedBody::new(inner, header, body)))
            }
            _ => request.map(axum::body::Body::new),
        };
        let response = self.router.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| TrackedBody {
                inner,
                _guard: guard,
            }))
        })
    }
}

/// Answering an oversized head: the answer, then a lingering close.
struct Rejection {
    answer: Vec<u8>,
    written: usize,
    shut: bool,
    discarded: usize,
    linger: Pin<Box<Sleep>>,
}

impl Rejection {
    fn new(error: &crate::ApiError) -> Self {
        Self {
            answer: head::answer(error),
            written: 0,
            shut: false,
            discarded: 0,
            linger: Box::pin(tokio::time::sleep(LINGER_TIME)),
        }
    }

    /// Writes the answer, shuts the write side, discards what the client still sends for a
    /// bounded time, then reports the end of the stream to hyper.
    fn poll<T: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        io: &mut T,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.written < self.answer.len() {
            match ready!(Pin::new(&mut *io).poll_write(cx, &self.answer[self.written..])) {
                Ok(0) | Err(_) => return Poll::Ready(Ok(())),
                Ok(n) => self.written += n,
            }
        }
        if !self.shut {
            if ready!(Pin::new(&mut *io).poll_shutdown(cx)).is_err() {
                return Poll::Ready(Ok(()));
            }
            self.shut = true;
        }
        let mut scratch = [0u8; 4096];
        loop {
            if self.linger.as_mut().poll(cx).is_ready() || self.discarded >= LINGER_BYTES {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match ready!(Pin::new(&mut *io).poll_read(cx, &mut buf)) {
                Ok(()) if !buf.filled().is_empty() => self.discarded += buf.filled().len(),
                _ => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// The socket as hyper reads it: reports reads to the [`Activity`] and answers oversized
/// heads itself.
pub(crate) struct TrackedIo<T> {
    io: T,
    activity: Arc<Activity>,
    rejection: Option<Rejection>,
}

impl<T> TrackedIo<T> {
    pub(crate) fn new(io: T, activity: Arc<Activity>) -> Self {
        Self {
            io,
            activity,
            rejection: None,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(rejection) = this.rejection.as_mut() {
            return rejection.poll(&mut this.io, cx);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let fresh = &buf.filled()[before..];
        if fresh.is_empty() {
            return Poll::Ready(Ok(()));
        }
        match this.activity.on_read(fresh) {
            None => Poll::Ready(Ok(())),
            Some(error) => {
                tracing::debug!(code = %error.code(), "request head refused");
                buf.set_filled(before);
                this.rejection
                    .insert(Rejection::new(&error))
                    .poll(&mut this.io, cx)
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
