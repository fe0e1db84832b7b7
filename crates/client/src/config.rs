//! Typed client configuration, built once.

use std::time::Duration;

use crate::Error;

/// Default pull fallback interval: 30 s (DESIGN §4, `R`).
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
/// Default first reconnect delay: 100 ms (the delay actually slept is drawn from its upper half,
/// 50-100 ms: [`ClientConfig::backoff_initial`]).
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Default reconnect delay cap: 2 s (slept: 1-2 s).
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Most registry addresses a [`ClientConfig`] may list: 64.
pub const MAX_ADDRESSES: usize = 64;
/// Default deadline of one request (and of [`Client::connect`](crate::Client::connect)): 10 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default TCP connect timeout: 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default HTTP/2 keepalive ping interval: 1 s.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Default HTTP/2 keepalive ping timeout: 3 s; an unanswered ping ends the session.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// Upper limit of every duration in a [`ClientConfig`]: 24 h.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// How a [`Client`](crate::Client) reaches and talks to the registry.
///
/// Build with [`ClientConfig::new`] and adjust the public fields; [`Client::connect`]
/// validates it and reports every problem at once ([`Error::InvalidConfig`]); every duration
/// must be within 0 < d <= [`MAX_DURATION`]. Nothing is read from the environment.
///
/// [`Client::connect`]: crate::Client::connect
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Registry gRPC addresses, 1 to [`MAX_ADDRESSES`] of them, each `http://host:port`,
    /// `https://host:port` (TLS; cargo feature `tls`) or `host:port` (then `http://` is
    /// assumed); all `https://` or none, no address twice.
    ///
    /// Several addresses name nodes of one cluster (docs/cluster.md, "Client failover"): the
    /// session is on one of them at a time. The first attempt goes to a random one when
    /// [`random_start`](Self::random_start) is set (the default; it spreads a fleet that shares
    /// one list over the nodes), else to the first; every later attempt goes to the next one in
    /// the list's order, wrapping around, after the [backoff](Self::backoff_initial). On the
    /// new node the client opens a new session with the same client id and restores every
    /// registration and subscription. A client stays on the node it reached (no fail-back).
    /// With several addresses one attempt waits at most
    /// [`connect_timeout`](Self::connect_timeout) + [`keepalive_timeout`](Self::keepalive_timeout)
    /// (within [`request_timeout`](Self::request_timeout)) for the node's answer, so a frozen
    /// node is left after seconds.
    pub addresses: Vec<String>,
    /// Whether the first connection attempt goes to a randomly chosen address of
    /// [`addresses`](Self::addresses) (`true`, the default) or to the first (`false`).
    pub random_start: bool,
    /// Name shown in the registry's subscriber listings. Default `gangway-client/<pid>`.
    pub client_name: String,
    /// Pull fallback interval: every subscription pulls (conditional on its revision) this
    /// often, in case a push was lost. Default [`DEFAULT_REFRESH`]; must be > 0.
    pub refresh: Duration,
    /// First delay before reconnecting (to the next address) after the stream ended or a
    /// connect failed; doubles on every failed attempt up to
    /// [`backoff_max`](Self::backoff_max), and starts again from here once a session is up.
    /// The time actually slept is drawn uniformly from the upper half of the delay (d/2..=d,
    /// jitter so that the clients of a node that died do not all come back at the same
    /// instant). A registry that says it is going away (`GoAway`, a node stopping) is left at
    /// once, without a delay. Default [`DEFAULT_BACKOFF_INITIAL`]; must be > 0.
    pub backoff_initial: Duration,
    /// Reconnect delay cap. Default [`DEFAULT_BACKOFF_MAX`]; must be >= `backoff_initial`.
    pub backoff_max: Duration,
    /// Deadline of each request (register, subscribe, ...) and of the first connection in
    /// [`Client::connect`](crate::Client::connect). A drain waits its own timeout plus this.
    /// Default [`DEFAULT_REQUEST_TIMEOUT`]; must be > 0.
    pub request_timeout: Duration,
    /// TCP connect timeout of one attempt. Default [`DEFAULT_CONNECT_TIMEOUT`]; must be > 0.
    pub connect_timeout: Duration,
    /// HTTP/2 keepalive ping interval (pings are sent even when idle). Default
    /// [`DEFAULT_KEEPALIVE_INTERVAL`]; must be > 0.
    pub keepalive_interval: Duration,
    /// How long an HTTP/2 keepalive ping may stay unanswered before the connection is
    /// considered dead and the client reconnects. Default [`DEFAULT_KEEPALIVE_TIMEOUT`]; must
    /// be > 0.
    pub keepalive_timeout: Duration,
    /// API token or login token sent on every session (`authorization: Bearer ...` metadata)
    /// to a registry that runs with `--auth`. Default none.
    pub token: Option<Token>,
    /// TLS toward an `https://` address: the CA to trust and a client identity. Default: none
    /// (the system's roots, no client certificate).
    pub tls: ClientTls,
}

