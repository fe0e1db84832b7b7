//! etcd v3 through its JSON gRPC gateway (`/v3/...` on the client URL): keys and values are
//! base64 in JSON, int64s are strings, a watch is a long HTTP response of newline-separated JSON.
//! Used as registries use etcd: a lease per instance, the instance under `/svc/<service>/`, a
//! prefix watch per consumer.

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::capability::{
    Deregister, Driver, Hold, List, OnEtcd, OnUpdate, Persist, Register, Subscribe, Update,
};
use crate::load;
use crate::system::Server;

/// Called with each event of a watch (`{"type": "DELETE"?, "kv": {...}}`).
pub type EventHandler = Box<dyn FnMut(&Value) + Send>;

/// An etcd client for one server.
#[derive(Clone)]
pub struct Etcd {
    client: reqwest::Client,
    base: String,
}

/// Standard base64 with padding.
pub fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The key of an instance.
pub fn key(svc: &str, ip: &str, port: u16) -> String {
    format!("/svc/{svc}/{ip}:{port}")
}

/// The prefix of a service's keys.
pub fn prefix(svc: &str) -> String {
    format!("/svc/{svc}/")
}

/// The end of the range of keys starting with `p` (last byte + 1).
fn range_end(p: &str) -> String {
    let mut b = p.as_bytes().to_vec();
    if let Some(last) = b.last_mut() {
        *last += 1;
    }
    b64(&b)
}

impl Etcd {
    /// A client of the etcd whose client URL is `addr`.
    pub fn new(client: reqwest::Client, addr: std::net::SocketAddr) -> Self {
        Etcd {
            client,
            base: format!("http://{addr}/v3"),
        }
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let resp = self
            .client
            .post(format!("{}/{path}", self.base))
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let v: Value = resp
            .json()
            .await
            .with_context(|| format!("{path}: HTTP {status}"))?;
        if !status.is_success() || v.get("error").is_some() {
            bail!("{path}: HTTP {status}: {v}");
        }
        Ok(v)
    }

    /// Grants a lease of `ttl_s` seconds; returns its id (as the gateway spells it, a string).
    pub async fn grant(&self, ttl_s: u64) -> anyhow::Result<String> {
        let v = self
            .post("lease/grant", json!({"TTL": ttl_s.to_string()}))
            .await?;
        v["ID"]
            .as_str()
            .map(str::to_owned)
            .context("lease/grant answered no ID")
    }

    /// Puts `key` = `value`, attached to `lease` if given.
    pub async fn put(&self, key: &str, value: &str, lease: Option<&str>) -> anyhow::Result<()> {
        let mut body = json!({"key": b64(key.as_bytes()), "value": b64(value.as_bytes())});
        if let Some(l) = lease {
            body["lease"] = Value::String(l.to_owned());
        }
        self.post("kv/put", body).await.map(drop)
    }

    /// Registers an instance the usual way: a lease, then the key under it. Returns the lease.
    pub async fn register(
        &self,
        svc: &str,
        ip: &str,
        port: u16,
        ttl_s: u64,
    ) -> anyhow::Result<String> {
        let lease = self.grant(ttl_s).await?;
        let value = format!(r#"{{"ip":"{ip}","port":{port},"weight":1.0}}"#);
        self.put(&key(svc, ip, port), &value, Some(&lease)).await?;
        Ok(lease)
    }

    /// Deletes one key.
    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.post("kv/deleterange", json!({"key": b64(key.as_bytes())}))
            .await
            .map(drop)
    }

    /// Reads every key of a service; returns the number of keys (the body is parsed as a client
    /// would).
    pub async fn list(&self, svc: &str) -> anyhow::Result<usize> {
        let p = prefix(svc);
        let v = self
            .post(
                "kv/range",
                json!({"key": b64(p.as_bytes()), "range_end": range_end(&p)}),
            )
            .await?;
        Ok(v["kvs"].as_array().map_or(0, Vec::len))
    }

    /// Starts a prefix watch on a service and returns once etcd confirmed it; events then go to
    /// `on_event` from a background task, which ends when the returned handle is aborted.
    pub async fn watch(
        &self,
        svc: &str,
        mut on_event: EventHandler,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let p = prefix(svc);
        let resp = self
            .client
            .post(format!("{}/watch", self.base))
            .json(
                &json!({"create_request": {"key": b64(p.as_bytes()), "range_end": range_end(&p)}}),
            )
            // The client's default timeout would end the watch.
            .timeout(std::time::Duration::from_secs(24 * 3600))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("watch: HTTP {}", resp.status());
        }
        let mut stream = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        // Read until the "created" message.
        let mut created = false;
        while !created {
            let chunk = stream
                .next()
                .await
                .context("watch ended before it was created")??;
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                if v["result"]["created"] == true {
                    created = true;
                }
            }
        }
        Ok(tokio::spawn(async move {
            while let Some(Ok(chunk)) = stream.next().await {
                buf.extend_from_slice(&chunk);
                while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    for e in v["result"]["events"].as_array().into_iter().flatten() {
                        on_event(e);
                    }
                }
            }
        }))
    }
}

