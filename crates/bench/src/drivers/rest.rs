//! gangway's REST API (`/v1/...`).

use anyhow::bail;
use serde_json::json;

use super::{GROUP, NAMESPACE};

/// A gangway REST client for one server.
#[derive(Clone)]
pub struct Rest {
    client: reqwest::Client,
    base: String,
}

impl Rest {
    /// A client of the server whose HTTP port is `addr`.
    pub fn new(client: reqwest::Client, addr: std::net::SocketAddr) -> Self {
        Rest {
            client,
            base: format!("http://{addr}/v1/services"),
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<bytes::Bytes> {
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if !status.is_success() {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }

    /// Registers a persistent instance: stored durably (synced to disk before the answer). Its
    /// TCP probe runs hourly, so probing does not load the run.
    pub async fn register_persistent(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        let req = self
            .client
            .post(format!(
                "{}/{svc}/instances?namespace={NAMESPACE}&group={GROUP}",
                self.base
            ))
            .json(&json!({"ip": ip, "port": port, "ephemeral": false,
                          "probe": {"kind": "tcp", "interval_ms": 3_600_000}}));
        self.send(req).await.map(drop)
    }

    /// Registers an ephemeral instance on a lease of `ttl_ms` (never renewed by the bench: make
    /// it longer than the run).
    pub async fn register_lease(
        &self,
        svc: &str,
        ip: &str,
        port: u16,
        ttl_ms: u64,
    ) -> anyhow::Result<()> {
        let req = self
            .client
            .post(format!(
                "{}/{svc}/instances?namespace={NAMESPACE}&group={GROUP}",
                self.base
            ))
            .json(&json!({"ip": ip, "port": port, "ttl_ms": ttl_ms, "delete_timeout_ms": ttl_ms}));
        self.send(req).await.map(drop)
    }

    /// The consumer view of `svc`; returns the body.
    pub async fn list(&self, svc: &str) -> anyhow::Result<bytes::Bytes> {
        let req = self.client.get(format!(
            "{}/{svc}/instances?namespace={NAMESPACE}&group={GROUP}",
            self.base
        ));
        self.send(req).await
    }
}
