//! The authority: the loaded `--auth` file, login sessions, and credentials to [`Caller`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use subtle::ConstantTimeEq;
use tokio::time::Instant;

use super::file::{self, AuthFile, AuthFileError, TOKEN_PREFIX, TokenRecord, UserRecord};
use super::{AuthError, Caller, Credential, Principal};

/// Lifetime of a login session (`accessToken` of `/nacos/v1/auth/login`): 5 hours, Nacos's
/// default `tokenTtl`.
pub const LOGIN_TTL: Duration = Duration::from_secs(18_000);

/// Prefix of a login session's token.
const LOGIN_PREFIX: &str = "gws_";

/// Most login sessions (Nacos `accessToken`s of [`Authority::login`]) held at once, all users
/// together. When that many are live a login is refused (HTTP 429 `limit_exceeded`, limit
/// `login-tokens`; the Nacos login answers 429 in its shape) rather than ending anyone's
/// session: the sessions held go only by expiry ([`LOGIN_TTL`]), a reload that ends their
/// user, and their own user's [`MAX_LOGINS_PER_USER`].
pub const MAX_LOGINS: usize = 10_000;

/// Most login sessions of one user: its login beyond that ends its own oldest session (the
/// one closest to expiry), never another user's.
pub const MAX_LOGINS_PER_USER: usize = 64;

/// Most cached password verifications (argon2 is slow on purpose); the cache is emptied when
/// full and on every reload.
const MAX_VERIFIED: usize = 1_024;

/// Credentials as a request carried them.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `Authorization: Bearer`, gRPC `authorization`, Nacos `accessToken`: an API token or a
    /// login session's token.
    Token(String),
    /// `Authorization: Basic`.
    Password {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    // Secrets never reach a log, not even through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
            Credentials::Password { user, .. } => write!(f, "Password({user}, <redacted>)"),
        }
    }
}

/// Turns credentials into a [`Caller`]. Cheap to clone. [`Authority::off`] (no `--auth`)
/// answers [`Caller::Open`] to everything.
#[derive(Clone, Default)]
pub struct Authority {
    shared: Option<Arc<Shared>>,
}

struct Shared {
    path: Option<PathBuf>,
    db: RwLock<Arc<Db>>,
    logins: Mutex<HashMap<[u8; 32], Login>>,
    verified: Mutex<HashSet<[u8; 32]>>,
    /// Password hashes being checked at once, at most [`MAX_PASSWORD_CHECKS`]; at most
    /// [`MAX_PASSWORD_WAITERS`] more wait. A permit is held by the blocking hash itself, so
    /// a request that goes away mid-check does not free its slot before the hash ends.
    checks: Arc<tokio::sync::Semaphore>,
    /// Hashes running now (on the blocking pool).
    running: AtomicUsize,
    /// Most hashes that ever ran at once.
    peak: AtomicUsize,
    /// Requests waiting for a turn.
    waiting: AtomicUsize,
    /// Checks refused because [`MAX_PASSWORD_WAITERS`] were waiting.
    refused: AtomicU64,
    /// argon2's working memory, one buffer per check running (so at most
    /// [`MAX_PASSWORD_CHECKS`]), reused from check to check.
    memory: Mutex<Vec<Vec<argon2::Block>>>,
    /// Bumped by every reload that read the file ([`Authority::generations`]).
    generation: tokio::sync::watch::Sender<u64>,
    /// Most login sessions held at once ([`MAX_LOGINS`] but in tests).
    max_logins: usize,
}

/// Most password checks (argon2: about 19 MiB and tens of ms each) run at once, whatever asks
/// (Basic auth, the Nacos login, the console); up to [`MAX_PASSWORD_WAITERS`] more wait their
/// turn, so a flood of wrong passwords costs time, not memory.
pub const MAX_PASSWORD_CHECKS: usize = 4;

/// Most password checks that wait for one of the [`MAX_PASSWORD_CHECKS`] turns; one more is
/// refused at once: HTTP 429 `limit_exceeded` (limit `password-checks`), Nacos login 429 with
/// Nacos error code 429, gRPC RESOURCE_EXHAUSTED. At about 50 ms a check the last waiter
/// waits about 64 / 4 × 50 ms = 0.8 s; a waiter holds only its request (its body is at most
/// [`crate::http::MAX_BODY_BYTES`]), never a hash's memory.
pub const MAX_PASSWORD_WAITERS: usize = 64;

