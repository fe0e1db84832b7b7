//! Authentication and authorisation (docs/security.md).
//!
//! A [`Principal`] is a user (name and password, argon2id-hashed in the `--auth` file), an API
//! token (`gwt_<id>_<secret>`, stored as its SHA-256) or a login session of a user (the
//! `accessToken` of `POST /nacos/v1/auth/login`, held in memory). Each holds [`Grant`]s: a
//! [`Role`] on a namespace or on `*`. The [`Authority`] turns credentials into a [`Caller`];
//! every route makes exactly one decision, [`Caller::allow`] with its [`Rule`], whose answer is
//! 401 (no or bad credentials) or 403 (naming the rule).
//!
//! Nothing else the client sends (User-Agent, X-Forwarded-For, Nacos `serverIdentity`, its own
//! idea of its address) takes part in a decision.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub(crate) mod authority;
pub mod file;
pub mod layer;

#[cfg(test)]
mod tests;

pub use authority::{
    Authority, CredentialStamp, Credentials, LOGIN_TTL, MAX_LOGINS, MAX_LOGINS_PER_USER,
    MAX_PASSWORD_CHECKS, MAX_PASSWORD_WAITERS, PasswordChecks,
};
pub use file::{AuthFile, AuthFileError};

/// What a grant allows; each role includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// List services and instances, watch, subscribe.
    Read,
    /// Register, heartbeat, update and deregister instances (its own; offline, online and drain
    /// of its own too).
    Write,
    /// Everything in the namespace: instances it does not own, service settings, deletes.
    Admin,
}

impl Role {
    /// `read`, `write` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read" => Ok(Role::Read),
            "write" => Ok(Role::Write),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role {other:?}: read, write or admin")),
        }
    }
}

/// `role` on `namespace` (`*`: every namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// A namespace, or `*`.
    pub namespace: String,
    /// The role.
    pub role: Role,
}

/// Who is calling, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user's name, or `token:<id>`; instances it registers are owned by this name.
    pub name: String,
    /// What it may do.
    pub grants: Vec<Grant>,
    /// The credential that made it, for [`Authority::is_current`].
    pub(crate) credential: Credential,
}

/// Which credential of the `--auth` file made a [`Principal`]: a stream that outlives a reload
/// (a REST watch, a native gRPC session, the console's events) ends when it is gone or its
/// grants changed ([`Authority::revoked`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An API token: its id and the SHA-256 (hex) it is stored as, so a token removed and
    /// created again under the same id is another credential.
    Token {
        /// The token's id.
        id: String,
        /// Its stored SHA-256, hex.
        sha256: String,
    },
    /// A user's password (Basic, a login token, a console session): the user named by
    /// [`Principal::name`], with the password `stamp` says.
    User(CredentialStamp),
    /// Made without the file (tests): always current.
    #[cfg(test)]
    Given,
}

impl Principal {
    /// A principal made without the `--auth` file (tests): [`Authority::is_current`] always
    /// holds for it.
    #[cfg(test)]
    pub(crate) fn given(name: &str, grants: Vec<Grant>) -> Self {
        Self {
            name: name.to_owned(),
            grants,
            credential: Credential::Given,
        }
    }

    /// The highest role it holds on `namespace` (a `*` grant counts for every namespace).
    pub fn role_on(&self, namespace: &str) -> Option<Role> {
        self.grants
            .iter()
            .filter(|g| g.namespace == "*" || g.namespace == namespace)
            .map(|g| g.role)
            .max()
    }

    /// Whether it holds admin on `*` (Nacos's `globalAdmin`).
    pub fn global_admin(&self) -> bool {
        self.grants
            .iter()
            .any(|g| g.namespace == "*" && g.role == Role::Admin)
    }
}

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The server runs without `--auth`: everything is allowed, nothing is owned.
    Open,
    /// Auth is on and the request carried no credentials.
    Anonymous,
    /// Auth is on and the credentials were valid.
    Principal(Arc<Principal>),
}

