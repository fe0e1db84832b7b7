//! The bi-directional stream: connection setup, push acks, failed-client detection, close.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gangway_proto::nacos as pb;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Streaming;

use super::conn::Conn;
use super::reply::{body_of, payload, type_of};
use super::server_abilities;
use crate::nacos::{CLIENT_NAME_PREFIX, Nacos};

impl Nacos {
    pub(super) async fn run_stream(
        self,
        peer: SocketAddr,
        mut inbound: Streaming<pb::Payload>,
        tx: mpsc::Sender<pb::Payload>,
    ) {
        let mut conn: Option<Arc<Conn>> = None;
        let mut closing = self.inner.closing.subscribe();
        loop {
            if *closing.borrow_and_update() {
                break;
            }
            let stop = async {
                match &conn {
                    Some(c) => c.stop.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(p)) => self.on_stream(peer, p, &tx, &mut conn).await,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%peer, %status, "nacos stream failed");
                        break;
                    }
                },
                _ = tx.closed() => break,
                _ = stop => break,
                changed = closing.changed() => {
                    if changed.is_err() || *closing.borrow_and_update() {
                        break;
                    }
                }
            }
        }
        if let Some(conn) = conn {
            self.close(peer, &conn);
        }
    }

    pub(super) async fn on_stream(
        &self,
        peer: SocketAddr,
        p: pb::Payload,
        tx: &mpsc::Sender<pb::Payload>,
        conn: &mut Option<Arc<Conn>>,
    ) {
        let ty = type_of(&p).to_owned();
        if let Some(c) = conn.as_ref() {
            c.touch();
        }
        let Some(body) = body_of(&p) else {
            tracing::debug!(%peer, %ty, "nacos stream message without a JSON body");
            return;
        };
        match ty.as_str() {
            "ConnectionSetupRequest" => {
                let c = self.conn_or_new(peer);
                let label = |k: &str| {
                    body.get("labels")
                        .and_then(|l| l.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                let version = body
                    .get("clientVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let app = label("AppName");
                let client_name = [CLIENT_NAME_PREFIX.to_owned() + "-grpc", version, app]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                {
                    let mut st = c.lock();
                    if st.session.is_none() {
                        let session = self.registry().open_session(
                            peer.to_string(),
                            client_name.clone(),
                            // Nacos has no client id: one host's connections are one client.
                            format!("nacos@{}", peer.ip()),
                        );
                        tracing::debug!(%peer, session, client = %client_name, "nacos connection set up");
                        st.session = Some(session);
                    }
                    st.client_name = client_name;
                    st.tx = Some(tx.clone());
                    st.last_active = Some(Instant::now());
                    if st.detector.is_none() {
                        let task = tokio::spawn(self.clone().detect(c.clone(), tx.clone()));
                        st.detector = Some(task.abort_handle());
                    }
                }
                *conn = Some(c);
                let ack = json!({
                    "requestId": format!("setup-{}", self.next_id()),
                    "headers": {},
                    "module": "internal",
                    "abilityTable": server_abilities(),
                });
                let _ = tx.send(payload("SetupAckRequest", &ack)).await;
            }
            "NotifySubscriberResponse" => {
                let Some(c) = conn.as_ref() else { return };
                let rid = body.get("requestId").and_then(Value::as_str).unwrap_or("");
                let success = body
                    .get("resultCode")
                    .and_then(Value::as_i64)
                    .is_none_or(|code| code == 200);
                let Some(push) = c.lock().pending.remove(rid) else {
                    return;
                };
                let _ = push.answered.send(());
                if success {
                    self.registry().ack(&push.subscriber, push.revision);
                }
            }
            // Answers to what the server sent (setup ack, detection, reset): nothing to do.
            _ => tracing::trace!(%peer, %ty, "nacos stream message ignored"),
        }
    }

    /// Client detection (Nacos's `ClientDetectionRequest`): a connection silent for
    /// `detect_after` is probed; without any answer within `detect_timeout` its stream is ended,
    /// which releases its instances and subscriptions.
    pub(super) async fn detect(self, conn: Arc<Conn>, tx: mpsc::Sender<pb::Payload>) {
        let (after, timeout) = (self.inner.detect_after, self.inner.detect_timeout);
        let tick = (after / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::time::sleep(tick).await;
            let last = conn.lock().last_active.unwrap_or(conn.created);
            if last.elapsed() < after {
                continue;
            }
            let probe = json!({
                "requestId": format!("detect-{}", self.next_id()),
                "headers": {},
                "module": "internal",
            });
            let sent = Instant::now();
            if tx
                .send(payload("ClientDetectionRequest", &probe))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(timeout).await;
            if conn.lock().last_active.is_none_or(|t| t < sent) {
                tracing::info!(connection = %conn.id, "nacos client detection: no answer, closing the connection");
                conn.stop.notify_one();
                return;
            }
        }
    }

    /// Server shutdown: sends every connection a `ConnectResetRequest` (the client reconnects,
    /// to another server of its list if it has one) and ends every stream, so the gRPC server's
    /// graceful shutdown does not wait on them.
    pub async fn reset_all(&self) {
        let conns: Vec<Arc<Conn>> = self.conns().values().cloned().collect();
        for conn in conns {
            let tx = conn.lock().tx.clone();
            if let Some(tx) = tx {
                let reset = json!({
                    "requestId": format!("reset-{}", self.next_id()),
                    "headers": {},
                    "module": "internal",
                    "serverIp": "",
                    "serverPort": "",
                    "connectionId": conn.id,
                });
                let _ = tx.try_send(payload("ConnectResetRequest", &reset));
            }
        }
        self.inner.closing.send_replace(true);
    }

    /// Ends a connection: its subscriptions, then its session (its instances go at once).
    pub(super) fn close(&self, peer: SocketAddr, conn: &Arc<Conn>) {
        let (subs, session) = {
            let mut st = conn.lock();
            st.tx = None;
            st.pending.clear();
            if let Some(d) = st.detector.take() {
                d.abort();
            }
            (std::mem::take(&mut st.subs), st.session.take())
        };
        for (_, sub) in subs {
            sub.task.abort();
            self.registry().unsubscribe(&sub.id);
        }
        if let Some(session) = session {
            self.registry().close_session(&session);
            tracing::debug!(%peer, session, "nacos connection closed");
        }
        let mut conns = self.conns();
        if conns.get(&peer).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            conns.remove(&peer);
        }
    }
}