/// Password checks now and since the start ([`Authority::password_checks`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PasswordChecks {
    /// Hashes running now (at most [`MAX_PASSWORD_CHECKS`]).
    pub running: usize,
    /// Most hashes that ran at once since the start.
    pub peak: usize,
    /// Checks waiting for a turn now (at most [`MAX_PASSWORD_WAITERS`]).
    pub waiting: usize,
    /// Checks refused (429) since the start because [`MAX_PASSWORD_WAITERS`] were waiting.
    pub refused: u64,
}

/// Decrements its counter when dropped (a check ends, a waiter gets its turn or goes away).
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Db {
    users: HashMap<String, UserRecord>,
    tokens: HashMap<String, TokenRecord>,
}

struct Login {
    user: String,
    /// The password it was made with: a user added again (a new password) or removed ends it.
    stamp: CredentialStamp,
    expires: Instant,
}

/// Which password of a user a login was made with: the SHA-256 of the user's stored argon2
/// hash. The hash's random salt makes every `gangway auth user add` a new stamp, even with the
/// same password, so a user removed and added again (a changed password) no longer matches
/// the login sessions and console sessions made before: they answer 401.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CredentialStamp([u8; 32]);

impl CredentialStamp {
    fn of(user: &UserRecord) -> Self {
        Self(file::sha256(user.password_hash.as_bytes()))
    }
}

impl std::fmt::Debug for CredentialStamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialStamp(<redacted>)")
    }
}

impl From<AuthFile> for Db {
    fn from(f: AuthFile) -> Self {
        Db {
            users: f.users.into_iter().map(|u| (u.name.clone(), u)).collect(),
            tokens: f.tokens.into_iter().map(|t| (t.id.clone(), t)).collect(),
        }
    }
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_on() {
            "Authority(on)"
        } else {
            "Authority(off)"
        })
    }
}

impl Authority {
    /// No authentication: every request is [`Caller::Open`].
    pub fn off() -> Self {
        Self::default()
    }

    /// Loads the `--auth` file. Errors: unreadable or malformed.
    pub fn load(path: &Path) -> Result<Self, AuthFileError> {
        let f = AuthFile::load(path)?;
        Ok(Self::build(Some(path.to_owned()), f, MAX_LOGINS))
    }

    /// From a file's contents (tests, embedding); [`Authority::reload`] then keeps them.
    pub fn from_file(f: AuthFile) -> Self {
        Self::build(None, f, MAX_LOGINS)
    }

    /// As [`Authority::from_file`], holding at most `max_logins` login sessions instead of
    /// [`MAX_LOGINS`] (tests of that cap; a `max_logins` of 0 refuses every login).
    pub fn from_file_with_max_logins(f: AuthFile, max_logins: usize) -> Self {
        Self::build(None, f, max_logins)
    }

    fn build(path: Option<PathBuf>, f: AuthFile, max_logins: usize) -> Self {
        Self {
            shared: Some(Arc::new(Shared {
                path,
                db: RwLock::new(Arc::new(f.into())),
                logins: Mutex::new(HashMap::new()),
                verified: Mutex::new(HashSet::new()),
                checks: Arc::new(tokio::sync::Semaphore::new(MAX_PASSWORD_CHECKS)),
                running: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                refused: AtomicU64::new(0),
                memory: Mutex::new(Vec::new()),
                generation: tokio::sync::watch::Sender::new(0),
                max_logins,
            })),
        }
    }

    /// Whether authentication is on.
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// The password checks running and waiting now, the most that ran at once, and how many
    /// were refused; all zero when authentication is off.
    pub fn password_checks(&self) -> PasswordChecks {
        let Some(s) = &self.shared else {
            return PasswordChecks::default();
        };
        PasswordChecks {
            running: s.running.load(Ordering::SeqCst),
            peak: s.peak.load(Ordering::SeqCst),
            waiting: s.waiting.load(Ordering::SeqCst),
            refused: s.refused.load(Ordering::SeqCst),
        }
    }

