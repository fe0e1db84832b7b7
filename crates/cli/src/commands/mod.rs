//! One module per command group. Each command takes the shared [`Context`] and its own clap
//! arguments, prints its answer (a table, or the raw JSON with `--json`) and returns the exit
//! status.

use std::process::ExitCode;

use gangway_client::ClientTls;
use gangway_wire::client::{RestClient, RestError};

use crate::error::{CliError, EXIT_OK};

pub mod auth;
pub mod drain;
pub mod list;
pub mod register;
pub mod watch;

/// What every registry command needs: the client and the output mode.
#[derive(Debug, Clone)]
pub struct Context {
    /// Client of the registry named by `--server`.
    pub registry: RestClient,
    /// `--server` as given: where the route toward the registry leads
    /// ([`crate::route::local_ip_toward`]).
    pub server: String,
    /// `--json`: print raw JSON answers instead of tables.
    pub json: bool,
}

/// The result of a command: an exit status, or an error to print.
pub type Outcome = Result<ExitCode, CliError>;

impl Context {
    /// A context for the registry at `server` (`host:port`, `http://` or `https://host:port`)
    /// whose requests carry `token` (`--token`, `GANGWAY_TOKEN`), with the TLS settings `tls`
    /// (`--ca`, `--client-cert`, `--client-key`).
    pub fn new(
        server: &str,
        token: Option<&str>,
        tls: &ClientTls,
        json: bool,
    ) -> Result<Self, RestError> {
        let mut builder = RestClient::builder(server)
            .user_agent(concat!("gangway-cli/", env!("CARGO_PKG_VERSION")))
            .token(token)
            .ca_pem(tls.ca_pem.clone());
        if let Some(id) = &tls.identity {
            builder = builder.identity_pem(id.cert_pem.clone(), id.key_pem.clone());
        }
        let registry = builder.build()?;
        Ok(Self {
            registry,
            server: server.to_owned(),
            json,
        })
    }
}

/// Exit status 0.
pub fn ok() -> Outcome {
    Ok(ExitCode::from(EXIT_OK))
}
