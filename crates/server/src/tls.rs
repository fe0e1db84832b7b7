//! TLS on both ports (cargo feature `tls`; docs/security.md, "TLS"): rustls with the ring
//! provider, certificates and keys read from PEM files.
//!
//! A [`Tls`] holds one rustls `ServerConfig` per port, made of the same certificate chain, key
//! and (optional) client CA: ALPN `h2` and `http/1.1` on the REST port, `h2` on the gRPC port.
//! Every accepted connection takes the configs in force at its accept, so [`Tls::reload`] (on
//! SIGHUP, or [`Tls::reload_if_changed`] when the files change) applies to the connections
//! accepted from then on; open connections keep the certificates they were accepted with. A
//! set of files that does not load leaves the old set in force.
//!
//! With a client CA every client must present a certificate that chains to it, or the
//! handshake fails: the certificate admits a connection, it names no principal (`--auth`
//! still decides what the connection may do).

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};

/// Largest PEM file read (certificate chain, key, client CA): 1 MiB, far above any real chain
/// (a few KiB); a larger file is refused rather than read whole.
pub const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The PEM files of a TLS setup (`--tls-cert`, `--tls-key`, `--tls-client-ca`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain: its own certificate first, then the intermediates.
    pub cert: PathBuf,
    /// The private key of the first certificate: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub key: PathBuf,
    /// CA certificates that client certificates must chain to. `None`: no client
    /// certificates are asked for.
    pub client_ca: Option<PathBuf>,
}

/// Which of the [`TlsFiles`] a [`TlsError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFileKind {
    /// [`TlsFiles::cert`].
    Cert,
    /// [`TlsFiles::key`].
    Key,
    /// [`TlsFiles::client_ca`].
    ClientCa,
}

impl fmt::Display for TlsFileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsFileKind::Cert => "certificate chain",
            TlsFileKind::Key => "private key",
            TlsFileKind::ClientCa => "client CA",
        })
    }
}

/// A TLS file that could not be used: which one, where, and why (one line, none of the
/// file's contents).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {}: {reason}", path.display())]
pub struct TlsError {
    /// The file's role.
    pub kind: TlsFileKind,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// The port a connection was accepted on, for its ALPN protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Port {
    /// REST: HTTP/2 and HTTP/1.1.
    Http,
    /// gRPC: HTTP/2 only.
    Grpc,
}

/// Loaded TLS settings of both ports, reloadable. Cheap to clone (shared).
#[derive(Clone)]
pub struct Tls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    current: RwLock<Arc<Loaded>>,
    /// The files' modification times and sizes at the last load attempt.
    stamps: Mutex<Stamps>,
}

struct Loaded {
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
    /// The first certificate of the chain, DER: what the unit tests compare.
    #[cfg(test)]
    served: Vec<u8>,
}

/// Modification time and size of each file (`None`: could not be read).
type Stamps = Vec<Option<(SystemTime, u64)>>;

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.inner.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads and checks the files: a certificate chain with at least one certificate, a
    /// private key that matches its first certificate, and, when given, a client CA file with
    /// at least one CA certificate. Each file may be at most [`MAX_PEM_FILE`].
    ///
    /// Errors: the first file that cannot be read or used, naming it and the problem.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let stamps = stamps(&files);
        let loaded = build(&files)?;
        Ok(Self {
            inner: Arc::new(Inner {
                files,
                current: RwLock::new(Arc::new(loaded)),
                stamps: Mutex::new(stamps),
            }),
        })
    }

    /// Reads the files again. A good set is used by every connection accepted from now on;
    /// open connections keep theirs.
    ///
    /// Errors: as [`Tls::load`]; the set in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = stamps(&self.inner.files);
        *self.inner.stamps.lock().unwrap_or_else(|p| p.into_inner()) = stamps;
        let loaded = build(&self.inner.files)?;
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(())
    }

    /// [`Tls::reload`] if a file's modification time or size differs from the last load
    /// attempt (a file replaced by a rename, or a symlink pointed elsewhere, as Kubernetes
    /// does with mounted secrets, counts too); `None` when nothing changed. A set that fails
    /// to load is tried again only once a file changes again, so a bad file is reported once.
    pub fn reload_if_changed(&self) -> Option<Result<(), TlsError>> {
        let now = stamps(&self.inner.files);
        if *self.inner.stamps.lock().unwrap_or_else(|p| p.into_inner()) == now {
            return None;
        }
        Some(self.reload())
    }

    /// The files this was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// Client certificates are required (a client CA is set).
    pub fn mutual(&self) -> bool {
        self.inner.files.client_ca.is_some()
    }

    /// `"mutual"` when client certificates are required, else `"on"`: what `/v1/health` and
    /// the start-up line show.
    pub fn mode(&self) -> &'static str {
        if self.mutual() { "mutual" } else { "on" }
    }

    /// An acceptor with the configs in force now, for one connection of `port`.
    pub(crate) fn acceptor(&self, port: Port) -> tokio_rustls::TlsAcceptor {
        let current = self
            .inner
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        tokio_rustls::TlsAcceptor::from(match port {
            Port::Http => current.http.clone(),
            Port::Grpc => current.grpc.clone(),
        })
    }
}