/// One authorisation rule: each route (REST, Nacos HTTP, gRPC) names exactly one. The table is
/// in docs/security.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// List services, read a service, list instances, poll, watch, subscribe, list subscribers:
    /// `read`.
    Read,
    /// Register a new instance (or re-register one it owns): `write`.
    Register,
    /// Heartbeat, update, deregister, offline, online, drain an existing instance: `write`
    /// when the caller owns it, `admin` otherwise.
    Instance,
    /// Service settings (protect threshold, metadata), deleting a service: `admin`.
    Service,
    /// `/metrics` with `--metrics-auth`: any valid credentials.
    Metrics,
}

impl Rule {
    /// The rule's name in refusals and docs.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Read => "read",
            Rule::Register => "register",
            Rule::Instance => "instance",
            Rule::Service => "service",
            Rule::Metrics => "metrics",
        }
    }
}

/// A refused request: 401 or 403.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credentials, or credentials that are not valid (HTTP 401, gRPC UNAUTHENTICATED).
    #[error("{0}")]
    Unauthenticated(String),
    /// Valid credentials without the role the rule needs (HTTP 403, gRPC PERMISSION_DENIED).
    #[error("{message}")]
    Forbidden {
        /// The rule that refused.
        rule: &'static str,
        /// What it needed.
        message: String,
    },
    /// Too many of something at once (HTTP 429 `limit_exceeded`, gRPC RESOURCE_EXHAUSTED):
    /// the password checks waiting ([`authority::MAX_PASSWORD_WAITERS`]), the login sessions
    /// held ([`authority::MAX_LOGINS`]), the console sessions held
    /// ([`crate::console::MAX_SESSIONS`]).
    #[error("{message}")]
    LimitExceeded {
        /// The limit (`password-checks`, `login-tokens`, `console-sessions`).
        limit: &'static str,
        /// What was refused and why.
        message: String,
    },
}

impl Caller {
    /// The principal's name, for ownership: `None` when auth is off or for an anonymous caller.
    pub fn owner(&self) -> Option<&str> {
        match self {
            Caller::Principal(p) => Some(&p.name),
            _ => None,
        }
    }

    /// The one authorisation decision of a route. `owner` is the principal that owns the
    /// instance the request touches (for [`Rule::Instance`] and a re-registration).
    ///
    /// Errors: 401 for an anonymous caller; 403 naming the rule when the role is missing.
    pub fn allow(&self, rule: Rule, namespace: &str, owner: Option<&str>) -> Result<(), AuthError> {
        let p = match self {
            Caller::Open => return Ok(()),
            Caller::Anonymous => {
                return Err(AuthError::Unauthenticated(
                    "credentials required: Authorization: Bearer <token> (or Basic), or a Nacos \
                     accessToken"
                        .into(),
                ));
            }
            Caller::Principal(p) => p,
        };
        let role = p.role_on(namespace);
        let owns = owner.is_some_and(|o| o == p.name);
        let needed = match rule {
            Rule::Metrics => return Ok(()),
            Rule::Read => Role::Read,
            // A re-registration of an instance somebody else owns is a takeover.
            Rule::Register if owner.is_some() && !owns => Role::Admin,
            Rule::Register => Role::Write,
            // Its own instances a principal may always take out (DESIGN §4: drain on exit).
            Rule::Instance if owns => return Ok(()),
            Rule::Instance => Role::Admin,
            Rule::Service => Role::Admin,
        };
        if role.is_some_and(|r| r >= needed) {
            return Ok(());
        }
        let what = if matches!(rule, Rule::Instance | Rule::Register) && owner.is_some() && !owns {
            " (the instance belongs to another principal)"
        } else {
            ""
        };
        Err(AuthError::Forbidden {
            rule: rule.name(),
            message: format!(
                "rule {:?} needs {} on namespace {namespace:?}{what}; {} holds {}",
                rule.name(),
                needed.as_str(),
                p.name,
                role.map_or("nothing there", Role::as_str),
            ),
        })
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
