//! The `--auth` file: users (argon2id password hashes) and API tokens (SHA-256 of the token),
//! each with its grants. TOML, written atomically (a temporary file in the same directory, then a
//! rename), so a server reloading it on SIGHUP never reads half a file.
//!
//! ```toml
//! [[users]]
//! name = "alice"
//! password_hash = "$argon2id$v=19$m=19456,t=2,p=1$..."
//! grants = [{ namespace = "public", role = "write" }]
//!
//! [[tokens]]
//! id = "3f9c2a71"
//! description = "deploy pipeline"
//! sha256 = "9b1d..."
//! grants = [{ namespace = "*", role = "read" }]
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Grant, Role};

/// Prefix of every API token (`gwt_<id>_<secret>`), so that a leaked one is easy to find in a
/// log or a repository.
pub const TOKEN_PREFIX: &str = "gwt_";

/// Bytes of randomness in a token's secret (256 bits).
const SECRET_BYTES: usize = 32;

/// What can go wrong reading, editing or writing the file.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML of this shape.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's reason (line and column).
        message: String,
    },
    /// An edit that contradicts the file (a user that exists already, or does not).
    #[error("{0}")]
    Refused(String),
    /// Hashing a password failed.
    #[error("password hashing failed: {0}")]
    Hash(String),
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    /// People and programs that log in with a name and a password.
    #[serde(default)]
    pub users: Vec<UserRecord>,
    /// API tokens.
    #[serde(default)]
    pub tokens: Vec<TokenRecord>,
}

/// One user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRecord {
    /// Login name (also the principal's name).
    pub name: String,
    /// Argon2id hash in PHC form (salt included).
    pub password_hash: String,
    /// What the user may do.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

/// One API token; the token itself is never stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// Public id, part of the token (`gwt_<id>_...`); the principal is `token:<id>`.
    pub id: String,
    /// Free text, for people.
    #[serde(default)]
    pub description: String,
    /// Hex SHA-256 of the whole token.
    pub sha256: String,
    /// What the token may do.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

