//! Drivers: one client per protocol, thin and allocation-light, so the load generator measures the
//! server rather than an SDK. Every driver speaks to loopback only.
//!
//! - [`native`]: gangway's gRPC session protocol (raw `gangway_proto` messages);
//! - [`rest_driver`]: gangway's REST API, on the shared typed client `gangway_wire::client`;
//! - [`nacos_http`]: Nacos v1 HTTP (gangway's compat layer and rnacos, the same code);
//! - [`nacos_grpc`]: the Nacos 2.x SDK gRPC protocol (gangway's compat layer and rnacos);
//! - [`etcd`]: etcd v3 through its JSON gRPC gateway (no protoc, no etcd client crate).
//!
//! Workloads use them through the capability traits of [`capability`], implemented by one
//! zero-sized type per table `driver` name, next to the client it drives:
//!
//! | driver | type | capabilities | systems |
//! |---|---|---|---|
//! | `native-grpc` | [`NativeGrpc`] | register, deregister, subscribe, hold | gangway, gangway-cluster (session `i` on node `i` modulo the nodes) |
//! | `max-sessions` | [`MaxSessions`] | (the scale workload's own probe) | gangway |
//! | `nacos-grpc` | [`NacosGrpc`] | register, subscribe, hold | gangway, rnacos |
//! | `nacos-http` | [`NacosV1`] | register, deregister, list | gangway, rnacos |
//! | `nacos-http-persistent` | [`NacosV1Persistent`] | persist | gangway, rnacos |
//! | `rest` | [`RestApi`] | register (leases), list | gangway |
//! | `rest-persistent` | [`RestPersistent`] | persist | gangway |
//! | `lease+put` | [`EtcdLeasePut`] | register (a lease each), hold | etcd |
//! | `put` | [`EtcdPut`] | register (one lease), deregister, persist | etcd |
//! | `range` | [`EtcdRange`] | list | etcd |
//! | `watch` | [`EtcdWatch`] | subscribe | etcd |

pub mod capability;
pub mod etcd;
pub mod nacos_grpc;
pub mod nacos_http;
pub mod native;
pub mod rest_driver;

use std::net::SocketAddr;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

pub use capability::{
    Deregister, Driver, Hold, List, OnEtcd, OnGangway, OnGangwayCluster, OnRnacos, OnUpdate,
    Persist, Register, Serves, SessionBound, Subscribe, SystemKind, Update,
};
pub use etcd::{EtcdLeasePut, EtcdPut, EtcdRange, EtcdWatch};
pub use nacos_grpc::NacosGrpc;
pub use nacos_http::{NacosV1, NacosV1Persistent};
pub use native::{MaxSessions, NativeGrpc};
pub use rest_driver::{RestApi, RestPersistent};

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

/// The HTTP client of an HTTP driver connected for `workers`: two idle connections per worker,
/// at least 64, so one worker may keep 64 requests in flight without reconnecting.
pub fn pool(workers: usize) -> reqwest::Client {
    http_client((2 * workers).max(64))
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
