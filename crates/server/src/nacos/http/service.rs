//! v1 service routes: create, update, delete, get, list.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gangway_core::model::{DEFAULT_NAMESPACE, ServiceKey};
use gangway_core::validate;
use serde_json::{Value, json};

use super::allow_read;
use super::error::NacosError;
use super::params::Params;
use crate::auth::{Caller, Rule};
use crate::error::ApiError;
use crate::nacos::Nacos;
use crate::nacos::model::grouped;

pub(super) fn service_exists(
    nacos: &Nacos,
    key: &ServiceKey,
) -> Option<crate::engine::ServiceSummary> {
    nacos.registry().service(key).ok().filter(|s| {
        s.instances > 0 || s.settings != gangway_core::model::ServiceSettings::default()
    })
}

/// The service `p` names, for a caller allowed to change its settings; it must exist (Nacos:
/// `service ... not found`, HTTP 400).
fn existing_service(
    nacos: &Nacos,
    caller: &Caller,
    p: &Params,
) -> Result<(ServiceKey, crate::engine::ServiceSummary), NacosError> {
    let key = p.service()?;
    caller
        .allow(Rule::Service, &key.namespace, None)
        .map_err(ApiError::from)?;
    match service_exists(nacos, &key) {
        Some(summary) => Ok((key, summary)),
        None => Err(NacosError::bad(format!(
            "service {} not found",
            grouped(&key)
        ))),
    }
}

pub(super) fn threshold(p: &Params) -> Result<Option<f64>, NacosError> {
    let t = p.f64("protectThreshold")?;
    if let Some(t) = t {
        validate::protect_threshold(t).map_err(NacosError::invalid)?;
    }
    Ok(t)
}

pub(super) async fn v1_service_create(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let key = p.service()?;
    caller
        .allow(Rule::Service, &key.namespace, None)
        .map_err(ApiError::from)?;
    let protect_threshold = threshold(&p)?.unwrap_or(0.0);
    let metadata = p.metadata()?.unwrap_or_default();
    if service_exists(&nacos, &key).is_some() {
        return Err(NacosError::bad(format!(
            "specified service already exists, serviceName : {}",
            grouped(&key)
        )));
    }
    let settings = gangway_core::model::ServiceSettings {
        protect_threshold,
        metadata,
    };
    nacos.registry().put_settings(&key, settings).await?;
    Ok("ok")
}

pub(super) async fn v1_service_update(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let protect_threshold = threshold(&p)?;
    let metadata = p.metadata()?;
    let (key, summary) = existing_service(&nacos, &caller, &p)?;
    let mut settings = summary.settings;
    if let Some(t) = protect_threshold {
        settings.protect_threshold = t;
    }
    if let Some(m) = metadata {
        settings.metadata = m;
    }
    nacos.registry().put_settings(&key, settings).await?;
    Ok("ok")
}

pub(super) async fn v1_service_delete(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let (key, summary) = existing_service(&nacos, &caller, &p)?;
    if summary.instances > 0 {
        return Err(NacosError::bad(format!(
            "service {} is not empty, can't be delete. Please unregister instance first",
            grouped(&key)
        )));
    }
    nacos.registry().delete_service(&key).await?;
    Ok("ok")
}

pub(super) async fn v1_service_get(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let key = p.service()?;
    allow_read(&caller, &key)?;
    let Some(summary) = service_exists(&nacos, &key) else {
        return Err(NacosError::not_found(format!(
            "service {} not found",
            grouped(&key)
        )));
    };
    let (_, entries) = nacos.registry().entries(&key);
    let mut clusters: Vec<&str> = entries
        .iter()
        .map(|e| e.instance.key.cluster.as_str())
        .collect();
    clusters.sort();
    clusters.dedup();
    let clusters: Vec<Value> = clusters
        .into_iter()
        .map(|c| json!({"name": c, "healthChecker": {"type": "NONE"}, "metadata": {}}))
        .collect();
    Ok(axum::Json(json!({
        "namespaceId": key.namespace,
        "groupName": key.group,
        "name": key.service,
        "protectThreshold": summary.settings.protect_threshold,
        "metadata": summary.settings.metadata,
        "selector": {"type": "none", "contextType": "NONE"},
        "clusters": clusters,
    }))
    .into_response())
}

pub(super) async fn v1_service_list(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let page_no = p
        .u64("pageNo")?
        .ok_or_else(|| NacosError::missing("pageNo"))?;
    let page_size = p
        .u64("pageSize")?
        .ok_or_else(|| NacosError::missing("pageSize"))?;
    let namespace = p.get("namespaceId").unwrap_or(DEFAULT_NAMESPACE);
    caller
        .allow(Rule::Read, namespace, None)
        .map_err(ApiError::from)?;
    let group = p
        .get("groupName")
        .unwrap_or(gangway_core::model::DEFAULT_GROUP);
    let (count, doms) = service_page(&nacos, namespace, group, page_no, page_size);
    Ok(axum::Json(json!({"count": count, "doms": doms})).into_response())
}

/// One page (from 1) of the service names in a namespace and group, and the total count.
pub fn service_page(
    nacos: &Nacos,
    namespace: &str,
    group: &str,
    page_no: u64,
    page_size: u64,
) -> (usize, Vec<String>) {
    let names: Vec<String> = nacos
        .registry()
        .services(Some(namespace), Some(group))
        .into_iter()
        .map(|s| s.key.service)
        .collect();
    let skip = page_no.saturating_sub(1).saturating_mul(page_size) as usize;
    let page = names
        .iter()
        .skip(skip)
        .take(page_size as usize)
        .cloned()
        .collect();
    (names.len(), page)
}
