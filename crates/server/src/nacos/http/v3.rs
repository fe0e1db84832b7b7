//! The v3 client and admin instance paths, in the `{code, message, data}` envelope.

use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::error::{NacosError, V3};
use super::instance::{detail_json, instance_target, patch, register_parsed, registration};
use super::params::Params;
use super::{allow_instance, allow_read};
use crate::auth::Caller;
use crate::engine::RegistryError;
use crate::nacos::Nacos;
use crate::nacos::model::grouped;

pub(super) async fn v3_client_register(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> V3 {
    V3(async {
        if p.bool("heartBeat")?.unwrap_or(false) {
            let service = p.service()?;
            let key = p.instance_key()?;
            allow_instance(&nacos, &caller, &service, &key)?;
            return match nacos.registry().heartbeat(&service, &key) {
                Ok(_) | Err(RegistryError::NotLeaseKept { .. }) => Ok(json!("ok")),
                Err(RegistryError::UnknownInstance { .. }) => Err(NacosError {
                    status: StatusCode::NOT_FOUND,
                    code: 21003,
                    message: format!("instance {key} not found in {}", grouped(&service)),
                }),
                Err(e) => Err(e.into()),
            };
        }
        register_parsed(&nacos, &caller, registration(&p)?).await?;
        Ok(json!("ok"))
    }
    .await)
}

pub(super) async fn v3_register(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        register_parsed(&nacos, &caller, registration(&p)?).await?;
        Ok(json!("ok"))
    }
    .await)
}

pub(super) async fn v3_deregister(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        let (service, key) = instance_target(&nacos, &caller, &p)?;
        match nacos.registry().deregister(&service, &key, false).await {
            Ok(_) => Ok(json!("ok")),
            Err(RegistryError::UnknownInstance { .. }) => Err(NacosError {
                status: StatusCode::NOT_FOUND,
                code: 21003,
                message: format!("instance {key} not found in {}", grouped(&service)),
            }),
            Err(e) => Err(e.into()),
        }
    }
    .await)
}

pub(super) async fn v3_modify(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        let (service, key) = instance_target(&nacos, &caller, &p)?;
        let patch = patch(&p)?;
        nacos.registry().update(&service, &key, patch).await?;
        Ok(json!("ok"))
    }
    .await)
}

pub(super) async fn v3_detail(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(p.service()
        .and_then(|s| allow_read(&caller, &s))
        .and_then(|()| detail_json(&nacos, &p)))
}

/// v3 client list: the instance array with the protect threshold applied.
pub(super) async fn v3_client_list(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3((|| {
        let service = p.service()?;
        let clusters = p
            .get("clusterName")
            .or_else(|| p.get("clusters"))
            .unwrap_or("");
        let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
        allow_read(&caller, &service)?;
        let (_, info) = nacos.service_info(&service, clusters, healthy_only, true);
        Ok(serde_json::to_value(info.hosts).unwrap_or(Value::Null))
    })())
}

/// v3 admin list: every instance (disabled ones too), real health flags, no threshold.
pub(super) async fn v3_admin_list(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3((|| {
        let service = p.service()?;
        let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
        let clusters = p
            .get("clusterName")
            .or_else(|| p.get("clusters"))
            .unwrap_or("");
        allow_read(&caller, &service)?;
        let wanted = crate::nacos::model::cluster_list(clusters);
        let (_, entries) = nacos.registry().entries(&service);
        let hosts: Vec<_> = entries
            .iter()
            .filter(|e| wanted.is_empty() || wanted.contains(&e.instance.key.cluster.as_str()))
            .filter(|e| !healthy_only || e.instance.healthy)
            .map(|e| crate::nacos::model::nacos_instance(&service, e, false))
            .collect();
        Ok(serde_json::to_value(hosts).unwrap_or(Value::Null))
    })())
}