fn stamps(files: &TlsFiles) -> Stamps {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    })
    .collect()
}

fn problem(kind: TlsFileKind, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError {
        kind,
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// The bytes of the PEM file at `path`, at most [`MAX_PEM_FILE`] (the CLI reads its client
/// files with it too).
///
/// Errors: why the file cannot be used, in words (`cannot open it: ...`, `larger than ...`).
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(format!(
            "larger than {MAX_PEM_FILE} bytes, not a PEM file of certificates or a key"
        ));
    }
    Ok(bytes)
}

fn read(kind: TlsFileKind, path: &Path) -> Result<Vec<u8>, TlsError> {
    read_pem(path).map_err(|reason| problem(kind, path, reason))
}

/// What a PEM parse error means, in words (the parser's own text shows raw bytes).
fn pem_reason(e: &pem::Error, wanted: &str) -> String {
    match e {
        pem::Error::NoItemsFound => format!("no {wanted} in the file (is it PEM?)"),
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no END line".to_owned(),
        pem::Error::IllegalSectionStart { .. } => "a malformed PEM BEGIN line".to_owned(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".to_owned(),
        other => other.to_string(),
    }
}

/// Every certificate of a PEM file, at least one.
fn certificates(kind: TlsFileKind, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    const WANTED: &str = "PEM certificate (-----BEGIN CERTIFICATE-----)";
    let bytes = read(kind, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(kind, path, pem_reason(&e, WANTED)))?;
    if certs.is_empty() {
        return Err(problem(kind, path, format!("no {WANTED} in the file")));
    }
    Ok(certs)
}

fn build(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(TlsFileKind::Cert, &files.cert)?;
    #[cfg(test)]
    let served = chain[0].to_vec();
    let key_bytes = read(TlsFileKind::Key, &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        problem(
            TlsFileKind::Key,
            &files.key,
            pem_reason(&e, "PEM private key (PKCS#8, PKCS#1 or SEC1)"),
        )
    })?;
    let verifier = match &files.client_ca {
        None => WebPkiClientVerifier::no_client_auth(),
        Some(path) => client_verifier(path, &provider)?,
    };
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| problem(TlsFileKind::Cert, &files.cert, e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| match e {
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                problem(
                    TlsFileKind::Cert,
                    &files.cert,
                    format!("its first certificate is unusable: {e}"),
                )
            }
            rustls::Error::InconsistentKeys(_) => problem(
                TlsFileKind::Key,
                &files.key,
                format!(
                    "does not match the first certificate of {}",
                    files.cert.display()
                ),
            ),
            other => problem(TlsFileKind::Key, &files.key, other.to_string()),
        })?;
    let mut http = config.clone();
    http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut grpc = config;
    grpc.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Loaded {
        http: Arc::new(http),
        grpc: Arc::new(grpc),
        #[cfg(test)]
        served,
    })
}

fn client_verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let kind = TlsFileKind::ClientCa;
    let mut roots = RootCertStore::empty();
    for cert in certificates(kind, path)? {
        roots
            .add(cert)
            .map_err(|e| problem(kind, path, format!("not a usable CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| problem(kind, path, e.to_string()))
}

#[cfg(test)]
mod tests;
