//! v1 heartbeats (`/nacos/v1/ns/instance/beat`): lease renewal, and registration from the
//! beat body when the instance is unknown.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gangway_core::model::{DEFAULT_CLUSTER, Instance, InstanceKey};
use gangway_core::validate;
use serde::Serialize;
use serde_json::Value;

use super::error::NacosError;
use super::instance::{Registration, register_parsed};
use super::params::{Params, parse_port};
use super::{BEAT_NOT_FOUND, BEAT_OK, allow_instance, allow_read};
use crate::auth::Caller;
use crate::engine::RegistryError;
use crate::nacos::Nacos;
use crate::nacos::model::{beat_interval_for, json_string};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BeatReply {
    client_beat_interval: u64,
    code: u32,
    light_beat_enabled: bool,
}

pub(super) async fn v1_beat(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let beat: Option<serde_json::Map<String, Value>> = match p.get("beat") {
        None => None,
        Some(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(m)) => Some(m),
            _ => {
                return Err(NacosError::bad(format!(
                    "Param 'beat' is not a JSON object: {raw}"
                )));
            }
        },
    };
    let from_beat = |k: &str| -> Option<String> {
        beat.as_ref()
            .and_then(|b| b.get(k))
            .filter(|v| !v.is_null())
            .map(|v| json_string(v.clone()))
            .filter(|v| !v.is_empty())
    };
    let service = p.service()?;
    let ip = from_beat("ip")
        .or_else(|| p.get("ip").map(str::to_owned))
        .ok_or_else(|| NacosError::missing("ip"))?;
    let port = from_beat("port")
        .or_else(|| p.get("port").map(str::to_owned))
        .ok_or_else(|| NacosError::missing("port"))?;
    let cluster = from_beat("cluster")
        .or_else(|| {
            p.get("clusterName")
                .or_else(|| p.get("cluster"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| DEFAULT_CLUSTER.to_owned());
    let key = InstanceKey::new(&ip, parse_port(&port)?, &cluster);
    validate::instance_key(&key).map_err(NacosError::invalid)?;
    // A beat for an unknown instance re-registers it (rule `register`, checked there).
    if nacos.registry().instance(&service, &key).is_ok() {
        allow_instance(&nacos, &caller, &service, &key)?;
    } else if beat.is_none() {
        allow_read(&caller, &service)?;
    }
    let registry = nacos.registry();
    let reply = |code: u32, ttl_ms: u64| {
        axum::Json(BeatReply {
            client_beat_interval: beat_interval_for(ttl_ms),
            code,
            light_beat_enabled: true,
        })
        .into_response()
    };
    let default_ttl = registry.config().liveness.lease_ttl.as_millis() as u64;
    match registry.heartbeat(&service, &key) {
        Ok(ttl) => Ok(reply(BEAT_OK, ttl.as_millis() as u64)),
        // Kept alive by a session or a probe: nothing to renew, and nothing wrong.
        Err(RegistryError::NotLeaseKept { .. }) => Ok(reply(BEAT_OK, default_ttl)),
        Err(RegistryError::UnknownInstance { .. }) => {
            let Some(beat) = &beat else {
                return Ok(reply(BEAT_NOT_FOUND, default_ttl));
            };
            // A full beat re-registers the instance (Nacos `handleBeat`).
            let mut instance = Instance::new(key.clone());
            if let Some(w) = beat.get("weight").and_then(Value::as_f64) {
                instance.weight = w;
            }
            if let Some(Value::Object(m)) = beat.get("metadata") {
                instance.metadata = m
                    .iter()
                    .map(|(k, v)| (k.clone(), json_string(v.clone())))
                    .collect();
            }
            let ephemeral = beat
                .get("ephemeral")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let r = Registration {
                service,
                instance,
                ephemeral,
                enabled: true,
            };
            register_parsed(&nacos, &caller, r).await?;
            tracing::info!(instance = %key, "nacos v1 beat re-registered an unknown instance");
            Ok(reply(BEAT_OK, default_ttl))
        }
        Err(e) => Err(e.into()),
    }
}
