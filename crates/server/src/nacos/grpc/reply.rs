//! Refusals and the payloads sent back: responses, errors, pushes.

use std::collections::HashMap;

use gangway_core::model::ServiceKey;
use gangway_proto::nacos as pb;
use serde_json::{Value, json};

use super::{INVALID_PARAM, INVALID_SERVER_STATUS, NO_RIGHT};
use crate::auth::{Caller, Rule};
use crate::engine::RegistryError;
use crate::error::ApiError;

/// A request refused: Nacos `errorCode` and message.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) code: i32,
    pub(super) message: String,
}

impl Refusal {
    pub(super) fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<RegistryError> for Refusal {
    /// The one place the Nacos gRPC layer maps an engine refusal (through its REST class).
    fn from(e: RegistryError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        let code = match &e {
            ApiError::Invalid(_)
            | ApiError::Conflict { .. }
            | ApiError::MethodNotAllowed
            | ApiError::UriTooLong { .. }
            | ApiError::HeadersTooLarge { .. } => INVALID_PARAM,
            ApiError::NotFound { .. } => 404,
            ApiError::PayloadTooLarge { .. } => INVALID_PARAM,
            ApiError::WarmingUp | ApiError::Overloaded { .. } | ApiError::RequestTimeout { .. } => {
                INVALID_SERVER_STATUS
            }
            ApiError::Store(_) => 500,
            ApiError::LimitExceeded { .. } => 429,
            // Nacos's answer to a missing or refused accessToken.
            ApiError::Unauthenticated { .. }
            | ApiError::Forbidden { .. }
            | ApiError::UnsupportedMediaType { .. } => NO_RIGHT,
        };
        Self::new(code, e.to_string())
    }
}

/// Rule `read` on `namespace`.
pub(super) fn allow_read(caller: &Caller, namespace: &str) -> Result<(), Refusal> {
    Ok(caller
        .allow(Rule::Read, namespace, None)
        .map_err(ApiError::from)?)
}

/// A payload of `ty` with `body` as JSON.
pub fn payload(ty: &str, body: &Value) -> pb::Payload {
    raw_payload(ty, serde_json::to_vec(body).unwrap_or_default())
}

/// A payload of type `ty` whose JSON body is already encoded.
pub(super) fn raw_payload(ty: &str, body: Vec<u8>) -> pb::Payload {
    pb::Payload {
        metadata: Some(pb::Metadata {
            r#type: ty.to_owned(),
            client_ip: String::new(),
            headers: HashMap::new(),
        }),
        body: Some(pb::Any {
            type_url: String::new(),
            value: body,
        }),
    }
}

/// The JSON body of a `NotifySubscriberRequest` (Nacos v2 protocol) carrying `service_info`,
/// already encoded and shared by every subscriber pushed the same revision.
pub(super) fn notify_body(request_id: &str, service: &ServiceKey, service_info: &str) -> Vec<u8> {
    let head = json!({
        "requestId": request_id,
        "headers": {},
        "module": "naming",
        "namespace": service.namespace,
        "serviceName": service.service,
        "groupName": service.group,
    })
    .to_string();
    // `{...,"serviceInfo":<service_info>}`: the head without its closing brace, then the field.
    let mut body = Vec::with_capacity(head.len() + service_info.len() + 16);
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"serviceInfo\":");
    body.extend_from_slice(service_info.as_bytes());
    body.push(b'}');
    body
}

/// A successful response of `ty`: the common fields plus `extra`'s.
pub(super) fn ok(ty: &str, request_id: &str, extra: Value) -> pb::Payload {
    let mut body = json!({
        "resultCode": 200,
        "errorCode": 0,
        "success": true,
        "requestId": request_id,
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    payload(ty, &body)
}

/// An `ErrorResponse`.
pub(super) fn error(request_id: &str, r: Refusal) -> pb::Payload {
    payload(
        "ErrorResponse",
        &json!({
            "resultCode": 500,
            "errorCode": r.code,
            "message": r.message,
            "success": false,
            "requestId": request_id,
        }),
    )
}

pub(super) fn body_of(p: &pb::Payload) -> Option<Value> {
    let bytes = p.body.as_ref().map(|b| b.value.as_slice()).unwrap_or(b"{}");
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

pub(super) fn type_of(p: &pb::Payload) -> &str {
    p.metadata.as_ref().map(|m| m.r#type.as_str()).unwrap_or("")
}
