//! Nacos v1 HTTP naming API (`/nacos/v1/ns/*`): the same requests against gangway's compat layer
//! and rnacos.

use anyhow::bail;

use super::{GROUP, NAMESPACE};

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

#[cfg(test)]
mod tests {
    #[test]
    fn form_encodes_the_at_sign() {
        assert_eq!(super::form(&[("a", "b@@c"), ("d", "1")]), "a=b%40%40c&d=1");
    }
}