/// The value every driver but `lease+put` stores under an instance's key.
const VALUE: &str = r#"{"weight":1.0}"#;
/// TTL of the leases the drivers grant, in seconds: longer than any run.
const LONG_TTL_S: u64 = 3600;
/// TTL of `lease+put`'s per-instance leases, in seconds.
const REGISTER_TTL_S: u64 = 600;

/// The `lease+put` driver: a lease per instance, then the key under it, as registries use etcd;
/// holding sessions, a lease per session (TTL 1 h, no keep-alive stream) and its instances'
/// keys under it.
pub struct EtcdLeasePut;

/// The `put` driver: keys under one lease granted at connect (ephemeral), or without a lease
/// (persistent: etcd's WAL is synced before the answer).
pub struct EtcdPut;

/// The `range` driver: a service's keys read with one range request, the answer parsed.
pub struct EtcdRange;

/// The `watch` driver: a prefix watch per subscriber, on its own HTTP connection; its
/// instances are made by [`EtcdPut`].
pub struct EtcdWatch;

super::capability::driver!(EtcdLeasePut = "lease+put", served by OnEtcd);
super::capability::driver!(EtcdPut = "put", served by OnEtcd);
super::capability::driver!(EtcdRange = "range", served by OnEtcd);
super::capability::driver!(EtcdWatch = "watch", served by OnEtcd);

fn client(server: &Server, workers: usize) -> Etcd {
    Etcd::new(super::pool(workers), server.http)
}

impl Register for EtcdLeasePut {
    type Client = Etcd;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<Etcd> {
        Ok(client(server, workers))
    }

    async fn register(
        client: &Etcd,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client
            .register(svc, ip, port, REGISTER_TTL_S)
            .await
            .map(drop)
    }
}

/// Leases standing for sessions, with the client that granted them.
pub struct Leases {
    etcd: Etcd,
    ids: Vec<String>,
}

impl Hold for EtcdLeasePut {
    type Sessions = Leases;

    async fn open(server: &Server, n: usize) -> anyhow::Result<Leases> {
        let etcd = Etcd::new(super::http_client(128), server.http);
        let ids = load::for_each(n, 128, "leases", |_| etcd.grant(LONG_TTL_S)).await?;
        Ok(Leases { etcd, ids })
    }

    async fn register(
        sessions: &Leases,
        session: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        let lease = &sessions.ids[session % sessions.ids.len()];
        sessions
            .etcd
            .put(&key(svc, ip, port), VALUE, Some(lease))
            .await
    }
}

/// A client with the one lease its keys go under.
pub struct Leased {
    etcd: Etcd,
    lease: String,
}

impl Register for EtcdPut {
    type Client = Leased;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<Leased> {
        let etcd = client(server, workers);
        let lease = etcd.grant(LONG_TTL_S).await?;
        Ok(Leased { etcd, lease })
    }

    async fn register(
        client: &Leased,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client
            .etcd
            .put(&key(svc, ip, port), VALUE, Some(&client.lease))
            .await
    }
}

impl Deregister for EtcdPut {
    async fn deregister(
        client: &Leased,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client.etcd.delete(&key(svc, ip, port)).await
    }
}

impl Persist for EtcdPut {
    type Client = Etcd;
    type Lister = EtcdRange;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<Etcd> {
        Ok(client(server, connections))
    }

    async fn register(client: &Etcd, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        client.put(&key(svc, ip, port), VALUE, None).await
    }
}

impl List for EtcdRange {
    type Client = Etcd;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<Etcd> {
        Ok(client(server, connections))
    }

    async fn list(client: &Etcd, svc: &str) -> anyhow::Result<()> {
        client.list(svc).await.map(drop)
    }

    async fn count(client: &Etcd, svc: &str) -> anyhow::Result<usize> {
        client.list(svc).await
    }
}

/// Open watches; dropping them ends each watch's task.
pub struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

impl Subscribe for EtcdWatch {
    type Producer = EtcdPut;
    type Held = Watches;
    const SENDS_LISTS: bool = false;
    const PRODUCED_VIA: &'static str = "";

    async fn subscribe(
        server: &Server,
        svc: &str,
        n: usize,
        on_update: OnUpdate,
    ) -> anyhow::Result<Watches> {
        let e = Etcd::new(super::http_client(n), server.http);
        let label = format!("{n} subscribers ({})", Self::NAME);
        let handles = load::for_each(n, 128, &label, |i| {
            let on_update = on_update.clone();
            let h: EventHandler = Box::new(move |ev: &Value| {
                let deleted = ev["type"] == "DELETE";
                let key = ev["kv"]["key"].as_str().unwrap_or("");
                on_update(i, Update::Event { key, deleted });
            });
            e.watch(svc, h)
        })
        .await?;
        Ok(Watches(handles))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(b64(raw.as_bytes()), enc);
        }
        assert_eq!(range_end("/svc/a/"), b64(b"/svc/a0"));
    }
}
