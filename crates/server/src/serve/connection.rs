//! One connection's task: hyper serves it until it ends, until its [`Policy`] says it waited
//! too long (then it is dropped, which closes the socket), or until the port drains (then it
//! is shut down gracefully: HTTP/1 finishes the request in flight, HTTP/2 sends GOAWAY).
//!
//! On a TLS port the handshake comes first, under the same [`Policy`] deadline that the
//! connection's first request head (REST) or HTTP/2 preface (gRPC) has from the accept, so a
//! client that stalls in the handshake holds its slot no longer than one that stalls before
//! its first request. A failed handshake (a plain-text client, an untrusted or missing client
//! certificate) closes the connection.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::Phase;
use super::activity::{Activity, Counted, Policy, TrackedIo};
use super::metrics::{ConnectionMetrics, PortLabel};

/// What every connection of one port shares.
pub(super) struct PortShared {
    pub(super) label: PortLabel,
    pub(super) builder: auto::Builder<TokioExecutor>,
    pub(super) metrics: ConnectionMetrics,
    /// TLS of the port, if on. The acceptor is taken at each accept, so a reload applies to
    /// the connections accepted after it.
    #[cfg(feature = "tls")]
    pub(super) tls: PortTls,
}

/// The TLS settings of a port and which port it is (for its ALPN protocols).
#[cfg(feature = "tls")]
pub(super) type PortTls = Option<(crate::tls::Tls, crate::tls::Port)>;
/// Without the `tls` feature a port has no TLS settings.
#[cfg(not(feature = "tls"))]
pub(super) type PortTls = ();

/// An accepted connection.
pub(super) struct Accepted {
    pub(super) stream: TcpStream,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
}

/// Serves one connection with `router` under `policy`, after a TLS handshake on a TLS port. A
/// refused connection (policy [`Policy::Refusal`]) is shut down gracefully once its first
/// answer is sent.
pub(super) async fn run(
    conn: Accepted,
    port: Arc<PortShared>,
    router: axum::Router,
    policy: Policy,
    phase: watch::Receiver<Phase>,
) {
    let activity = Arc::new(Activity::new(policy));
    let Accepted {
        stream,
        local,
        peer,
    } = conn;
    #[cfg(feature = "tls")]
    if let Some((tls, which)) = &port.tls {
        let acceptor = tls.acceptor(*which);
        let mut phase = phase;
        let Some(stream) = handshake(acceptor, stream, &port, &activity, &mut phase, peer).await
        else {
            return;
        };
        return serve(stream, (local, peer), port, router, activity, phase).await;
    }
    serve(stream, (local, peer), port, router, activity, phase).await
}

/// The TLS handshake of `stream`, until the connection's policy deadline or a drain; `None`
/// when it failed or was cut short (the connection is then closed).
#[cfg(feature = "tls")]
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    port: &PortShared,
    activity: &Activity,
    phase: &mut watch::Receiver<Phase>,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    if matches!(*phase.borrow_and_update(), Phase::Draining(_)) {
        return None;
    }
    let refusal = matches!(activity.policy(), Policy::Refusal { .. });
    let accepting = acceptor.accept(stream);
    tokio::pin!(accepting);
    let expired = activity.expired();
    tokio::pin!(expired);
    loop {
        tokio::select! {
            result = &mut accepting => match result {
                Ok(stream) => return Some(stream),
                Err(e) => {
                    port.metrics.tls_failed.get_or_create(&port.label).inc();
                    tracing::debug!(%peer, port = port.label.port, error = %e, "TLS handshake failed; connection closed");
                    return None;
                }
            },
            () = &mut expired => {
                if !refusal {
                    port.metrics.timed_out.get_or_create(&port.label).inc();
                }
                tracing::debug!(%peer, port = port.label.port, "connection closed: its TLS handshake took longer than its timeout");
                return None;
            }
            changed = phase.changed() => {
                if changed.is_err() || matches!(*phase.borrow(), Phase::Draining(_)) {
                    return None;
                }
            }
        }
    }
}

/// hyper serves `stream` (plain TCP or TLS) of the connection `(local, peer)`.
async fn serve<S>(
    stream: S,
    (local, peer): (SocketAddr, SocketAddr),
    port: Arc<PortShared>,
    router: axum::Router,
    activity: Arc<Activity>,
    mut phase: watch::Receiver<Phase>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(TrackedIo::new(stream, activity.clone()));
    let service = TowerToHyperService::new(Counted::new(router, activity.clone(), local, peer));
    let serving = port.builder.serve_connection(io, service);
    tokio::pin!(serving);
    let expired = activity.expired();
    tokio::pin!(expired);
    let refusal = matches!(activity.policy(), Policy::Refusal { .. });
    let served = activity.served();
    tokio::pin!(served);
    let mut closing = false;
    if matches!(*phase.borrow_and_update(), Phase::Draining(_)) {
        if activity.closable_at_stop() {
            return;
        }
        closing = true;
        serving.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = serving.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, port = port.label.port, error = %e, "connection ended with an error");
                }
                break;
            }
            () = &mut expired => {
                if !refusal {
                    port.metrics.timed_out.get_or_create(&port.label).inc();
                }
                tracing::debug!(%peer, port = port.label.port, "connection closed: it waited longer than its timeout");
                break;
            }
            () = &mut served, if refusal && !closing => {
                closing = true;
                serving.as_mut().graceful_shutdown();
            }
            changed = phase.changed(), if !closing => {
                if changed.is_err() || matches!(*phase.borrow(), Phase::Draining(_)) {
                    if activity.closable_at_stop() {
                        tracing::debug!(%peer, port = port.label.port, "connection closed at the stop: nothing in flight");
                        break;
                    }
                    closing = true;
                    serving.as_mut().graceful_shutdown();
                }
            }
        }
    }
    if activity.head_refused() {
        port.metrics.heads_refused.get_or_create(&port.label).inc();
    }
}
