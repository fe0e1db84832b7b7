//! What a driver can do, as traits a workload asks for, and which systems a driver speaks to.
//!
//! A driver is a zero-sized type naming one way of using one protocol (its [`Driver::NAME`] is
//! the `driver` column of the tables). Each capability a workload needs is a trait: [`Register`]
//! and [`Deregister`] ephemeral instances, [`Persist`] durable ones, [`List`] a service,
//! [`Subscribe`] to one, [`Hold`] instances in sessions. A workload's lineup pairs a system with
//! a driver through [`Serves`], so a pair whose system does not speak the driver's protocol, or
//! whose driver lacks the capability the workload uses, does not compile.

use std::future::Future;
use std::sync::Arc;

use crate::system::{Server, System};

/// One way of driving a registry: a protocol, used one way.
pub trait Driver: Send + Sync + 'static {
    /// The name in the tables' `driver` column (`native-grpc`, `lease+put`, ...).
    const NAME: &'static str;
}

/// A system as a type, so that lineups are checked by the compiler.
pub trait SystemKind: Send + Sync + 'static {
    /// The system.
    const SYSTEM: System;
}

/// The system `Self` answers driver `D`'s protocol.
pub trait Serves<D: Driver>: SystemKind {}

/// Declares a driver: `driver!(EtcdPut = "put", served by OnEtcd)` implements [`Driver`] with
/// that name and [`Serves`] for each system listed.
macro_rules! driver {
    ($driver:ty = $name:literal, served by $($system:ty),+ $(,)?) => {
        impl $crate::drivers::Driver for $driver {
            const NAME: &'static str = $name;
        }
        $(impl $crate::drivers::Serves<$driver> for $system {})+
    };
}
pub(crate) use driver;

/// gangway, as a type.
pub struct OnGangway;
/// rnacos, as a type.
pub struct OnRnacos;
/// etcd, as a type.
pub struct OnEtcd;
/// gangway as a cluster of nodes on etcd (`gangway-cluster`), as a type: it serves the drivers
/// that spread their clients over the nodes ([`Server::node`]).
pub struct OnGangwayCluster;

impl SystemKind for OnGangway {
    const SYSTEM: System = System::Gangway;
}
impl SystemKind for OnRnacos {
    const SYSTEM: System = System::Rnacos;
}
impl SystemKind for OnEtcd {
    const SYSTEM: System = System::Etcd;
}
impl SystemKind for OnGangwayCluster {
    const SYSTEM: System = System::GangwayCluster;
}

/// Registers ephemeral instances (kept alive by a session, connection or lease) from several
/// workers at once.
pub trait Register: Driver {
    /// The connected client (sessions, an HTTP pool, a lease).
    type Client: Send + Sync + 'static;

