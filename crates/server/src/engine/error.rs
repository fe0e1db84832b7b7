//! What the engine refuses, in its own terms: each transport (REST in `crate::error`, the native
//! gRPC protocol and the Nacos layers) maps these to its wire in one place. Nothing was changed
//! when one is returned.

use std::sync::Arc;

use gangway_core::ValidationError;
use gangway_core::model::{InstanceKey, Kind, ServiceKey};
use gangway_store::StoreError;

/// A refused or failed registry operation.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Bad input, naming the field and the rule.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// No such instance.
    #[error("no instance {instance} in service {service}")]
    UnknownInstance {
        /// Service asked for.
        service: ServiceKey,
        /// Instance asked for.
        instance: InstanceKey,
    },
    /// The registry knows nothing of this service.
    #[error("no service {0}")]
    UnknownService(ServiceKey),
    /// No such session (it ended).
    #[error("no session {0}")]
    UnknownSession(String),
    /// The service holds instances of the other kind (ephemeral vs persistent).
    #[error(
        "service {service} is {existing}; cannot register an instance of the other kind ({wanted}) in it"
    )]
    KindConflict {
        /// The service.
        service: ServiceKey,
        /// Its kind.
        existing: Kind,
        /// The kind asked for.
        wanted: Kind,
    },
    /// A session keeps the instance alive and owns it (issue 9 part 7).
    #[error(
        "instance {instance} of {service} is kept alive by {owner} and belongs to it; offline or \
         drain take it out of traffic, and only its session (or force) removes it"
    )]
    OwnedBySession {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
        /// Who owns it: `session ID (client NAME at PEER)`.
        owner: String,
    },
    /// A session asked to remove an instance it does not own.
    #[error("instance {instance} of {service} is not registered on this session")]
    NotOnThisSession {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
    },
    /// Taking the instance out would leave the consumer view empty, and no force was given.
    #[error(
        "{instance} is the last serving instance of {service}; taking it out of the consumer \
         view would cut all traffic (use force to do it anyway)"
    )]
    LastServingInstance {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
    },
    /// A heartbeat for an instance that no lease keeps alive.
    #[error("instance {instance} of {service} is kept alive by its {kept_by}, not by heartbeats")]
    NotLeaseKept {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
        /// What keeps it alive (`session`, `probe`, `grace`).
        kept_by: &'static str,
    },
    /// A readiness wait for an instance no revision can make ready.
    #[error(
        "{instance} is not in the consumer view of {service} (offline, unhealthy or weight 0): \
         it cannot become ready"
    )]
    NotInView {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
    },
    /// A readiness wait ended because the instance left the consumer view meanwhile (taken
    /// offline, drained, unhealthy or weight 0): it will not become ready.
    #[error(
        "{instance} left the consumer view of {service} during the readiness wait (taken \
         offline, drained, unhealthy or weight 0)"
    )]
    LeftView {
        /// The service.
        service: ServiceKey,
        /// The instance.
        instance: InstanceKey,
    },
    /// A session holds the most subscriptions or instances it may
    /// ([`SessionLimits`](crate::config::SessionLimits)); nothing was changed.
    #[error(
        "limit {limit} reached: a session may hold at most {max}; nothing was changed (end \
         what it no longer needs, or raise the server's --max-{limit})"
    )]
    LimitExceeded {
        /// `subscriptions-per-session` or `instances-per-session`.
        limit: &'static str,
        /// The limit's value.
        max: usize,
    },
    /// The caller's credentials do not allow the change, decided against the registry's state
    /// in the critical section that would have applied it (docs/security.md).
    #[error("{0}")]
    Refused(crate::auth::AuthError),
    /// A service that still holds instances cannot be deleted.
    #[error("service {0} still holds instances; deregister them first")]
    ServiceNotEmpty(ServiceKey),
    /// Snapshots are held back (warm-up after start, stall recovery): pulls wait.
    #[error("the registry is warming up; retry shortly")]
    WarmingUp,
    /// Cluster mode: a key this change writes was changed on another node meanwhile (the
    /// store's revision check failed); nothing was applied. Retrying decides again on the
    /// newer state.
    #[error("changed on another node of the cluster meanwhile: {0}; nothing was applied, retry")]
    ChangedElsewhere(String),
    /// The durable store failed; nothing of the batch was applied.
    #[error("the store failed: {0}")]
    Store(Arc<StoreError>),
    /// An internal task failed (a bug or a shutdown).
    #[error("internal: {0}")]
    Internal(String),
}

impl RegistryError {
    /// The request field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            RegistryError::Invalid(v) => Some(&v.field),
            _ => None,
        }
    }

    /// The instance is unknown, or the service (nothing to find).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RegistryError::UnknownInstance { .. }
                | RegistryError::UnknownService(_)
                | RegistryError::UnknownSession(_)
        )
    }

    /// The request contradicts the registry's state (kind, ownership, last serving instance,
    /// not lease-kept, not in the view).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            RegistryError::KindConflict { .. }
                | RegistryError::OwnedBySession { .. }
                | RegistryError::NotOnThisSession { .. }
                | RegistryError::LastServingInstance { .. }
                | RegistryError::NotLeaseKept { .. }
                | RegistryError::NotInView { .. }
                | RegistryError::LeftView { .. }
                | RegistryError::ServiceNotEmpty(_)
                | RegistryError::ChangedElsewhere(_)
        )
    }
}

impl From<StoreError> for RegistryError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(m) => RegistryError::ChangedElsewhere(m),
            e => RegistryError::Store(Arc::new(e)),
        }
    }
}