/// TLS settings of an `https://` [`ClientConfig::address`] (cargo feature `tls`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientTls {
    /// PEM CA certificates that the registry's certificate must chain to, instead of the
    /// system's roots (as curl's `--cacert`): a private CA. `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and key, for a registry that requires them (`--tls-client-ca`).
    pub identity: Option<ClientIdentity>,
}

/// A client certificate chain and its private key, PEM. Its `Debug` shows no key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, PEM, the client's own certificate first.
    pub cert_pem: Vec<u8>,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &format_args!("<redacted>"))
            .finish()
    }
}

/// A secret token; its `Debug` shows no secret, so a logged config leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// Wraps a token (`gwt_...` from `gangway auth token create`).
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl ClientConfig {
    /// A config for the one registry at `address` with every other field at its default.
    pub fn new(address: impl Into<String>) -> Self {
        Self::from_addresses([address])
    }

    /// A config for the registry nodes at `addresses` (in failover order, see
    /// [`addresses`](Self::addresses)) with every other field at its default. An empty list
    /// is refused by [`validate`](Self::validate).
    pub fn from_addresses<A: Into<String>>(addresses: impl IntoIterator<Item = A>) -> Self {
        Self {
            addresses: addresses.into_iter().map(Into::into).collect(),
            random_start: true,
            client_name: format!("gangway-client/{}", std::process::id()),
            refresh: DEFAULT_REFRESH,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            token: None,
            tls: ClientTls::default(),
        }
    }

    /// Trusts the CA certificates in `pem` (instead of the system's roots) for an `https://`
    /// address: [`ClientTls::ca_pem`].
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` with its key `key_pem` to a registry that
    /// requires client certificates: [`ClientTls::identity`].
    pub fn with_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity = Some(ClientIdentity {
            cert_pem: cert_pem.into(),
            key_pem: key_pem.into(),
        });
        self
    }

    /// Sets [`tls`](Self::tls) to `tls` (the CLI's `--ca`, `--client-cert`, `--client-key`,
    /// read into one [`ClientTls`]).
    pub fn with_tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// The addresses are `https://` (all of them: [`validate`](Self::validate) refuses a mix).
    fn is_https(&self) -> bool {
        self.addresses.iter().any(|a| is_https(a))
    }

    /// The addresses as one line for messages: `a:1, b:2`.
    pub fn address_list(&self) -> String {
        self.addresses.join(", ")
    }

    /// Sets [`token`](Self::token).
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(Token::new(token));
        self
    }

    /// Sets [`token`](Self::token) to `token`: `None` sends no credentials (the CLI's
    /// optional `--token`).
    pub fn with_optional_token(mut self, token: Option<String>) -> Self {
        self.token = token.map(Token::new);
        self
    }

    /// Sets [`client_name`](Self::client_name).
    pub fn with_client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Sets [`refresh`](Self::refresh).
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`backoff_initial`](Self::backoff_initial) and [`backoff_max`](Self::backoff_max).
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max;
        self
    }

    /// Sets [`random_start`](Self::random_start).
    pub fn with_random_start(mut self, random_start: bool) -> Self {
        self.random_start = random_start;
        self
    }

    /// Each address with a scheme, in order: `http://` is prepended where none is given.
    pub fn uris(&self) -> Vec<String> {
        self.addresses.iter().map(|a| uri(a)).collect()
    }

    /// Checks every field; all problems are reported together.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] listing each problem.
    pub fn validate(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        self.check_addresses(&mut problems);
        for (name, value) in [
            ("refresh", self.refresh),
            ("backoff_initial", self.backoff_initial),
            ("backoff_max", self.backoff_max),
            ("request_timeout", self.request_timeout),
            ("connect_timeout", self.connect_timeout),
            ("keepalive_interval", self.keepalive_interval),
            ("keepalive_timeout", self.keepalive_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("{name}: must be > 0"));
            } else if value > MAX_DURATION {
                problems.push(format!("{name}: {value:?} is above the 24 h limit"));
            }
        }
        if let Some(t) = &self.token {
            let value = format!("Bearer {}", t.expose());
            if t.expose().is_empty()
                || value
                    .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
                    .is_err()
            {
                problems.push("token: empty or not printable ASCII".to_owned());
            }
        }
        self.check_tls(&mut problems);
        if self.backoff_max < self.backoff_initial {
            problems.push(format!(
                "backoff_max: {:?} is below backoff_initial {:?}",
                self.backoff_max, self.backoff_initial
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidConfig { problems })
        }
    }

    /// The address list's problems: none or too many, an empty or unparsable entry, one given
    /// twice, a mix of `https://` and not.
    fn check_addresses(&self, problems: &mut Vec<String>) {
        let n = self.addresses.len();
        if n == 0 {
            problems.push("addresses: empty list (give at least one registry address)".to_owned());
        } else if n > MAX_ADDRESSES {
            problems.push(format!("addresses: {n} given, at most {MAX_ADDRESSES}"));
        }
        // One address keeps the field name of one address in messages.
        let name = |i: usize| {
            if n == 1 {
                "address".to_owned()
            } else {
                format!("addresses[{i}]")
            }
        };
        for (i, address) in self.addresses.iter().enumerate() {
            if address.trim().is_empty() {
                problems.push(format!("{}: empty", name(i)));
            } else if tonic::transport::Endpoint::from_shared(uri(address)).is_err() {
                problems.push(format!("{}: not a valid URI: {address:?}", name(i)));
            } else if self.addresses[..i].contains(address) {
                problems.push(format!("{}: {address:?} is given twice", name(i)));
            }
        }
        let https = self.addresses.iter().filter(|a| is_https(a)).count();
        if https != 0 && https != n {
            problems.push(
                "addresses: mixes https:// and http:// (the nodes of one registry serve alike)"
                    .to_owned(),
            );
        }
    }

    /// The TLS settings' problems: they need an `https://` address, an `https://` address
    /// needs the `tls` feature, and the PEM texts must hold a certificate (and a key).
    fn check_tls(&self, problems: &mut Vec<String>) {
        let ClientTls { ca_pem, identity } = &self.tls;
        if !self.is_https() {
            if ca_pem.is_some() || identity.is_some() {
                problems
                    .push("tls: a CA or a client identity needs an https:// address".to_owned());
            }
            return;
        }
        #[cfg(not(feature = "tls"))]
        problems.push(
            "address: https:// needs TLS, which this build of gangway-client lacks (cargo \
             feature tls)"
                .to_owned(),
        );
        #[cfg(feature = "tls")]
        {
            use rustls_pki_types::pem::PemObject;
            use rustls_pki_types::{CertificateDer, PrivateKeyDer};
            let has_cert = |pem: &[u8]| CertificateDer::pem_slice_iter(pem).any(|c| c.is_ok());
            if ca_pem.as_deref().is_some_and(|pem| !has_cert(pem)) {
                problems.push("tls.ca_pem: no PEM certificate".to_owned());
            }
            if let Some(id) = identity {
                if !has_cert(&id.cert_pem) {
                    problems.push("tls.identity.cert_pem: no PEM certificate".to_owned());
                }
                if PrivateKeyDer::from_pem_slice(&id.key_pem).is_err() {
                    problems.push("tls.identity.key_pem: no PEM private key".to_owned());
                }
            }
        }
    }

    /// One tonic endpoint per address, in order.
    pub(crate) fn endpoints(&self) -> Result<Vec<tonic::transport::Endpoint>, Error> {
        self.addresses.iter().map(|a| self.endpoint(a)).collect()
    }

    /// The tonic endpoint of `address`: connect timeout, keepalive, TCP_NODELAY, and TLS for
    /// `https://`.
    fn endpoint(&self, address: &str) -> Result<tonic::transport::Endpoint, Error> {
        let invalid = |e: &dyn std::fmt::Display| Error::InvalidConfig {
            problems: vec![format!("address {address:?}: {e}")],
        };
        let endpoint =
            tonic::transport::Endpoint::from_shared(uri(address)).map_err(|e| invalid(&e))?;
        let endpoint = endpoint
            .connect_timeout(self.connect_timeout)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        #[cfg(feature = "tls")]
        if self.is_https() {
            use tonic::transport::{Certificate, ClientTlsConfig, Identity};
            let ClientTls { ca_pem, identity } = &self.tls;
            let mut tls = match ca_pem {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            if let Some(id) = identity {
                tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
            }
            return endpoint.tls_config(tls).map_err(|e| invalid(&e));
        }
        Ok(endpoint)
    }
}

