//! Nacos v1 HTTP naming API (`/nacos/v1/ns/*`): the same requests against gangway's compat layer
//! and rnacos.

use anyhow::bail;
use futures::StreamExt as _;

use super::capability::{Deregister, List, OnGangway, OnRnacos, Persist, Register};
use super::{GROUP, NAMESPACE};
use crate::system::Server;

/// A Nacos v1 HTTP client for one server.
#[derive(Clone)]
pub struct NacosHttp {
    client: reqwest::Client,
    base: String,
}

fn form(pairs: &[(&str, &str)]) -> String {
    // Every value the bench sends is ASCII letters, digits, '.', '-', '_' or '@': nothing to escape
    // except '@'.
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", v.replace('@', "%40")))
        .collect::<Vec<_>>()
        .join("&")
}

impl NacosHttp {
    /// A client of the server whose HTTP port is `addr`.
    pub fn new(client: reqwest::Client, addr: std::net::SocketAddr) -> Self {
        NacosHttp {
            client,
            base: format!("http://{addr}/nacos/v1/ns"),
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

    /// Registers an instance (`ephemeral`: a lease renewed by beats; otherwise persistent).
    pub async fn register(
        &self,
        svc: &str,
        ip: &str,
        port: u16,
        ephemeral: bool,
    ) -> anyhow::Result<()> {
        let port = port.to_string();
        let body = form(&[
            ("namespaceId", NAMESPACE),
            ("groupName", GROUP),
            ("serviceName", svc),
            ("ip", ip),
            ("port", &port),
            ("ephemeral", if ephemeral { "true" } else { "false" }),
        ]);
        let req = self
            .client
            .post(format!("{}/instance", self.base))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body);
        self.send(req).await.map(drop)
    }

    /// Deregisters an instance.
    pub async fn deregister(
        &self,
        svc: &str,
        ip: &str,
        port: u16,
        ephemeral: bool,
    ) -> anyhow::Result<()> {
        let port = port.to_string();
        let query = form(&[
            ("namespaceId", NAMESPACE),
            ("groupName", GROUP),
            ("serviceName", svc),
            ("ip", ip),
            ("port", &port),
            ("ephemeral", if ephemeral { "true" } else { "false" }),
        ]);
        let req = self
            .client
            .delete(format!("{}/instance?{query}", self.base));
        self.send(req).await.map(drop)
    }

    /// A heartbeat (`PUT /instance/beat`) with the beat body the SDKs send, so a server that
    /// lost the instance registers it again.
    pub async fn beat(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        let beat = serde_json::json!({
            "serviceName": format!("{GROUP}@@{svc}"),
            "ip": ip,
            "port": port,
            "cluster": "DEFAULT",
            "weight": 1.0,
            "scheduled": true,
        })
        .to_string();
        let port = port.to_string();
        let req = self
            .client
            .put(format!("{}/instance/beat", self.base))
            .query(&[
                ("namespaceId", NAMESPACE),
                ("groupName", GROUP),
                ("serviceName", svc),
                ("ip", ip),
                ("port", &port),
                ("beat", &beat),
            ]);
        self.send(req).await.map(drop)
    }

    /// Lists a service (`/instance/list`); returns the body.
    pub async fn list(&self, svc: &str) -> anyhow::Result<bytes::Bytes> {
        let query = form(&[
            ("namespaceId", NAMESPACE),
            ("groupName", GROUP),
            ("serviceName", svc),
        ]);
        let req = self
            .client
            .get(format!("{}/instance/list?{query}", self.base));
        self.send(req).await
    }
}

/// The `nacos-http` driver: Nacos v1 HTTP with ephemeral instances (leases the bench renews
/// only where a workload outlasts them, [`Register::keep_alive`]: Nacos keeps them healthy for
/// 15 s and listed for 30 s) and lists.
pub struct NacosV1;

/// The `nacos-http-persistent` driver: Nacos v1 HTTP with `ephemeral=false` instances, stored
/// by the server (rnacos: its Raft log).
pub struct NacosV1Persistent;

super::capability::driver!(NacosV1 = "nacos-http", served by OnGangway, OnRnacos);
super::capability::driver!(NacosV1Persistent = "nacos-http-persistent", served by OnGangway, OnRnacos);

impl Register for NacosV1 {
    type Client = NacosHttp;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<NacosHttp> {
        Ok(NacosHttp::new(super::pool(workers), server.http))
    }

    async fn register(
        client: &NacosHttp,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client.register(svc, ip, port, true).await
    }

    /// A beat per instance every [`BEAT_INTERVAL`], 64 in flight, as the Nacos SDKs do.
    fn keep_alive(
        client: &NacosHttp,
        svc: &str,
        instances: Vec<(String, u16)>,
    ) -> Option<tokio::task::AbortHandle> {
        let (client, svc) = (client.clone(), svc.to_owned());
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(BEAT_INTERVAL);
            loop {
                every.tick().await;
                futures::stream::iter(&instances)
                    .for_each_concurrent(64, |(ip, port)| {
                        let (client, svc) = (&client, &svc);
                        async move {
                            let _ = client.beat(svc, ip, *port).await;
                        }
                    })
                    .await;
            }
        });
        Some(task.abort_handle())
    }
}

/// How often the Nacos SDKs beat an ephemeral v1 instance: 5 s.
const BEAT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

impl Deregister for NacosV1 {
    async fn deregister(
        client: &NacosHttp,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client.deregister(svc, ip, port, true).await
    }
}

impl List for NacosV1 {
    type Client = NacosHttp;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<NacosHttp> {
        Ok(NacosHttp::new(super::pool(connections), server.http))
    }

    async fn list(client: &NacosHttp, svc: &str) -> anyhow::Result<()> {
        client.list(svc).await.map(drop)
    }

    async fn count(client: &NacosHttp, svc: &str) -> anyhow::Result<usize> {
        let body: serde_json::Value = serde_json::from_slice(&client.list(svc).await?)?;
        Ok(body["hosts"].as_array().map_or(0, Vec::len))
    }
}

impl Persist for NacosV1Persistent {
    type Client = NacosHttp;
    type Lister = NacosV1;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<NacosHttp> {
        Ok(NacosHttp::new(super::pool(connections), server.http))
    }

    async fn register(client: &NacosHttp, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        client.register(svc, ip, port, false).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn form_encodes_the_at_sign() {
        assert_eq!(super::form(&[("a", "b@@c"), ("d", "1")]), "a=b%40%40c&d=1");
    }
}
