//! The Nacos 2.x/3.x SDK gRPC protocol: `Request/request` (unary) and
//! `BiRequestStream/requestBiStream`, each message a `Payload` whose JSON body is dispatched on
//! `metadata.type`.
//!
//! A *connection* is one HTTP/2 transport, recognised by its peer address: the unary calls and
//! the stream of one client share it (as in Nacos's `AddressTransportFilter`). The
//! `ConnectionSetupRequest` on the stream opens a gangway session for it; the connection's
//! ephemeral instances and subscriptions belong to that session and go the moment the stream
//! ends (process exit, kill, or the HTTP/2 keepalive timeout for a frozen peer). Naming requests
//! on a connection without a session get error 301, which makes SDKs reconnect.
//!
//! Subscriptions become gangway subscribers: each push is a `NotifySubscriberRequest` on the
//! stream with its own `requestId`; the client's `NotifySubscriberResponse` with that id is the
//! ack of the pushed revision, which is what `gangway offline --wait` waits for.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use gangway_proto::nacos as pb;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::Nacos;

mod conn;
mod naming;
mod reply;
mod request;
mod stream;

pub use conn::Conn;
pub use reply::payload;

/// Outbound buffer per connection stream, in messages.
pub(super) const OUTBOUND: usize = 256;
/// Unacked push request ids remembered per connection before the oldest are forgotten.
pub(super) const MAX_PENDING: usize = 1024;

/// Nacos error code: the server is starting.
pub const INVALID_SERVER_STATUS: i32 = 300;
/// Nacos error code: the connection is not registered (the client reconnects).
pub const UN_REGISTER: i32 = 301;
/// Nacos error code: no handler for the request type.
pub const NO_HANDLER: i32 = 302;
/// Nacos error code: invalid parameter.
pub const INVALID_PARAM: i32 = 400;
/// Nacos's error code for a missing, invalid or insufficient `accessToken`.
pub const NO_RIGHT: i32 = 403;
/// Nacos error code: the payload could not be parsed.
pub const BAD_GATEWAY: i32 = 502;

/// The abilities announced in `SetupAckRequest`.
pub(super) fn server_abilities() -> Value {
    json!({
        "supportPersistentInstanceByGrpc": true,
        "supportDeltaPush": false,
        "supportRemoteMetrics": false,
        "fuzzyWatch": false,
        "lock": false,
        "mcp": false,
        "agent": false,
    })
}

/// The two tonic services, to add to the gRPC server.
pub fn services(
    nacos: Nacos,
) -> (
    pb::request_server::RequestServer<NacosGrpc>,
    pb::bi_request_stream_server::BiRequestStreamServer<NacosGrpc>,
) {
    let svc = NacosGrpc { nacos };
    (
        pb::request_server::RequestServer::new(svc.clone()),
        pb::bi_request_stream_server::BiRequestStreamServer::new(svc),
    )
}

/// The tonic service implementing both Nacos gRPC services.
#[derive(Clone)]
pub struct NacosGrpc {
    nacos: Nacos,
}

type BiStream = Pin<Box<dyn Stream<Item = Result<pb::Payload, Status>> + Send>>;

#[tonic::async_trait]
impl pb::request_server::Request for NacosGrpc {
    async fn request(
        &self,
        request: tonic::Request<pb::Payload>,
    ) -> Result<tonic::Response<pb::Payload>, Status> {
        refuse_while_loading(&self.nacos)?;
        let peer = request.remote_addr();
        let reply = self.nacos.unary(peer, request.into_inner()).await;
        Ok(tonic::Response::new(reply))
    }
}

#[tonic::async_trait]
impl pb::bi_request_stream_server::BiRequestStream for NacosGrpc {
    type requestBiStreamStream = BiStream;

    async fn request_bi_stream(
        &self,
        request: tonic::Request<Streaming<pb::Payload>>,
    ) -> Result<tonic::Response<BiStream>, Status> {
        refuse_while_loading(&self.nacos)?;
        let peer = request
            .remote_addr()
            .ok_or_else(|| Status::internal("no peer address"))?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND);
        tokio::spawn(self.nacos.clone().run_stream(peer, inbound, tx));
        // The stream ends in an error, never with OK: the Python SDK (3.2.0) reconnects only
        // when its stream iterator raises; a stream that ends cleanly (the server stopping, a
        // connection closed by detection) left it talking to a registry that no longer knew
        // its connection, for good.
        let ended = futures::stream::once(async {
            Err(Status::unavailable(
                "the registry ended this connection; reconnect",
            ))
        });
        Ok(tonic::Response::new(Box::pin(
            ReceiverStream::new(rx).map(Ok).chain(ended),
        )))
    }
}

/// UNAVAILABLE while the registry loads its store (Nacos SDKs retry their server check).
fn refuse_while_loading(nacos: &Nacos) -> Result<(), Status> {
    if nacos.registry().is_loading() {
        return Err(Status::unavailable(
            "the registry is loading its store; retry shortly",
        ));
    }
    Ok(())
}
