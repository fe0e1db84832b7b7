//! `GET /v1/drains`: the drains waiting now with their progress, then the last ones that
//! ended (docs/api.md), for operators and the web console.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::{ApiQuery, AppState};
use crate::auth::{Caller, Rule};
use crate::engine::DrainProgress;
use crate::error::ApiError;

/// Optional exact-match filters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainFilter {
    namespace: Option<String>,
    group: Option<String>,
    service: Option<String>,
}

#[derive(Serialize)]
pub(super) struct DrainList {
    drains: Vec<DrainProgress>,
}

/// Rule `read`, per namespace: a caller sees the drains of the namespaces it may read.
pub(super) async fn drains(
    State(s): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<DrainFilter>,
) -> Result<Json<DrainList>, ApiError> {
    super::allow_listing(
        &caller,
        &q.namespace,
        &[
            ("namespace", &q.namespace),
            ("group", &q.group),
            ("service", &q.service),
        ],
    )?;
    let matches = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    let drains = s
        .registry
        .drains()
        .into_iter()
        .filter(|d| {
            matches(&q.namespace, &d.service.namespace)
                && matches(&q.group, &d.service.group)
                && matches(&q.service, &d.service.service)
                && caller.allow(Rule::Read, &d.service.namespace, None).is_ok()
        })
        .collect();
    Ok(Json(DrainList { drains }))
}
