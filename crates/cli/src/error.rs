//! The CLI's error: what went wrong, which exit status it maps to, and how `--json` prints it.

use std::fmt;
use std::io;

use gangway_wire::client::RestError;
use serde_json::{Value, json};

/// Exit status of a command that succeeded.
pub const EXIT_OK: u8 = 0;
/// Exit status when the registry refused the call, could not be reached, or output failed.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for bad arguments: caught by the CLI (nothing was sent; clap uses it too) or by
/// the registry (HTTP 400).
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a drain that timed out with laggards.
pub const EXIT_DRAIN_TIMEOUT: u8 = 3;

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments found after parsing (e.g. a metadata key given twice, a server flag out of
    /// its range); nothing was sent.
    Usage {
        /// The argument at fault, e.g. `--meta`, when there is one.
        field: Option<String>,
        /// The rule it broke.
        message: String,
    },
    /// The registry call failed.
    Api(RestError),
    /// Writing the output failed.
    Output(io::Error),
}

impl CliError {
    /// A usage error about the argument `field`.
    pub fn usage(field: &str, message: impl Into<String>) -> Self {
        CliError::Usage {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }

    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage { .. } | CliError::Api(RestError::Status { status: 400, .. }) => {
                EXIT_USAGE
            }
            CliError::Api(_) | CliError::Output(_) => EXIT_FAILURE,
        }
    }

    /// Whether this is stdout closing under us (`| head`): not worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }

    /// The error as `--json` prints it: the registry's error shape (docs/api.md),
    /// `{"error": {"code", "message", "field"}}`. An error answer of the registry keeps its own
    /// code, message and field; errors of the CLI's own get a code of their own
    /// (`invalid_argument` for bad arguments, `unreachable`, `timeout`, `transport`, `tls`,
    /// `not_registry`, `decode`, `output`; `http_<status>` for a foreign error answer).
    pub fn to_json(&self) -> Value {
        let (code, message, field) = match self {
            CliError::Usage { field, message } => (
                "invalid_argument".to_owned(),
                message.clone(),
                field.clone(),
            ),
            CliError::Api(RestError::Status {
                status,
                code,
                message,
                field,
            }) => (
                code.as_ref()
                    .map_or_else(|| format!("http_{status}"), |c| c.as_str().to_owned()),
                message.clone(),
                field.clone(),
            ),
            CliError::Api(e) => {
                let code = match e {
                    RestError::Unreachable { .. } => "unreachable",
                    RestError::Timeout { .. } => "timeout",
                    RestError::Transport { .. } => "transport",
                    RestError::Tls { .. } => "tls",
                    RestError::NotRegistry { .. } => "not_registry",
                    _ => "decode",
                };
                (code.to_owned(), e.to_string(), None)
            }
            CliError::Output(_) => ("output".to_owned(), self.to_string(), None),
        };
        error_json(&code, &message, field.as_deref())
    }
}

/// `{"error": {"code", "message", "field"}}`, the one error shape (docs/api.md).
pub fn error_json(code: &str, message: &str, field: Option<&str>) -> Value {
    json!({"error": {"code": code, "message": message, "field": field}})
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage {
                field: Some(field),
                message,
            } if !message.starts_with(field.as_str()) => write!(f, "{field}: {message}"),
            CliError::Usage { message, .. } => f.write_str(message),
            CliError::Api(e) => e.fmt(f),
            CliError::Output(e) => write!(f, "cannot write output: {e}"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Usage { .. } => None,
            CliError::Api(e) => Some(e),
            CliError::Output(e) => Some(e),
        }
    }
}

impl From<RestError> for CliError {
    fn from(e: RestError) -> Self {
        CliError::Api(e)
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}
