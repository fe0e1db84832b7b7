//! v1 instance routes: register, deregister, modify, detail.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use serde_json::{Value, json};

use super::error::NacosError;
use super::params::Params;
use super::{allow_instance, allow_read};
use crate::auth::{Caller, Rule};
use crate::engine::{LivenessRequest, Patch, RegistryError};
use crate::error::ApiError;
use crate::nacos::Nacos;
use crate::nacos::model::{grouped, instance_id, preserved_timing};

/// A fully parsed registration.
pub(super) struct Registration {
    pub(super) service: ServiceKey,
    pub(super) instance: Instance,
    pub(super) ephemeral: bool,
    pub(super) enabled: bool,
}

pub(super) fn registration(p: &Params) -> Result<Registration, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    let weight = p.weight()?.unwrap_or(gangway_core::model::DEFAULT_WEIGHT);
    let metadata = p.instance_metadata()?.unwrap_or_default();
    let enabled = p.enabled()?.unwrap_or(true);
    let ephemeral = p.bool("ephemeral")?.unwrap_or(true);
    p.bool("healthy")?;
    let mut instance = Instance::new(key);
    instance.weight = weight;
    instance.metadata = metadata;
    instance.ephemeral = ephemeral;
    Ok(Registration {
        service,
        instance,
        ephemeral,
        enabled,
    })
}

/// Registers a parsed registration: ephemeral ones on a lease (TTL and delete timeout from
/// the `preserved.*` metadata, checked by [`preserved_timing`], else the server's), persistent
/// ones with the default TCP probe.
pub(super) async fn register_parsed(
    nacos: &Nacos,
    caller: &Caller,
    r: Registration,
) -> Result<(), NacosError> {
    let owner = nacos.registry().owner(&r.service, &r.instance.key);
    caller
        .allow(Rule::Register, &r.service.namespace, owner.as_deref())
        .map_err(ApiError::from)?;
    let timing = preserved_timing(&r.instance.metadata).map_err(NacosError::invalid)?;
    let liveness = if r.ephemeral {
        LivenessRequest::Lease {
            ttl: timing.beat_timeout,
            delete_timeout: timing.delete_timeout,
        }
    } else {
        LivenessRequest::Probe(gangway_core::model::ProbeSpec::default())
    };
    // Disabled from its first revision, with its offline mark: never published enabled.
    let mut instance = r.instance;
    instance.enabled = r.enabled;
    nacos
        .registry()
        .register_as(r.service, instance, liveness, caller.clone())
        .await?;
    Ok(())
}

pub(super) async fn v1_register(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let r = registration(&p)?;
    register_parsed(&nacos, &caller, r).await?;
    Ok("ok")
}

pub(super) async fn v1_deregister(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let (service, key) = instance_target(&nacos, &caller, &p)?;
    p.bool("ephemeral")?;
    match nacos.registry().deregister(&service, &key, false).await {
        // Nacos answers ok for an unknown instance too.
        Ok(_) | Err(RegistryError::UnknownInstance { .. }) => Ok("ok"),
        Err(e) => Err(e.into()),
    }
}

/// The service and instance `p` names, for a caller allowed to change that instance.
pub(super) fn instance_target(
    nacos: &Nacos,
    caller: &Caller,
    p: &Params,
) -> Result<(ServiceKey, InstanceKey), NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    allow_instance(nacos, caller, &service, &key)?;
    Ok((service, key))
}

pub(super) fn patch(p: &Params) -> Result<Patch, NacosError> {
    Ok(Patch {
        weight: p.weight()?,
        metadata: p.instance_metadata()?,
        enabled: p.enabled()?,
        until_gone: false,
        force: false,
    })
}

pub(super) async fn v1_modify(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let (service, key) = instance_target(&nacos, &caller, &p)?;
    let patch = patch(&p)?;
    p.bool("ephemeral")?;
    p.bool("healthy")?;
    nacos.registry().update(&service, &key, patch).await?;
    Ok("ok")
}

pub(super) fn detail_json(nacos: &Nacos, p: &Params) -> Result<Value, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    let (_, entries) = nacos.registry().entries(&service);
    let entry = entries
        .iter()
        .find(|e| e.instance.key == key)
        .ok_or_else(|| {
            NacosError::not_found(format!(
                "no ips found for cluster {} in service {}",
                key.cluster,
                grouped(&service)
            ))
        })?;
    let i = &entry.instance;
    Ok(json!({
        "service": grouped(&service),
        "serviceName": service.service,
        "groupName": service.group,
        "namespaceId": service.namespace,
        "ip": i.key.ip,
        "port": i.key.port,
        "clusterName": i.key.cluster,
        "weight": i.weight,
        "healthy": i.healthy,
        "enabled": i.enabled,
        "ephemeral": i.ephemeral,
        "instanceId": instance_id(&service, i),
        "metadata": i.metadata,
    }))
}

pub(super) async fn v1_detail(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    allow_read(&caller, &p.service()?)?;
    Ok(axum::Json(detail_json(&nacos, &p)?).into_response())
}
