//! Nacos parameters from the query string or a form body (the query wins), each checked.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use gangway_core::model::{DEFAULT_CLUSTER, DEFAULT_NAMESPACE, InstanceKey, ServiceKey};
use gangway_core::validate::{self, ValidationError};

use super::error::NacosError;
use crate::error::ApiError;
use crate::nacos::model::{parse_metadata, preserved_timing, service_key};
use crate::serve::BodyTimeout;

/// Query string and form body parameters, merged (the query wins).
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = NacosError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let mut map = HashMap::new();
        if let Some(q) = req.uri().query() {
            for (k, v) in form_urlencoded::parse(q.as_bytes()) {
                map.entry(k.into_owned()).or_insert(v.into_owned());
            }
        }
        let is_form = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if is_form {
            let body = Bytes::from_request(req, state)
                .await
                .map_err(|e| match e.status() {
                    _ if BodyTimeout::find(&e).is_some() => NacosError::from(ApiError::from(e)),
                    StatusCode::PAYLOAD_TOO_LARGE => NacosError {
                        status: StatusCode::PAYLOAD_TOO_LARGE,
                        code: 10001,
                        message: format!("the request body is too large: {}", e.body_text()),
                    },
                    _ => NacosError::bad(format!("unreadable body: {e}")),
                })?;
            for (k, v) in form_urlencoded::parse(&body) {
                map.entry(k.into_owned()).or_insert(v.into_owned());
            }
        }
        Ok(Params(map))
    }
}

impl Params {
    /// Builds parameters from pairs (tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Params(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub(super) fn required(&self, name: &str) -> Result<&str, NacosError> {
        self.get(name).ok_or_else(|| NacosError::missing(name))
    }

    pub(super) fn bool(&self, name: &str) -> Result<Option<bool>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(NacosError::bad(format!(
                "Param '{name}' must be true or false, got {v:?}"
            ))),
        }
    }

    pub(super) fn f64(&self, name: &str) -> Result<Option<f64>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    NacosError::bad(format!("Param '{name}' must be a number, got {v:?}"))
                }),
        }
    }

    pub(super) fn u64(&self, name: &str) -> Result<Option<u64>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                NacosError::bad(format!(
                    "Param '{name}' must be a non-negative integer, got {v:?}"
                ))
            }),
        }
    }

    /// The service: `serviceName` (plain or `group@@svc`), `groupName`, `namespaceId`
    /// ([`service_key`]'s rules).
    pub(super) fn service(&self) -> Result<ServiceKey, NacosError> {
        let name = self.required("serviceName")?;
        let namespace = self
            .get("namespaceId")
            .or_else(|| self.get("namespace"))
            .unwrap_or(DEFAULT_NAMESPACE);
        service_key(namespace, name, self.get("groupName")).map_err(NacosError::invalid)
    }

    pub(super) fn cluster(&self) -> &str {
        self.get("clusterName")
            .or_else(|| self.get("cluster"))
            .unwrap_or(DEFAULT_CLUSTER)
    }

    /// `ip`, `port` and cluster, all required but the cluster.
    pub(super) fn instance_key(&self) -> Result<InstanceKey, NacosError> {
        let ip = self.required("ip")?;
        let port = self.required("port")?;
        let key = InstanceKey::new(ip, parse_port(port)?, self.cluster());
        validate::instance_key(&key).map_err(NacosError::invalid)?;
        Ok(key)
    }

    /// `weight`: [`validate::weight`] (0, or 0.001-10000).
    pub(super) fn weight(&self) -> Result<Option<f64>, NacosError> {
        let w = self.f64("weight")?;
        if let Some(w) = w {
            validate::weight(w).map_err(NacosError::invalid)?;
        }
        Ok(w)
    }

    /// `metadata` of a service: [`validate::metadata`].
    pub(super) fn metadata(&self) -> Result<Option<BTreeMap<String, String>>, NacosError> {
        match self.get("metadata") {
            None => Ok(None),
            Some(raw) => {
                let m = parse_metadata(raw).map_err(NacosError::bad)?;
                validate::metadata(&m).map_err(NacosError::invalid)?;
                Ok(Some(m))
            }
        }
    }

    /// `metadata` of an instance: [`Params::metadata`], and its `preserved.*` timing keys
    /// checked ([`preserved_timing`]).
    pub(super) fn instance_metadata(&self) -> Result<Option<BTreeMap<String, String>>, NacosError> {
        let m = self.metadata()?;
        if let Some(m) = &m {
            preserved_timing(m).map_err(NacosError::invalid)?;
        }
        Ok(m)
    }

    /// `udpPort`: 0 (a one-off list) to 65535 (a subscribed client's UDP port).
    pub(super) fn udp_port(&self) -> Result<u16, NacosError> {
        let port = self.u64("udpPort")?.unwrap_or(0);
        u16::try_from(port).map_err(|_| {
            NacosError::invalid(ValidationError::new(
                "udpPort",
                format!("must be 0-65535, got {port}"),
            ))
        })
    }

    pub(super) fn enabled(&self) -> Result<Option<bool>, NacosError> {
        Ok(match self.bool("enabled")? {
            Some(v) => Some(v),
            None => self.bool("enable")?,
        })
    }
}

pub(super) fn parse_port(raw: &str) -> Result<u16, NacosError> {
    raw.trim()
        .parse::<u32>()
        .ok()
        .and_then(|p| validate::port(p).ok())
        .ok_or_else(|| {
            NacosError::bad(format!(
                "Param 'port' must be an integer 1-65535, got {raw:?}"
            ))
        })
}
