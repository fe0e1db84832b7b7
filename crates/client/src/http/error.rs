//! Errors of the HTTP client.

use gangway_core::model::InstanceKey;

use crate::retry::Failure;

/// A request that got no answer. (An answer with any status, 5xx included, is a response.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The URL is not `http://<service>/...`.
    #[error("invalid URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The registry could not be asked (subscribe failed).
    #[error("cannot resolve service {service}: {source}")]
    Resolve {
        /// Service name.
        service: String,
        /// Why.
        source: crate::Error,
    },
    /// The service's view holds no instance that may be picked.
    #[error("service {service} has no available instance")]
    NoInstance {
        /// Service name.
        service: String,
    },
    /// The last attempt failed at the network level.
    #[error("request to {instance} failed after {attempts} attempt(s): {message}")]
    Failed {
        /// How the last attempt failed.
        failure: Failure,
        /// Attempts made.
        attempts: u32,
        /// Instance of the last attempt.
        instance: InstanceKey,
        /// The transport's message.
        message: String,
    },
}

impl RequestError {
    /// Attempts made (0 when none could be made).
    pub fn attempts(&self) -> u32 {
        match self {
            RequestError::Failed { attempts, .. } => *attempts,
            _ => 0,
        }
    }
}
