//! `gangway lab liveness` (to do).
use std::path::PathBuf;
use std::time::Duration;

/// Settings of the liveness suite.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `gangway` executable.
    pub exe: PathBuf,
    /// How long to watch a persistent instance whose port stopped listening.
    pub observe: Duration,
    /// Session keepalive interval.
    pub keepalive_interval: Duration,
    /// Session keepalive timeout.
    pub keepalive_timeout: Duration,
    /// Show a progress bar.
    pub progress: bool,
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Error, if the measurement could not run.
    pub error: Option<String>,
}

/// Runs the liveness suite.
///
/// # Errors
/// Never yet.
pub async fn run(_s: &Settings) -> anyhow::Result<Vec<Row>> {
    anyhow::bail!("not yet")
}

/// Renders the table.
pub fn render(_rows: &[Row]) -> String {
    String::new()
}
