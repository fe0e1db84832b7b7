//! v1 instance lists, which also register the caller as a poller (`clientIP` + `udpPort`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use gangway_core::model::ServiceKey;

use super::error::NacosError;
use super::params::Params;
use super::{POLLER_EXPIRY_POLLS, allow_read};
use crate::auth::Caller;
use crate::engine::{SubscriberInfo, SubscriberKind};
use crate::nacos::{CLIENT_NAME_PREFIX, Nacos};

/// Registers the caller of a v1 list as a poller when it gave a `udpPort` > 0 (what a
/// subscribed 1.x or Node client sends; one-off lists send 0). The poller is identified by
/// `clientIP:udpPort` (the peer's IP when `clientIP` is absent) and the service, so one
/// client process polling one service is one subscriber. With auth on the identity is bound to
/// the principal (`<principal>:nacos-v1-...`, as `subscriber=NAME` is): another principal
/// polling with the same `clientIP` and `udpPort` is another subscriber and cannot ack for it.
pub(super) fn register_poller(
    nacos: &Nacos,
    caller: &Caller,
    service: &ServiceKey,
    p: &Params,
    peer: SocketAddr,
) -> Result<(), NacosError> {
    let udp = p.udp_port()?;
    if udp == 0 {
        return Ok(());
    }
    let client_ip = p
        .get("clientIP")
        .map(str::to_owned)
        .unwrap_or_else(|| peer.ip().to_string());
    let identity = format!("{client_ip}:{udp}");
    let name = match caller.owner() {
        Some(p) => format!(
            "{p}:{CLIENT_NAME_PREFIX}-v1-{:016x}",
            fnv1a(&format!("{service}|{p}|{identity}"))
        ),
        None => format!(
            "{CLIENT_NAME_PREFIX}-v1-{:016x}",
            fnv1a(&format!("{service}|{identity}"))
        ),
    };
    let expiry = Duration::from_millis(POLLER_EXPIRY_POLLS * crate::nacos::model::CACHE_MILLIS);
    let info = SubscriberInfo {
        // Nacos v1 clients keep their last list when they fetch one with no usable instance.
        ignores_empty_lists: true,
        ..SubscriberInfo::new(SubscriberKind::Poller, identity)
    };
    nacos
        .registry()
        .poll_as(service, &name, info, Some(expiry))?;
    Ok(())
}

pub(super) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

pub(super) async fn v1_list(
    State(nacos): State<Nacos>,
    caller: Caller,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    p: Params,
) -> Result<Response, NacosError> {
    let service = p.service()?;
    allow_read(&caller, &service)?;
    let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
    let clusters = p.get("clusters").unwrap_or("").to_owned();
    // Poll first: the revision acked is then never newer than the content returned.
    register_poller(&nacos, &caller, &service, &p, peer)?;
    let (_, info) = nacos.service_info(&service, &clusters, healthy_only, true);
    Ok(axum::Json(info).into_response())
}
