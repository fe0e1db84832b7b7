//! The drivers over gangway's REST API, on the typed REST client every tool shares
//! ([`gangway_wire::client::RestClient`]) with the bench's own connection pool.

use gangway_core::model::ProbeKind;
use gangway_wire::client::{RestClient, ServiceRef};
use gangway_wire::rest::{ProbeRequest, RegisterRequest};

use super::capability::{List, OnGangway, Persist, Register};
use super::{GROUP, NAMESPACE};
use crate::system::Server;

/// Lease of the `rest` driver's registrations: one hour, never renewed, so longer than a run.
const LEASE_MS: u64 = 3_600_000;
/// Probe interval of the `rest-persistent` driver's registrations: one hour, so probing does
/// not load the run.
const PROBE_INTERVAL_MS: u64 = 3_600_000;

/// The `rest` driver: lists of the consumer view, and ephemeral registrations on a lease.
pub struct RestApi;

/// The `rest-persistent` driver: `ephemeral: false` registrations (redb, fsync before the
/// answer), TCP-probed hourly so probing does not load the run.
pub struct RestPersistent;

super::capability::driver!(RestApi = "rest", served by OnGangway);
super::capability::driver!(RestPersistent = "rest-persistent", served by OnGangway);

/// A client of `server`'s REST port sharing one pool sized for `workers` ([`super::pool`]).
pub(crate) fn client(server: &Server, workers: usize) -> anyhow::Result<RestClient> {
    client_of(&server.http.to_string(), workers)
}

/// A client of the REST port at `addr` (`host:port`, e.g. one node of a cluster) sharing one
/// pool sized for `workers` ([`super::pool`]).
pub(crate) fn client_of(addr: &str, workers: usize) -> anyhow::Result<RestClient> {
    Ok(RestClient::builder(addr)
        .http(super::pool(workers))
        .build()?)
}

/// `svc` in the namespace and group every driver writes to, spelled out.
pub(crate) fn service(svc: &str) -> ServiceRef {
    ServiceRef {
        service: svc.to_owned(),
        namespace: Some(NAMESPACE.to_owned()),
        group: Some(GROUP.to_owned()),
    }
}

impl Register for RestApi {
    type Client = RestClient;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<RestClient> {
        client(server, workers)
    }

    async fn register(
        client: &RestClient,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        let body = RegisterRequest {
            ip: ip.to_owned(),
            port: u32::from(port),
            ttl_ms: Some(LEASE_MS),
            delete_timeout_ms: Some(LEASE_MS),
            ..RegisterRequest::default()
        };
        client.register(&service(svc), &body).await?;
        Ok(())
    }
}

impl List for RestApi {
    type Client = RestClient;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<RestClient> {
        client(server, connections)
    }

    async fn list(client: &RestClient, svc: &str) -> anyhow::Result<()> {
        client.instances(&service(svc), false).await?;
        Ok(())
    }

    async fn count(client: &RestClient, svc: &str) -> anyhow::Result<usize> {
        let view = client.instances(&service(svc), false).await?.parse()?;
        Ok(view.instances.len())
    }
}

impl Persist for RestPersistent {
    type Client = RestClient;
    type Lister = RestApi;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<RestClient> {
        client(server, connections)
    }

    async fn register(client: &RestClient, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        let body = RegisterRequest {
            ip: ip.to_owned(),
            port: u32::from(port),
            ephemeral: Some(false),
            probe: Some(ProbeRequest {
                kind: Some(ProbeKind::Tcp),
                interval_ms: Some(PROBE_INTERVAL_MS),
                ..ProbeRequest::default()
            }),
            ..RegisterRequest::default()
        };
        client.register(&service(svc), &body).await?;
        Ok(())
    }
}
