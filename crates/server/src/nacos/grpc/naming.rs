//! Unary requests: checks, auth, and the naming requests (register, query, subscribe).

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use gangway_core::model::{Instance, ProbeSpec, ServiceKey};
use gangway_proto::nacos as pb;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::conn::{Conn, PendingPush, Sub};
use super::reply::{Refusal, allow_read, body_of, error, notify_body, ok, raw_payload, type_of};
use super::request::NamingRequest;
use super::{BAD_GATEWAY, INVALID_PARAM, MAX_PENDING, NO_HANDLER, UN_REGISTER};
use crate::auth::{Caller, Credentials, Rule};
use crate::engine::{Liveness, LivenessRequest, RegistryError, SubscriberInfo, SubscriberKind};
use crate::error::ApiError;
use crate::nacos::Nacos;

impl Nacos {
    pub(super) async fn unary(&self, peer: Option<SocketAddr>, p: pb::Payload) -> pb::Payload {
        let ty = type_of(&p).to_owned();
        let Some(body) = body_of(&p) else {
            return error(
                "",
                Refusal::new(BAD_GATEWAY, "the payload body is not a JSON object"),
            );
        };
        let rid = body
            .get("requestId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let Some(peer) = peer else {
            return error(&rid, Refusal::new(500, "no peer address"));
        };
        match ty.as_str() {
            "ServerCheckRequest" => {
                let conn = self.conn_or_new(peer);
                ok(
                    "ServerCheckResponse",
                    &rid,
                    json!({"connectionId": conn.id, "supportAbilityNegotiation": true}),
                )
            }
            "HealthCheckRequest" => match self.registered(peer) {
                Some(_) => ok("HealthCheckResponse", &rid, json!({})),
                None => error(
                    &rid,
                    Refusal::new(UN_REGISTER, "connection is not registered"),
                ),
            },
            "InstanceRequest"
            | "BatchInstanceRequest"
            | "PersistentInstanceRequest"
            | "ServiceQueryRequest"
            | "SubscribeServiceRequest"
            | "ServiceListRequest" => {
                let Some((conn, session)) = self.registered(peer) else {
                    return error(
                        &rid,
                        Refusal::new(UN_REGISTER, "connection is not registered"),
                    );
                };
                let request: NamingRequest = match serde_json::from_value(body) {
                    Ok(r) => r,
                    Err(e) => {
                        return error(
                            &rid,
                            Refusal::new(INVALID_PARAM, format!("malformed {ty}: {e}")),
                        );
                    }
                };
                let caller = match self.caller_of(&p).await {
                    Ok(c) => c,
                    Err(r) => return error(&rid, r),
                };
                match self
                    .naming(&ty, request, &caller, &conn, &session, peer)
                    .await
                {
                    Ok((reply_ty, extra)) => ok(reply_ty, &rid, extra),
                    Err(r) => error(&rid, r),
                }
            }
            other => error(
                &rid,
                Refusal::new(
                    NO_HANDLER,
                    format!(
                        "gangway serves the Nacos naming service only; {other} is not supported \
                         (config center, AI, lock and fuzzy watch are not), see docs/compat.md"
                    ),
                ),
            ),
        }
    }

    /// The caller of one request: its `accessToken` header (what the Nacos SDKs send on every
    /// request once logged in). Errors: an `accessToken` that is not valid.
    pub(super) async fn caller_of(&self, p: &pb::Payload) -> Result<Caller, Refusal> {
        let token = p
            .metadata
            .as_ref()
            .and_then(|m| m.headers.get("accessToken"))
            .filter(|t| !t.is_empty())
            .cloned();
        Ok(self
            .registry()
            .config()
            .security
            .authority
            .authenticate(token.map(Credentials::Token))
            .await
            .map_err(ApiError::from)?)
    }

