//! TLS toward the registry (docs/security.md, "TLS"): the global `--ca`, `--client-cert` and
//! `--client-key` flags, read once into a [`gangway_client::ClientTls`] that both the REST
//! client ([`gangway_wire::client::RestClient`], built in
//! [`crate::commands::Context::new`]) and the gRPC client (`gangway run`, the demos) use.

use std::path::{Path, PathBuf};

use clap::Args;
use gangway_client::{ClientIdentity, ClientTls};

use crate::error::CliError;

/// The TLS flags every registry command takes.
#[derive(Debug, Clone, Default, Args)]
pub struct TlsArgs {
    /// PEM CA certificates to trust for an https:// registry instead of the system's roots
    /// (a private CA).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "GANGWAY_CA",
        value_name = "FILE"
    )]
    pub ca: Option<PathBuf>,
    /// PEM client certificate for a registry that requires one (--tls-client-ca); needs
    /// --client-key.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "GANGWAY_CLIENT_CERT",
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        env = "GANGWAY_CLIENT_KEY",
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The files' contents, at most 1 MiB each (`gangway_server::tls::MAX_PEM_FILE`). Whether they hold PEM
    /// certificates and a key is checked by their users.
    ///
    /// Errors: a usage error (exit 2) naming the flag and the file that cannot be read.
    pub fn read(&self) -> Result<ClientTls, CliError> {
        let mut tls = ClientTls::default();
        if let Some(path) = &self.ca {
            tls.ca_pem = Some(read("--ca", path)?);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            tls.identity = Some(ClientIdentity {
                cert_pem: read("--client-cert", cert)?,
                key_pem: read("--client-key", key)?,
            });
        }
        Ok(tls)
    }
}

/// The file `flag` names, or a usage error naming both.
#[cfg(feature = "tls")]
fn read(flag: &str, path: &Path) -> Result<Vec<u8>, CliError> {
    gangway_server::tls::read_pem(path)
        .map_err(|reason| CliError::usage(flag, format!("{flag} {}: {reason}", path.display())))
}

/// Without TLS support any TLS file is refused.
#[cfg(not(feature = "tls"))]
fn read(flag: &str, _: &Path) -> Result<Vec<u8>, CliError> {
    Err(CliError::usage(flag, format!("{flag}: {NO_TLS}")))
}

// What a TLS flag gets from a build without TLS (the REST client says the same of an
// `https://` address).
#[cfg(not(feature = "tls"))]
pub(crate) use gangway_wire::client::NO_TLS;