impl AuthFile {
    /// Reads `path`. Errors: unreadable, or not this shape (the message names line and column).
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthFileError::Io {
            path: path.to_owned(),
            source,
        })?;
        let file: Self = toml::from_str(&text).map_err(|e| AuthFileError::Parse {
            path: path.to_owned(),
            message: parse_message(&text, &e),
        })?;
        let mut seen = std::collections::HashSet::new();
        for user in &file.users {
            let refused = |message| AuthFileError::Parse {
                path: path.to_owned(),
                message,
            };
            check_user_name(&user.name).map_err(refused)?;
            if !seen.insert(user.name.as_str()) {
                return Err(refused(format!(
                    "user {} is listed twice: each user once",
                    user.name
                )));
            }
        }
        Ok(file)
    }

    /// Reads `path`, or an empty file when it does not exist yet (the first `auth user add`).
    pub fn load_or_default(path: &Path) -> Result<Self, AuthFileError> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self::default())
        }
    }

    /// Writes to `path` atomically: a temporary file next to it (mode 0600), fsynced, renamed
    /// over it.
    pub fn save(&self, path: &Path) -> Result<(), AuthFileError> {
        let io = |source| AuthFileError::Io {
            path: path.to_owned(),
            source,
        };
        let text = toml::to_string_pretty(self).map_err(|e| AuthFileError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let written = (|| {
            let mut f = options.open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(io)
    }

    /// Adds a user with `password` hashed (argon2id, random salt). Errors: the name is taken
    /// or empty.
    pub fn add_user(
        &mut self,
        name: &str,
        password: &str,
        grants: Vec<Grant>,
    ) -> Result<(), AuthFileError> {
        check_user_name(name).map_err(AuthFileError::Refused)?;
        if self.users.iter().any(|u| u.name == name) {
            return Err(AuthFileError::Refused(format!(
                "user {name} exists already"
            )));
        }
        self.users.push(UserRecord {
            name: name.to_owned(),
            password_hash: hash_password(password)?,
            grants,
        });
        Ok(())
    }

    /// Removes a user. Errors: no such user.
    pub fn remove_user(&mut self, name: &str) -> Result<(), AuthFileError> {
        let before = self.users.len();
        self.users.retain(|u| u.name != name);
        if self.users.len() == before {
            return Err(AuthFileError::Refused(format!("no user {name}")));
        }
        Ok(())
    }

    /// Creates a token with `grants`; returns the token, which exists nowhere else: print it
    /// once.
    pub fn create_token(&mut self, description: &str, grants: Vec<Grant>) -> String {
        let id = loop {
            let id = hex(&random_bytes::<4>());
            if !self.tokens.iter().any(|t| t.id == id) {
                break id;
            }
        };
        let secret = base64_url(&random_bytes::<SECRET_BYTES>());
        let token = format!("{TOKEN_PREFIX}{id}_{secret}");
        self.tokens.push(TokenRecord {
            id,
            description: description.to_owned(),
            sha256: hex(&sha256(token.as_bytes())),
            grants,
        });
        token
    }

    /// Removes a token by id. Errors: no such token.
    pub fn remove_token(&mut self, id: &str) -> Result<(), AuthFileError> {
        let before = self.tokens.len();
        self.tokens.retain(|t| t.id != id);
        if self.tokens.len() == before {
            return Err(AuthFileError::Refused(format!("no token {id}")));
        }
        Ok(())
    }
}

/// An argon2id hash of `password` in PHC form, with a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, AuthFileError> {
    // 16 random bytes from the thread's CSPRNG (seeded by the OS), the size argon2 recommends.
    let salt = SaltString::encode_b64(&random_bytes::<16>())
        .map_err(|e| AuthFileError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthFileError::Hash(e.to_string()))
}

/// Whether `password` matches the PHC `hash` (false for a malformed hash). Slow on purpose
/// (argon2): callers cache a success.
pub fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| {
        Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// [`verify_password`] with argon2's working memory in `memory` (`m` KiB of the hash: 19 MiB
/// for the default hashes), grown or shrunk to the hash's size and kept for the next check.
/// Reusing a few buffers keeps the process's memory flat under a flood of checks: allocating
/// 19 MiB per check on ever other blocking threads let the allocator keep hundreds of MiB
/// (measured in docs/security.md, "Limits"). False for a malformed hash or a wrong password;
/// the comparison is in constant time.
pub fn verify_password_in(password: &str, hash: &str, memory: &mut Vec<argon2::Block>) -> bool {
    let Ok(h) = PasswordHash::new(hash) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (h.salt, h.hash) else {
        return false;
    };
    let Ok(algorithm) = argon2::Algorithm::try_from(h.algorithm) else {
        return false;
    };
    let version = match h.version.map(argon2::Version::try_from) {
        None => argon2::Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let Ok(params) = argon2::Params::try_from(&h) else {
        return false;
    };
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    memory.resize(params.block_count(), argon2::Block::default());
    let mut out = vec![0u8; expected.len()];
    let hashed = Argon2::new(algorithm, version, params).hash_password_into_with_memory(
        password.as_bytes(),
        salt,
        &mut out,
        memory.as_mut_slice(),
    );
    hashed.is_ok()
        && bool::from(subtle::ConstantTimeEq::ct_eq(
            out.as_slice(),
            expected.as_bytes(),
        ))
}

/// A grant: `role` on `namespace` (`*` for every namespace).
pub fn grant(namespace: &str, role: Role) -> Grant {
    Grant {
        namespace: namespace.to_owned(),
        role,
    }
}

pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rng().fill_bytes(&mut b);
    b
}

/// The parser's reason on one line, with line and column: a failed reload is one log line, and
/// no part of the file (hashes, token ids) is echoed into it as toml's own snippet would.
/// The user name no user may take: API tokens' principals are `token:<id>`, and a user named
/// `token` would make `token:` + a subscriber name `<id>:NAME` the very poller name
/// (`<principal>:NAME`) of that token's `NAME`, acking its drains.
pub const RESERVED_USER_NAME: &str = "token";

/// A user name: 1-64 letters, digits, '.', '_' or '-' (so never a ':', the separator of a
/// poller's `<principal>:NAME`), and not [`RESERVED_USER_NAME`]. Errors: the rule broken, in
/// one line naming the name.
fn check_user_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 64 || !name.chars().all(allowed) {
        return Err(format!(
            "invalid user name {name:?}: 1-64 letters, digits, '.', '_' or '-'"
        ));
    }
    if name == RESERVED_USER_NAME {
        return Err(format!(
            "invalid user name {name:?}: reserved (API tokens are the principals token:<id>)"
        ));
    }
    Ok(())
}

fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let reason = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {reason}")
        }
        None => reason,
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