    pub(super) async fn naming(
        &self,
        ty: &str,
        r: NamingRequest,
        caller: &Caller,
        conn: &Arc<Conn>,
        session: &str,
        peer: SocketAddr,
    ) -> Result<(&'static str, Value), Refusal> {
        let registry = self.registry();
        match ty {
            "InstanceRequest" => {
                let (service, kind, instance, disabled) = r.single_instance()?;
                match kind.as_str() {
                    "registerInstance" => {
                        self.register(
                            caller,
                            service,
                            instance,
                            disabled,
                            LivenessRequest::Session(session.to_owned()),
                        )
                        .await?;
                    }
                    "deregisterInstance" => {
                        // Nacos ignores a deregistration of what this connection does not own.
                        match registry.deregister_on_session(session, &service, &instance.key) {
                            Ok(_)
                            | Err(RegistryError::UnknownInstance { .. })
                            | Err(RegistryError::NotOnThisSession { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    other => {
                        return Err(unsupported_type("InstanceRequest", &other));
                    }
                }
                Ok(("InstanceResponse", json!({"type": kind})))
            }
            "BatchInstanceRequest" => {
                let service = r.service()?;
                let kind = r.kind.clone().unwrap_or_default();
                if kind != "batchRegisterInstance" {
                    return Err(unsupported_type("BatchInstanceRequest", &kind));
                }
                let mut wanted = Vec::new();
                for w in r.instances.as_deref().unwrap_or_default() {
                    wanted.push(w.to_instance()?);
                }
                // Refused whole before anything of the batch changes.
                let max = registry.config().session_limits.instances;
                if wanted.len() > max {
                    return Err(RegistryError::LimitExceeded {
                        limit: "instances-per-session",
                        max,
                    }
                    .into());
                }
                // The batch replaces what this connection holds in the service: what it held
                // and the batch leaves out goes only once every registration of the batch was
                // taken, so a refusal never costs the connection an instance it had.
                let (_, entries) = registry.entries(&service);
                let left_out: Vec<_> = entries
                    .into_iter()
                    .filter(|e| matches!(&e.liveness, Liveness::Session(s) if s == session))
                    .filter(|e| !wanted.iter().any(|(i, _)| i.key == e.instance.key))
                    .map(|e| e.instance.key)
                    .collect();
                for (instance, disabled) in wanted {
                    self.register(
                        caller,
                        service.clone(),
                        instance,
                        disabled,
                        LivenessRequest::Session(session.to_owned()),
                    )
                    .await?;
                }
                for key in left_out {
                    let _ = registry.deregister_on_session(session, &service, &key);
                }
                Ok(("BatchInstanceResponse", json!({"type": kind})))
            }
            "PersistentInstanceRequest" => {
                let (service, kind, instance, disabled) = r.single_instance()?;
                match kind.as_str() {
                    "registerInstance" => {
                        self.register(
                            caller,
                            service,
                            instance,
                            disabled,
                            LivenessRequest::Probe(ProbeSpec::default()),
                        )
                        .await?;
                    }
                    "deregisterInstance" => {
                        let owner = registry.owner(&service, &instance.key);
                        caller
                            .allow(Rule::Instance, &service.namespace, owner.as_deref())
                            .map_err(ApiError::from)?;
                        match registry.deregister(&service, &instance.key, false).await {
                            Ok(_) | Err(RegistryError::UnknownInstance { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    other => {
                        return Err(unsupported_type("PersistentInstanceRequest", &other));
                    }
                }
                Ok(("InstanceResponse", json!({"type": kind})))
            }
            "ServiceQueryRequest" => {
                let service = r.service()?;
                allow_read(caller, &service.namespace)?;
                // A restarted registry's view is partial until its clients re-registered: a
                // pull is refused meanwhile, as native pulls are (the SDK keeps its cache).
                if registry.warming_up() {
                    return Err(ApiError::WarmingUp.into());
                }
                let healthy_only = r.healthy_only.or(r.health_only).unwrap_or(false);
                let clusters = r.cluster.clone().unwrap_or_default();
                let (_, info) = self.service_info(&service, &clusters, healthy_only, false);
                Ok(("QueryServiceResponse", json!({"serviceInfo": info})))
            }
            "SubscribeServiceRequest" => {
                let service = r.service()?;
                allow_read(caller, &service.namespace)?;
                let clusters = r.clusters.clone().unwrap_or_default();
                if r.subscribe.unwrap_or(true) {
                    self.subscribe(conn, session, &service, &clusters, peer, caller)?;
                    // Subscribed, but no partial view in the answer while the registry warms
                    // up: an empty host list, which the Python, Go and Rust SDKs ignore (their
                    // cache stays; nacos.md 3.6) and which does not raise in the application
                    // as an error answer would. The push after the warm-up brings the view.
                    if registry.warming_up() {
                        let (_, mut info) = self.service_info(&service, &clusters, false, false);
                        info.hosts.clear();
                        return Ok(("SubscribeServiceResponse", json!({"serviceInfo": info})));
                    }
                } else {
                    let sub = conn.lock().subs.remove(&service);
                    if let Some(sub) = sub {
                        sub.task.abort();
                        registry.unsubscribe(&sub.id);
                    }
                }
                let (_, info) = self.service_info(&service, &clusters, false, false);
                Ok(("SubscribeServiceResponse", json!({"serviceInfo": info})))
            }
            "ServiceListRequest" => {
                let namespace = r.namespace.as_deref().filter(|n| !n.is_empty());
                let group = r.group_name.as_deref().filter(|g| !g.is_empty());
                allow_read(
                    caller,
                    namespace.unwrap_or(gangway_core::model::DEFAULT_NAMESPACE),
                )?;
                let (count, names) = crate::nacos::http::service_page(
                    self,
                    namespace.unwrap_or(gangway_core::model::DEFAULT_NAMESPACE),
                    group.unwrap_or(gangway_core::model::DEFAULT_GROUP),
                    r.page_no.unwrap_or(1).max(1),
                    r.page_size.unwrap_or(10),
                );
                Ok((
                    "ServiceListResponse",
                    json!({"count": count, "serviceNames": names}),
                ))
            }
            _ => Err(Refusal::new(NO_HANDLER, format!("no handler for {ty}"))),
        }
    }

    pub(super) async fn register(
        &self,
        caller: &Caller,
        service: ServiceKey,
        instance: Instance,
        disabled: bool,
        liveness: LivenessRequest,
    ) -> Result<(), Refusal> {
        let owner = self.registry().owner(&service, &instance.key);
        caller
            .allow(Rule::Register, &service.namespace, owner.as_deref())
            .map_err(ApiError::from)?;
        // Disabled from its first revision, with its offline mark: never published enabled.
        let mut instance = instance;
        instance.enabled = !disabled;
        self.registry()
            .register_as(service, instance, liveness, caller.clone())
            .await?;
        Ok(())
    }

    pub(super) fn subscribe(
        &self,
        conn: &Arc<Conn>,
        session: &str,
        service: &ServiceKey,
        clusters: &str,
        peer: SocketAddr,
        caller: &Caller,
    ) -> Result<(), Refusal> {
        let mut st = conn.lock();
        if st.subs.contains_key(service) {
            return Ok(());
        }
        let Some(tx) = st.tx.clone() else {
            return Err(Refusal::new(UN_REGISTER, "connection has no stream"));
        };
        let info = SubscriberInfo {
            client_name: st.client_name.clone(),
            session: Some(session.to_owned()),
            // Nacos SDKs keep their last list when pushed one with no usable instance.
            ignores_empty_lists: true,
            ..SubscriberInfo::new(SubscriberKind::Session, peer.to_string())
        };
        let (sub, rx) = self.registry().subscribe(service, info)?;
        let pushes = self.registry().full_pushes(sub.clone(), rx);
        let nacos = self.clone();
        let conn2 = conn.clone();
        let key = service.clone();
        let clusters = clusters.to_owned();
        let sub_id = sub.clone();
        let answer_wait = self.registry().config().resend_interval;
        // A reload that removes or changes the credential the subscription was made with ends
        // it (the connection stays: its other requests carry their own accessToken).
        let revoked = self.registry().config().security.authority.revoked(caller);
        let task = tokio::spawn(async move {
            let pushes = pushes.take_until(revoked);
            futures::pin_mut!(pushes);
            while pushes.next().await.is_some() {
                let info = nacos.push_info(&key, &clusters);
                let rid = format!("push-{}", nacos.next_id());
                let (answered_tx, answered) = oneshot::channel();
                {
                    let mut st = conn2.lock();
                    if st.pending.len() >= MAX_PENDING {
                        st.pending.clear();
                    }
                    let push = PendingPush {
                        subscriber: sub_id.clone(),
                        revision: info.revision,
                        answered: answered_tx,
                    };
                    st.pending.insert(rid.clone(), push);
                }
                let body = notify_body(&rid, &key, &info.json);
                if tx
                    .send(raw_payload("NotifySubscriberRequest", body))
                    .await
                    .is_err()
                {
                    break;
                }
                // One push in flight per subscription, as Nacos's server waits for each push's
                // answer (Nacos v2: `PushExecuteTask`, `pushTaskTimeout`): the next one goes
                // when this one is answered or after `resend_interval`, and the changes
                // meanwhile coalesce into it. A client busy decoding pushes is sent them at
                // its own pace instead of queueing more than it can read.
                let _ = tokio::time::timeout(answer_wait, answered).await;
            }
            // Ended by a revocation (or the registry): forget it, unless it was replaced.
            let mut st = conn2.lock();
            if st.subs.get(&key).is_some_and(|s| s.id == sub_id) {
                st.subs.remove(&key);
                drop(st);
                nacos.registry().unsubscribe(&sub_id);
            }
        });
        st.subs.insert(
            service.clone(),
            Sub {
                id: sub,
                task: task.abort_handle(),
            },
        );
        Ok(())
    }
}

/// The refusal of a request whose `type` this server does not take (Nacos answers
/// INVALID_PARAM), naming the request and the type.
fn unsupported_type(request: &str, kind: &str) -> Refusal {
    Refusal::new(
        INVALID_PARAM,
        format!("unsupported {request} type {kind:?}"),
    )
}
