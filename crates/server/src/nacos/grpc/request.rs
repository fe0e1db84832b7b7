//! The JSON bodies of naming requests, checked into registry types.

use std::collections::HashMap;

use gangway_core::model::{DEFAULT_WEIGHT, Instance, InstanceKey, ServiceKey};
use gangway_core::validate;
use serde::Deserialize;
use serde_json::Value;

use super::INVALID_PARAM;
use super::reply::Refusal;
use crate::error::ApiError;
use crate::nacos::model::{json_string, preserved_timing, service_key};

/// Fields every naming request carries.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct NamingRequest {
    pub(super) namespace: Option<String>,
    pub(super) service_name: Option<String>,
    pub(super) group_name: Option<String>,
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) instance: Option<WireInstance>,
    pub(super) instances: Option<Vec<WireInstance>>,
    pub(super) cluster: Option<String>,
    pub(super) clusters: Option<String>,
    pub(super) healthy_only: Option<bool>,
    /// The Python SDK's spelling.
    pub(super) health_only: Option<bool>,
    pub(super) subscribe: Option<bool>,
    pub(super) page_no: Option<u64>,
    pub(super) page_size: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireInstance {
    #[serde(default)]
    pub(super) ip: String,
    #[serde(default)]
    pub(super) port: i64,
    pub(super) weight: Option<f64>,
    pub(super) enabled: Option<bool>,
    pub(super) cluster_name: Option<String>,
    pub(super) metadata: Option<HashMap<String, Value>>,
}

impl NamingRequest {
    pub(super) fn service(&self) -> Result<ServiceKey, Refusal> {
        let name = self.service_name.as_deref().unwrap_or("");
        if name.is_empty() {
            return Err(Refusal::new(INVALID_PARAM, "serviceName must not be empty"));
        }
        let namespace = self.namespace.as_deref().unwrap_or("");
        let key =
            service_key(namespace, name, self.group_name.as_deref()).map_err(ApiError::from)?;
        Ok(key)
    }

    /// What an `InstanceRequest` or `PersistentInstanceRequest` carries: the service, the request
    /// type (`registerInstance`, `deregisterInstance`), the instance and whether it is disabled.
    pub(super) fn single_instance(&self) -> Result<(ServiceKey, String, Instance, bool), Refusal> {
        let service = self.service()?;
        let kind = self.kind.clone().unwrap_or_default();
        let wire = self
            .instance
            .as_ref()
            .ok_or_else(|| Refusal::new(INVALID_PARAM, "instance is required"))?;
        let (instance, disabled) = wire.to_instance()?;
        Ok((service, kind, instance, disabled))
    }
}

impl WireInstance {
    /// The gangway instance and whether it asked to be disabled, every field checked (so a
    /// batch is refused whole, before any of it is registered): address, weight, metadata and
    /// its `preserved.*` timing keys ([`preserved_timing`]).
    pub(super) fn to_instance(&self) -> Result<(Instance, bool), Refusal> {
        let port = u32::try_from(self.port).unwrap_or(0);
        let port = validate::port(port).map_err(ApiError::from)?;
        let key = InstanceKey::new(&self.ip, port, self.cluster_name.as_deref().unwrap_or(""));
        validate::instance_key(&key).map_err(ApiError::from)?;
        let mut instance = Instance::new(key);
        instance.weight = self.weight.unwrap_or(DEFAULT_WEIGHT);
        instance.metadata = self
            .metadata
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, json_string(v)))
            .collect();
        validate::weight(instance.weight).map_err(ApiError::from)?;
        validate::metadata(&instance.metadata).map_err(ApiError::from)?;
        preserved_timing(&instance.metadata).map_err(ApiError::from)?;
        Ok((instance, self.enabled == Some(false)))
    }
}
