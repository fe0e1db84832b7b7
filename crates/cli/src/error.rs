//! The CLI's error: what went wrong and which exit status it maps to.

use std::fmt;
use std::io;

use crate::api::ApiError;

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
    /// Bad arguments found after parsing (e.g. a metadata key given twice); nothing was sent.
    Usage(String),
    /// The registry call failed.
    Api(ApiError),
    /// Writing the output failed.
    Output(io::Error),
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Api(ApiError::Status { status: 400, .. }) => EXIT_USAGE,
            CliError::Api(_) | CliError::Output(_) => EXIT_FAILURE,
        }
    }

    /// Whether this is stdout closing under us (`| head`): not worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) => f.write_str(m),
            CliError::Api(e) => e.fmt(f),
            CliError::Output(e) => write!(f, "cannot write output: {e}"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Usage(_) => None,
            CliError::Api(e) => Some(e),
            CliError::Output(e) => Some(e),
        }
    }
}

impl From<ApiError> for CliError {
    fn from(e: ApiError) -> Self {
        CliError::Api(e)
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Output(e)
    }
}