/// `address` with a scheme: `http://` is prepended when none is given.
fn uri(address: &str) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// `address` starts with `https://` (in any case).
fn is_https(address: &str) -> bool {
    address
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = ClientConfig::new("127.0.0.1:9848");
        assert_eq!(c.uris(), ["http://127.0.0.1:9848"]);
        assert!(c.random_start);
        assert_eq!(c.refresh, Duration::from_secs(30));
        assert_eq!(c.backoff_initial, Duration::from_millis(100));
        assert_eq!(c.backoff_max, Duration::from_secs(2));
        assert_eq!(c.request_timeout, Duration::from_secs(10));
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        assert!(c.validate().is_ok());
        assert_eq!(ClientConfig::new("http://h:1").uris(), ["http://h:1"]);
        let two = ClientConfig::from_addresses(["a:1", "https://b:2"]);
        assert_eq!(two.uris(), ["http://a:1", "https://b:2"]);
        assert_eq!(two.address_list(), "a:1, https://b:2");
    }

    #[test]
    fn every_bad_address_of_a_list_is_named() {
        let problems = |c: ClientConfig| match c.validate() {
            Err(Error::InvalidConfig { problems }) => problems,
            other => panic!("accepted: {other:?}"),
        };
        assert_eq!(
            problems(ClientConfig::from_addresses(Vec::<String>::new())),
            ["addresses: empty list (give at least one registry address)"]
        );
        assert_eq!(
            problems(ClientConfig::from_addresses(["a:1", " ", "b:2", "a:1"])),
            [
                "addresses[1]: empty",
                "addresses[3]: \"a:1\" is given twice"
            ]
        );
        assert_eq!(
            problems(ClientConfig::from_addresses(["http://a:1", "https://b:2"]))[0],
            "addresses: mixes https:// and http:// (the nodes of one registry serve alike)"
        );
        let many: Vec<String> = (0..=MAX_ADDRESSES).map(|i| format!("h{i}:1")).collect();
        assert_eq!(
            problems(ClientConfig::from_addresses(many)),
            ["addresses: 65 given, at most 64"]
        );
        assert!(
            ClientConfig::from_addresses(["a:1", "b:2"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let mut c = ClientConfig::new("");
        c.refresh = Duration::ZERO;
        c.backoff_max = Duration::from_millis(1);
        let Err(Error::InvalidConfig { problems }) = c.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("address"));
        assert!(problems[1].starts_with("refresh"));
        assert!(problems[2].starts_with("backoff_max"));
    }
}
