//! The flags of `gangway proxy`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::config::Overrides;
use crate::server::RunOptions;

/// Flags of `gangway proxy`; each wins over the same key of the `--config` file.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Signals: SIGHUP re-reads --config (a bad file keeps the running \
                        config); SIGTERM/SIGINT close the listener, finish requests in flight \
                        and exit. Settings, admin endpoints and examples: docs/proxy.md."
)]
pub struct ProxyArgs {
    /// Proxy listener: HTTP/1.1 and h2c (HTTP/2 prior knowledge) [file: listen; default
    /// 127.0.0.1:15001].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Admin listener (/services, /config, /metrics, /ready), or `off` [file: admin; default
    /// 127.0.0.1:15002].
    #[arg(long, value_name = "ADDR|off", value_parser = parse_admin)]
    pub admin: Option<AdminAddr>,
    /// TOML file with per-service settings; re-read on SIGHUP.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Registry gRPC address, or several nodes of one cluster: HOST:PORT,HOST:PORT (failover)
    /// [file: registry; default 127.0.0.1:9848].
    #[arg(long, env = "GANGWAY_GRPC", value_name = "HOST:PORT")]
    pub registry: Option<String>,
    /// Namespace of host names without one [file: namespace; default public].
    #[arg(long, short = 'n', env = "GANGWAY_NAMESPACE")]
    pub namespace: Option<String>,
    /// Group of host names without one [file: group; default DEFAULT_GROUP].
    #[arg(long, short = 'g', env = "GANGWAY_GROUP")]
    pub group: Option<String>,
    /// Log filter (`RUST_LOG` overrides).
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Runtime worker threads [default: one per core]; docs/proxy.md measures 1 against the
    /// default.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
}

/// `--admin`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminAddr(pub Option<SocketAddr>);

fn parse_admin(s: &str) -> Result<AdminAddr, String> {
    if s == "off" {
        return Ok(AdminAddr(None));
    }
    s.parse()
        .map(|a| AdminAddr(Some(a)))
        .map_err(|_| format!("expected IP:PORT or off, got {s:?}"))
}

impl ProxyArgs {
    /// What [`run`](crate::run) needs.
    pub fn options(&self, token: Option<String>) -> RunOptions {
        RunOptions {
            token,
            config: self.config.clone(),
            overrides: Overrides {
                registry: self.registry.clone(),
                listen: self.listen,
                admin: self.admin.map(|a| a.0),
                namespace: self.namespace.clone(),
                group: self.group.clone(),
            },
            tls: gangway_client::ClientTls::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_takes_an_address_or_off() {
        assert_eq!(parse_admin("off").unwrap(), AdminAddr(None));
        assert_eq!(
            parse_admin("127.0.0.1:9").unwrap(),
            AdminAddr(Some("127.0.0.1:9".parse().unwrap()))
        );
        assert!(
            parse_admin("nowhere")
                .unwrap_err()
                .contains("IP:PORT or off")
        );
    }
}
