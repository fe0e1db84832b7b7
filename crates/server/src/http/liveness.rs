//! `GET /v1/services/{service}/liveness`: every instance with who keeps it alive and since
//! when (docs/api.md), for operators and the web console.

use axum::Json;
use axum::extract::State;
use gangway_core::model::{Instance, ProbeSpec, ServiceKey};
use serde::Serialize;
use tokio::time::Instant;

use super::{ApiPath, ApiQuery, AppState, Scope};
use crate::auth::{Caller, Rule};
use crate::engine::{Kept, Liveness};
use crate::error::ApiError;

#[derive(Serialize)]
pub(super) struct LivenessList {
    namespace: String,
    group: String,
    service: String,
    revision: u64,
    protection_triggered: bool,
    instances: Vec<KeptJson>,
}

/// One instance and its keeper. Exactly one of `session`, `lease`, `probe`, `grace`, `node`
/// is set, the one `liveness` names (`node`: `remote`, kept on that node of the cluster).
#[derive(Serialize)]
struct KeptJson {
    #[serde(flatten)]
    instance: Instance,
    /// `serving`, `offline`, `unhealthy` or `zero_weight`.
    state: &'static str,
    liveness: &'static str,
    /// Unix ms since its current keeper keeps it.
    since_ms: u64,
    /// The principal that registered it (null without auth).
    owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probe: Option<ProbeSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grace: Option<GraceJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
}

#[derive(Serialize)]
struct SessionJson {
    id: String,
    client_name: String,
    address: String,
}

#[derive(Serialize)]
struct LeaseJson {
    last_heartbeat_ms_ago: u64,
    ttl_ms: u64,
    delete_timeout_ms: u64,
}

#[derive(Serialize)]
struct GraceJson {
    ends_in_ms: u64,
}

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

fn kept_json(kept: Kept, now: Instant) -> KeptJson {
    let entry = kept.entry;
    let (mut lease, mut probe, mut grace, mut node) = (None, None, None, None);
    match &entry.liveness {
        Liveness::Session(_) => {}
        Liveness::Lease(l) => {
            lease = Some(LeaseJson {
                last_heartbeat_ms_ago: ms(now.saturating_duration_since(l.last_heartbeat)),
                ttl_ms: ms(l.ttl),
                delete_timeout_ms: ms(l.delete_timeout),
            })
        }
        Liveness::Probe(p) => probe = Some(p.clone()),
        Liveness::Grace { until, .. } => {
            grace = Some(GraceJson {
                ends_in_ms: ms(until.saturating_duration_since(now)),
            })
        }
        Liveness::Remote(r) => node = Some(r.node.clone()),
    }
    KeptJson {
        state: entry.instance.state_name(),
        liveness: entry.liveness.as_str(),
        since_ms: entry.since_ms,
        owner: entry.owner,
        session: kept.session.map(|s| SessionJson {
            id: s.id,
            client_name: s.client_name,
            address: s.peer,
        }),
        lease,
        probe,
        grace,
        node,
        instance: entry.instance,
    }
}

/// Rule `read`. An unknown service answers revision 0 and no instances, as the list call.
pub(super) async fn liveness(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<LivenessList>, ApiError> {
    let key: ServiceKey = q.service(&name)?;
    caller.allow(Rule::Read, &key.namespace, None)?;
    let (revision, kept) = s.registry.kept(&key);
    let protection_triggered = s.registry.view(&key).protection_triggered;
    let now = Instant::now();
    Ok(Json(LivenessList {
        revision,
        protection_triggered,
        instances: kept.into_iter().map(|k| kept_json(k, now)).collect(),
        namespace: key.namespace,
        group: key.group,
        service: key.service,
    }))
}
