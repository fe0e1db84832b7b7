//! The drivers over gangway's REST API, built on [`Rest`]'s public calls only (the client
//! itself lives in [`super::rest`]).

use super::capability::{List, OnGangway, Persist, Register};
use super::rest::Rest;
use crate::system::Server;

/// Lease of the `rest` driver's registrations: one hour, never renewed, so longer than a run.
const LEASE_MS: u64 = 3_600_000;

/// The `rest` driver: lists of the consumer view, and ephemeral registrations on a lease.
pub struct RestApi;

/// The `rest-persistent` driver: `ephemeral: false` registrations (redb, fsync before the
/// answer), TCP-probed hourly so probing does not load the run.
pub struct RestPersistent;

super::capability::driver!(RestApi = "rest", served by OnGangway);
super::capability::driver!(RestPersistent = "rest-persistent", served by OnGangway);

fn client(server: &Server, workers: usize) -> Rest {
    Rest::new(super::pool(workers), server.http)
}

impl Register for RestApi {
    type Client = Rest;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<Rest> {
        Ok(client(server, workers))
    }

    async fn register(
        client: &Rest,
        _worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client.register_lease(svc, ip, port, LEASE_MS).await
    }
}

impl List for RestApi {
    type Client = Rest;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<Rest> {
        Ok(client(server, connections))
    }

    async fn list(client: &Rest, svc: &str) -> anyhow::Result<()> {
        client.list(svc).await.map(drop)
    }

    async fn count(client: &Rest, svc: &str) -> anyhow::Result<usize> {
        let body: serde_json::Value = serde_json::from_slice(&client.list(svc).await?)?;
        Ok(body["instances"].as_array().map_or(0, Vec::len))
    }
}

impl Persist for RestPersistent {
    type Client = Rest;
    type Lister = RestApi;

    async fn connect(server: &Server, connections: usize) -> anyhow::Result<Rest> {
        Ok(client(server, connections))
    }

    async fn register(client: &Rest, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        client.register_persistent(svc, ip, port).await
    }
}
