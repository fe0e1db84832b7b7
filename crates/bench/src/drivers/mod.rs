//! Drivers: one client per protocol, thin and allocation-light, so the load generator measures the
//! server rather than an SDK. Every driver speaks to loopback only.
//!
//! - [`native`]: gangway's gRPC session protocol (raw `gangway_proto` messages);
//! - [`rest`]: gangway's REST API;
//! - [`nacos_http`]: Nacos v1 HTTP (gangway's compat layer and rnacos, the same code);
//! - [`nacos_grpc`]: the Nacos 2.x SDK gRPC protocol (gangway's compat layer and rnacos);
//! - [`etcd`]: etcd v3 through its JSON gRPC gateway (no protoc, no etcd client crate).

pub mod etcd;
pub mod nacos_grpc;
pub mod nacos_http;
pub mod native;
pub mod rest;

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// The namespace every driver writes to (spelled out: Nacos servers differ on what "" means).
pub const NAMESPACE: &str = "public";
/// The group every driver writes to.
pub const GROUP: &str = "DEFAULT_GROUP";

/// A loopback instance address for worker `w`'s request `n`: distinct for every (w, n) below
/// 2^16 workers and 15M requests each; always inside 127.0.0.0/8, so nothing is ever probed
/// elsewhere.
pub fn instance_addr(w: usize, n: u64) -> (String, u16) {
    let ip = format!(
        "127.{}.{}.{}",
        (w >> 8) & 255,
        w & 255,
        1 + (n / 60_000) % 254
    );
    (ip, 1 + (n % 60_000) as u16)
}

/// Opens one HTTP/2 connection (a tonic channel) to `addr`.
pub async fn channel(addr: SocketAddr) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect()
        .await?)
}

/// An HTTP/1.1 client with a connection pool big enough for `connections` concurrent requests.
pub fn http_client(connections: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(connections.max(1))
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("static client configuration")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_addresses_are_loopback_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for w in [0usize, 1, 255, 256, 70_000] {
            for n in [0u64, 1, 59_999, 60_000, 10_000_000] {
                let (ip, port) = instance_addr(w, n);
                assert!(ip.starts_with("127."), "{ip}");
                assert!(port >= 1);
                assert!(seen.insert((ip, port, w & 0xffff)), "{w} {n}");
            }
        }
    }
}