    /// Reads the file again (SIGHUP). Removed users and tokens stop working at once, login
    /// sessions of removed users too, and so do the open streams of every credential removed
    /// or changed ([`Authority::revoked`]); on an error the old contents stay in force.
    /// Returns the number of users and tokens loaded.
    pub fn reload(&self) -> Result<(usize, usize), AuthFileError> {
        let Some(s) = &self.shared else {
            return Ok((0, 0));
        };
        let Some(path) = &s.path else {
            let db = s.db.read().unwrap_or_else(|p| p.into_inner());
            return Ok((db.users.len(), db.tokens.len()));
        };
        let db: Db = AuthFile::load(path)?.into();
        let counts = (db.users.len(), db.tokens.len());
        *s.db.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(db);
        s.verified.lock().unwrap_or_else(|p| p.into_inner()).clear();
        // After the new contents are in: a stream woken by it checks against them.
        s.generation.send_modify(|g| *g += 1);
        Ok(counts)
    }

    fn db(s: &Shared) -> Arc<Db> {
        s.db.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The caller for these credentials. Password checks (argon2) run on a blocking thread.
    ///
    /// Errors: 401 when credentials are present but not valid (unknown or wrong token, wrong
    /// password, expired login); `None` is [`Caller::Anonymous`], which only the route's rule
    /// may refuse.
    pub async fn authenticate(
        &self,
        credentials: Option<Credentials>,
    ) -> Result<Caller, AuthError> {
        let Some(s) = &self.shared else {
            return Ok(Caller::Open);
        };
        let Some(credentials) = credentials else {
            return Ok(Caller::Anonymous);
        };
        let principal = match credentials {
            Credentials::Token(token) => self.token(s, &token)?,
            Credentials::Password { user, password } => self.password(&user, &password).await?.0,
        };
        Ok(Caller::Principal(Arc::new(principal)))
    }

    /// Logs a user in: a new login session's token, valid for [`LOGIN_TTL`], and the principal.
    /// Errors: 401 for an unknown user or a wrong password (the same answer for both).
    pub async fn login(
        &self,
        user: &str,
        password: &str,
    ) -> Result<(String, Principal), AuthError> {
        let Some(s) = &self.shared else {
            return Err(AuthError::Unauthenticated("authentication is off".into()));
        };
        let (principal, stamp) = self.password(user, password).await?;
        let token = format!(
            "{LOGIN_PREFIX}{}",
            file::base64_url(&file::random_bytes::<32>())
        );
        let now = Instant::now();
        let mut logins = s.logins.lock().unwrap_or_else(|p| p.into_inner());
        let room = make_room(
            &mut logins,
            user,
            (MAX_LOGINS_PER_USER, s.max_logins),
            now,
            |l| (l.user.as_str(), l.expires),
        );
        if !room {
            return Err(AuthError::LimitExceeded {
                limit: "login-tokens",
                message: format!(
                    "limit login-tokens reached: {} login sessions are held; retry once some \
                     have expired (after at most {} s), or use an API token",
                    s.max_logins,
                    LOGIN_TTL.as_secs()
                ),
            });
        }
        logins.insert(
            file::sha256(token.as_bytes()),
            Login {
                user: user.to_owned(),
                stamp,
                expires: now + LOGIN_TTL,
            },
        );
        Ok((token, principal))
    }

    /// Checks a user's password (argon2, on a blocking thread): the user's principal and the
    /// stamp of the password checked, which [`Authority::user`] wants back. For a login that
    /// keeps its own session (the web console).
    ///
    /// Errors: 401 for an unknown user or a wrong password (the same answer for both), and
    /// when authentication is off; 429 `password-checks` ([`MAX_PASSWORD_WAITERS`]).
    pub async fn check_password(
        &self,
        user: &str,
        password: &str,
    ) -> Result<(Principal, CredentialStamp), AuthError> {
        self.password(user, password).await
    }

    /// The principal of user `name` with its grants as the file says now, if its password is
    /// still the one `stamp` was made with: `None` when authentication is off, there is no such
    /// user (any more: removed at a reload), or it was added again since (a changed password).
    /// For sessions that outlive a reload (the web console's).
    pub fn user(&self, name: &str, stamp: &CredentialStamp) -> Option<Principal> {
        let db = Self::db(self.shared.as_ref()?);
        db.users
            .get(name)
            .filter(|u| CredentialStamp::of(u) == *stamp)
            .map(Self::of_user)
    }

    /// A reload's generation: it changes at every reload that read the file (SIGHUP,
    /// [`Authority::reload`]); `None` when authentication is off. A stream that outlives a
    /// reload waits on it ([`Authority::revoked`]).
    pub fn generations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.shared.as_ref()?.generation.subscribe())
    }

    /// Whether the principal named `name` (`token:<id>`, or a user name: user names never
    /// hold a ':' and `token` is reserved, so the two cannot be confused) still has a
    /// credential in the file; false once its token or user was removed. Always true with
    /// authentication off.
    pub fn knows(&self, name: &str) -> bool {
        let Some(s) = &self.shared else {
            return true;
        };
        let db = Self::db(s);
        match name.strip_prefix("token:") {
            Some(id) => db.tokens.contains_key(id),
            None => db.users.contains_key(name),
        }
    }

    /// Whether the credential that made `principal` is still in the file with the same
    /// grants: the API token with the same id and secret, or the user with the same password
    /// ([`CredentialStamp`]). Always true when authentication is off.
    pub fn is_current(&self, principal: &Principal) -> bool {
        let Some(s) = &self.shared else {
            return true;
        };
        let db = Self::db(s);
        match &principal.credential {
            Credential::Token { id, sha256 } => db
                .tokens
                .get(id)
                .is_some_and(|t| t.sha256 == *sha256 && t.grants == principal.grants),
            Credential::User(stamp) => db
                .users
                .get(&principal.name)
                .is_some_and(|u| CredentialStamp::of(u) == *stamp && u.grants == principal.grants),
            #[cfg(test)]
            Credential::Given => true,
        }
    }

    /// Completes once `caller`'s credential is no longer current ([`Authority::is_current`])
    /// after a reload, or at once if it is not now; never for [`Caller::Open`] and
    /// [`Caller::Anonymous`] or with authentication off. Every long-lived stream (a REST
    /// watch, a native gRPC session, the console's events) ends with it, so a token or user
    /// removed, given other grants, or given a new password at a SIGHUP loses its open streams
    /// too. Cancel-safe (it holds nothing but a `watch` receiver).
    pub fn revoked(&self, caller: &Caller) -> impl Future<Output = ()> + Send + use<> {
        let principal = match caller {
            Caller::Principal(p) => Some(Arc::clone(p)),
            _ => None,
        };
        let this = self.clone();
        async move {
            let (Some(principal), Some(mut generations)) = (principal, this.generations()) else {
                return std::future::pending().await;
            };
            // Subscribed before the first check, so a reload between the two is not missed.
            while this.is_current(&principal) {
                if generations.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    fn of_user(u: &UserRecord) -> Principal {
        Principal {
            name: u.name.clone(),
            grants: u.grants.clone(),
            credential: Credential::User(CredentialStamp::of(u)),
        }
    }

    /// The stamp of user `name`'s password now (tests that make console sessions directly).
    #[cfg(test)]
    pub(crate) fn current_stamp(&self, name: &str) -> Option<CredentialStamp> {
        Self::db(self.shared.as_ref()?)
            .users
            .get(name)
            .map(CredentialStamp::of)
    }

    /// Time left of the login session `token` (a `gws_` token of [`Authority::login`]):
    /// `None` for anything else (an API token, which does not expire) and for a session that
    /// has ended.
    pub fn login_expires_in(&self, token: &str) -> Option<Duration> {
        let s = self.shared.as_ref()?;
        let logins = s.logins.lock().unwrap_or_else(|p| p.into_inner());
        let login = logins.get(&file::sha256(token.as_bytes()))?;
        login.expires.checked_duration_since(Instant::now())
    }

    fn token(&self, s: &Shared, token: &str) -> Result<Principal, AuthError> {
        let bad = || AuthError::Unauthenticated("invalid or expired token".into());
        let db = Self::db(s);
        if token.starts_with(LOGIN_PREFIX) {
            let logins = s.logins.lock().unwrap_or_else(|p| p.into_inner());
            let login = logins
                .get(&file::sha256(token.as_bytes()))
                .filter(|l| l.expires > Instant::now())
                .ok_or_else(bad)?;
            // The user's current grants: a removed user's sessions end with the reload, and so
            // do those made with a password the user no longer has.
            let user = db
                .users
                .get(&login.user)
                .filter(|u| CredentialStamp::of(u) == login.stamp)
                .ok_or_else(bad)?;
            return Ok(Self::of_user(user));
        }
        let rest = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
        let (id, _) = rest.split_once('_').ok_or_else(bad)?;
        let record = db.tokens.get(id).ok_or_else(bad)?;
        let want = record.sha256.as_bytes();
        let got = file::hex(&file::sha256(token.as_bytes()));
        if !bool::from(want.ct_eq(got.as_bytes())) {
            return Err(bad());
        }
        Ok(Principal {
            name: format!("token:{}", record.id),
            grants: record.grants.clone(),
            credential: Credential::Token {
                id: record.id.clone(),
                sha256: record.sha256.clone(),
            },
        })
    }

    async fn password(
        &self,
        user: &str,
        password: &str,
    ) -> Result<(Principal, CredentialStamp), AuthError> {
        let bad = || AuthError::Unauthenticated("invalid user name or password".into());
        let Some(s) = &self.shared else {
            return Err(bad());
        };
        let db = Self::db(s);
        // An unknown user costs a hash too, so the answer's timing does not tell names apart.
        let (hash, principal) = match db.users.get(user) {
            Some(u) => (
                u.password_hash.clone(),
                Some((Self::of_user(u), CredentialStamp::of(u))),
            ),
            None => (DUMMY_HASH.to_owned(), None),
        };
        let key = file::sha256(format!("{user}\0{password}\0{hash}").as_bytes());
        let cached = s
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key);
        if !cached {
            let password = password.to_owned();
            let check = hash.clone();
            let turn = Self::turn(s).await?;
            let shared = Arc::clone(s);
            let ok = tokio::task::spawn_blocking(move || {
                let _turn = turn;
                let now = shared.running.fetch_add(1, Ordering::SeqCst) + 1;
                shared.peak.fetch_max(now, Ordering::SeqCst);
                let _running = Counted(&shared.running);
                let pool = || shared.memory.lock().unwrap_or_else(|p| p.into_inner());
                let mut memory = pool().pop().unwrap_or_default();
                let ok = file::verify_password_in(&password, &check, &mut memory);
                pool().push(memory);
                ok
            })
            .await
            .unwrap_or(false);
            if !ok {
                return Err(bad());
            }
            let mut verified = s.verified.lock().unwrap_or_else(|p| p.into_inner());
            if verified.len() >= MAX_VERIFIED {
                verified.clear();
            }
            verified.insert(key);
        }
        principal.ok_or_else(bad)
    }
}

impl Authority {
    /// One of the [`MAX_PASSWORD_CHECKS`] turns, waiting as one of at most
    /// [`MAX_PASSWORD_WAITERS`]. Errors: 429 `password-checks` when that many wait.
    async fn turn(s: &Shared) -> Result<tokio::sync::OwnedSemaphorePermit, AuthError> {
        if let Ok(turn) = Arc::clone(&s.checks).try_acquire_owned() {
            return Ok(turn);
        }
        let ahead = s.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Counted(&s.waiting);
        if ahead >= MAX_PASSWORD_WAITERS {
            s.refused.fetch_add(1, Ordering::SeqCst);
            return Err(AuthError::LimitExceeded {
                limit: "password-checks",
                message: format!(
                    "limit password-checks reached: {MAX_PASSWORD_CHECKS} password checks are \
                     running and {MAX_PASSWORD_WAITERS} are waiting; retry shortly"
                ),
            });
        }
        Arc::clone(&s.checks)
            .acquire_owned()
            .await
            .map_err(|_| AuthError::Unauthenticated("invalid user name or password".into()))
    }
}

/// Makes room in a session table (login sessions, console sessions) for one more session of
/// `user`: drops the expired ones, then `user`'s own oldest (closest to expiry) while it holds
/// `per_user`; false (refuse the new one) when `global` sessions are held even so. Nobody
/// else's session is ever ended for it. `of` gives a session's user and expiry. O(sessions).
pub(crate) fn make_room<K: Copy + Eq + std::hash::Hash, V>(
    table: &mut HashMap<K, V>,
    user: &str,
    (per_user, global): (usize, usize),
    now: Instant,
    of: impl Fn(&V) -> (&str, Instant),
) -> bool {
    table.retain(|_, v| of(&*v).1 > now);
    let mut own: Vec<(Instant, K)> = table
        .iter()
        .filter_map(|(k, v)| {
            let (owner, expires) = of(v);
            (owner == user).then_some((expires, *k))
        })
        .collect();
    // With the new one it would hold own.len() + 1: the oldest beyond `per_user` go.
    own.sort_unstable_by_key(|(expires, _)| *expires);
    for (_, key) in own.iter().take((own.len() + 1).saturating_sub(per_user)) {
        table.remove(key);
    }
    table.len() < global
}

/// An argon2id hash of a random string nobody knows, verified against for unknown users.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$0uG6yVbW3Xk1tHq4w9hB9C2iH8Zr9mQ1dG3oK6pVw0s";