    /// Connects to `server` with room for `workers` concurrent workers: protocols that bind
    /// instances to a session open one session (on its own connection) per worker; HTTP
    /// drivers pool connections for them (at least 64, so one worker may keep 64 requests in
    /// flight).
    ///
    /// # Errors
    /// A session or lease that could not be opened.
    fn connect(
        server: &Server,
        workers: usize,
    ) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// Registers instance `ip:port` of `svc` as worker `worker` (any number: taken modulo the
    /// workers connected).
    ///
    /// # Errors
    /// The server's refusal or a transport error.
    fn register(
        client: &Self::Client,
        worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Keeps `instances` of `svc`, registered through `client`, alive past a lease's TTL as
    /// the protocol's own clients do, until the returned task is aborted; `None` when they
    /// need nothing from the client (a session or a lease the connection keeps, persistent
    /// keys). Default: `None`. Only workloads that outlast a TTL (churn) call it.
    fn keep_alive(
        _client: &Self::Client,
        _svc: &str,
        _instances: Vec<(String, u16)>,
    ) -> Option<tokio::task::AbortHandle> {
        None
    }
}

/// Takes ephemeral instances out again.
pub trait Deregister: Register {
    /// Deregisters instance `ip:port` of `svc`, registered by the same `worker`.
    ///
    /// # Errors
    /// The server's refusal or a transport error.
    fn deregister(
        client: &Self::Client,
        worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Registers persistent instances: stored, and synced to disk before the answer.
pub trait Persist: Driver {
    /// The connected client.
    type Client: Send + Sync + 'static;
    /// The driver that lists what this one stored, on the same system.
    type Lister: List;

    /// Connects with a pool for `connections` concurrent requests.
    ///
    /// # Errors
    /// None today (HTTP clients connect on first use); the signature leaves room.
    fn connect(
        server: &Server,
        connections: usize,
    ) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// Stores instance `ip:port` of `svc`.
    ///
    /// # Errors
    /// The server's refusal or a transport error.
    fn register(
        client: &Self::Client,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Lists a service.
pub trait List: Driver {
    /// The connected client.
    type Client: Send + Sync + 'static;

    /// Connects with a pool for `connections` concurrent requests.
    ///
    /// # Errors
    /// None today (HTTP clients connect on first use); the signature leaves room.
    fn connect(
        server: &Server,
        connections: usize,
    ) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// One list request of `svc`, its answer read whole: the request a load phase times, so
    /// the body is parsed only where a client must parse it to know the instances (etcd).
    ///
    /// # Errors
    /// The server's refusal or a transport error.
    fn list(client: &Self::Client, svc: &str) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The number of instances a list of `svc` holds (the body parsed).
    ///
    /// # Errors
    /// The server's refusal, a transport error or a body that is not the protocol's JSON.
    fn count(
        client: &Self::Client,
        svc: &str,
    ) -> impl Future<Output = anyhow::Result<usize>> + Send;
}

/// What a subscriber received.
pub enum Update<'a> {
    /// The full list of instance ports (gangway snapshot, Nacos push).
    Ports(&'a mut dyn Iterator<Item = u64>),
    /// One etcd watch event, the key base64-encoded as the gateway sends it.
    Event {
        /// The key, base64.
        key: &'a str,
        /// Whether the key was deleted (else put).
        deleted: bool,
    },
}

/// Called with subscriber `i`'s update, on the task that received it.
pub type OnUpdate = Arc<dyn Fn(usize, Update<'_>) + Send + Sync>;

/// Subscribes to a service and follows its changes.
pub trait Subscribe: Driver {
    /// The driver that makes the changes the subscribers are to see.
    type Producer: Deregister;
    /// The open subscribers; dropping it closes them.
    type Held: Send + 'static;
    /// Whether every update is the whole list and a new subscriber is sent the current one
    /// (pushes), rather than only events of later changes (an etcd watch).
    const SENDS_LISTS: bool;
    /// How the producer makes instances, when not through this driver's own protocol ("" if it
    /// does): a remark for the tables.
    const PRODUCED_VIA: &'static str;

    /// Opens `n` subscribers of `svc` on `server`, each on its own connection; `on_update(i, u)`
    /// sees subscriber `i`'s updates.
    ///
    /// # Errors
    /// The first subscriber that could not be opened.
    fn subscribe(
        server: &Server,
        svc: &str,
        n: usize,
        on_update: OnUpdate,
    ) -> impl Future<Output = anyhow::Result<Self::Held>> + Send;

    /// How many times the server ended a subscriber's connection and the subscriber connected
    /// and subscribed again, as an SDK does (0 for drivers that do not reconnect).
    fn reconnects(_held: &Self::Held) -> u64 {
        0
    }
}

/// Holds instances in sessions: opens sessions first, then registers instances into each.
pub trait Hold: Driver {
    /// The open sessions; dropping them ends them.
    type Sessions: Send + Sync + 'static;

    /// Opens `n` sessions, each on its own connection (etcd: `n` leases).
    ///
    /// # Errors
    /// The first session that could not be opened.
    fn open(
        server: &Server,
        n: usize,
    ) -> impl Future<Output = anyhow::Result<Self::Sessions>> + Send;

    /// Registers instance `ip:port` of `svc` in session `session`.
    ///
    /// # Errors
    /// The server's refusal or a transport error.
    fn register(
        sessions: &Self::Sessions,
        session: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// A [`Register`] driver whose every worker is a session holding its own instances: holding `n`
/// sessions is connecting `n` workers.
pub trait SessionBound: Register {}

impl<D: SessionBound> Hold for D {
    type Sessions = D::Client;

    fn open(server: &Server, n: usize) -> impl Future<Output = anyhow::Result<D::Client>> + Send {
        D::connect(server, n)
    }

    fn register(
        sessions: &D::Client,
        session: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        <D as Register>::register(sessions, session, svc, ip, port)
    }
}
