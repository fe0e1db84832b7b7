//! An instance named on the command line **or by the environment**, so a Kubernetes preStop
//! hook is a plain argv (`[gangway, offline, --wait]`) with no shell: Kubernetes expands
//! `$(POD_IP)` in a container's command, args and env, but not in
//! `lifecycle.preStop.exec.command` (kubernetes/kubernetes#129502), so an address in the hook's
//! argv would reach gangway as the literal text `$(POD_IP):8080`.
//!
//! | part | argument | environment |
//! |---|---|---|
//! | service | `SERVICE` | `GANGWAY_SERVICE` |
//! | address | `IP:PORT` (after `SERVICE`) | `--ip` / `GANGWAY_IP`, `--port` / `GANGWAY_PORT` |
//! | IP, when none of the above gives it | the local address of the route toward the registry ([`route`](crate::route)), as `gangway run` registers it | |
//! | cluster | `--cluster` | `GANGWAY_CLUSTER` |
//! | namespace, group | `--namespace`, `--group` | `GANGWAY_NAMESPACE`, `GANGWAY_GROUP` |
//!
//! An argument wins over the environment. `IP:PORT` comes second, so it can only be given
//! together with `SERVICE`.

use clap::Args;

use crate::args::{Addr, InstanceArgs, ServiceArgs, parse_addr, parse_name, parse_port};
use crate::error::CliError;
use crate::route;

/// Names an instance: `[SERVICE [IP:PORT]]`, each part falling back to the environment (see the
/// [module docs](self)).
#[derive(Debug, Clone, Args)]
pub struct EnvInstanceArgs {
    /// Service name [env: GANGWAY_SERVICE].
    // Checked as every SERVICE is: `.` and `..` would be resolved out of the URL.
    #[arg(value_name = "SERVICE", env = "GANGWAY_SERVICE", hide_env = true, value_parser = crate::args::parse_name)]
    pub service: Option<String>,
    /// Instance address: 10.0.0.5:8080, [fd00::5]:8080 or host.example:8080 (default: --ip and
    /// --port).
    #[arg(value_name = "IP:PORT", value_parser = parse_addr, allow_hyphen_values = true)]
    pub addr: Option<Addr>,
    /// Instance IP or host, when IP:PORT is not given [default: the local address of the route
    /// toward the registry, as `gangway run` registers it].
    #[arg(long, value_name = "IP", env = "GANGWAY_IP")]
    pub ip: Option<String>,
    /// Instance port, when IP:PORT is not given.
    #[arg(long, value_name = "PORT", env = "GANGWAY_PORT", value_parser = parse_port)]
    pub port: Option<u16>,
    /// Namespace [registry default: public].
    #[arg(long, short = 'n', env = "GANGWAY_NAMESPACE", value_parser = parse_name)]
    pub namespace: Option<String>,
    /// Group [registry default: DEFAULT_GROUP].
    #[arg(long, short = 'g', env = "GANGWAY_GROUP", value_parser = parse_name)]
    pub group: Option<String>,
    /// Cluster [registry default: DEFAULT].
    #[arg(long, short = 'c', env = "GANGWAY_CLUSTER", value_parser = parse_name)]
    pub cluster: Option<String>,
}

impl EnvInstanceArgs {
    /// [`resolve`](Self::resolve), where a missing IP (no `IP:PORT`, no `--ip`/`GANGWAY_IP`)
    /// is the local address of the route toward `registry` (`--server`), the address `gangway
    /// run` registers by default.
    ///
    /// # Errors
    /// As [`resolve`](Self::resolve); when the route cannot be found, the missing IP says why.
    pub async fn resolve_toward(&self, registry: &str) -> Result<InstanceArgs, CliError> {
        if self.addr.is_some() || self.ip.is_some() || self.port.is_none() {
            return self.resolve();
        }
        match route::local_ip_toward(registry).await {
            Ok(ip) => Self {
                ip: Some(ip.to_string()),
                ..self.clone()
            }
            .resolve(),
            Err(e) => match self.resolve() {
                Err(CliError::Usage { field, message }) => Err(CliError::Usage {
                    field,
                    message: format!(
                        "{message} (no default: no route toward the registry {registry}: {e})"
                    ),
                }),
                other => other,
            },
        }
    }

    /// The instance these arguments and the environment name.
    ///
    /// # Errors
    /// [`CliError::Usage`] (exit 2) naming what is missing or wrong, every problem at once.
    pub fn resolve(&self) -> Result<InstanceArgs, CliError> {
        let mut problems = Vec::new();
        let service = match &self.service {
            Some(s) => s.clone(),
            None => {
                problems.push("SERVICE: missing (give it, or set GANGWAY_SERVICE)".to_owned());
                String::new()
            }
        };
        let addr = match (&self.addr, &self.ip, self.port) {
            (Some(addr), _, _) => Some(addr.clone()),
            (None, Some(ip), Some(port)) => {
                match parse_addr(
                    &Addr {
                        host: ip.clone(),
                        port,
                    }
                    .to_string(),
                ) {
                    Ok(addr) => Some(addr),
                    Err(e) => {
                        problems.push(format!("--ip (GANGWAY_IP) {ip:?}: {e}"));
                        None
                    }
                }
            }
            (None, ip, port) => {
                let mut missing = Vec::new();
                if ip.is_none() {
                    missing.push("--ip (GANGWAY_IP)");
                }
                if port.is_none() {
                    missing.push("--port (GANGWAY_PORT)");
                }
                problems.push(format!(
                    "IP:PORT: missing (give it after SERVICE, or set {})",
                    missing.join(" and ")
                ));
                None
            }
        };
        match addr {
            Some(addr) if problems.is_empty() => Ok(InstanceArgs {
                service: ServiceArgs {
                    service,
                    namespace: self.namespace.clone(),
                    group: self.group.clone(),
                },
                addr,
                cluster: self.cluster.clone(),
            }),
            _ => Err(CliError::Usage {
                field: None,
                message: problems.join("; "),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        service: Option<&str>,
        addr: Option<&str>,
        ip: Option<&str>,
        port: Option<u16>,
    ) -> EnvInstanceArgs {
        EnvInstanceArgs {
            service: service.map(str::to_owned),
            addr: addr.map(|a| parse_addr(a).unwrap()),
            ip: ip.map(str::to_owned),
            port,
            namespace: None,
            group: None,
            cluster: Some("c1".into()),
        }
    }

    #[test]
    fn the_address_argument_wins_over_ip_and_port() {
        let i = args(
            Some("orders"),
            Some("10.0.0.5:80"),
            Some("10.9.9.9"),
            Some(9),
        )
        .resolve()
        .unwrap();
        assert_eq!(i.addr.to_string(), "10.0.0.5:80");
        assert_eq!(i.service.service, "orders");
        assert_eq!(i.cluster.as_deref(), Some("c1"));
        let i = args(Some("orders"), None, Some("fd00::5"), Some(8080))
            .resolve()
            .unwrap();
        assert_eq!(i.addr.to_string(), "[fd00::5]:8080");
    }

    #[tokio::test]
    async fn a_missing_ip_is_the_local_address_of_the_route_toward_the_registry() {
        let i = args(Some("orders"), None, None, Some(80))
            .resolve_toward("http://127.0.0.1:8848")
            .await
            .unwrap();
        assert_eq!(i.addr.to_string(), "127.0.0.1:80");
        // GANGWAY_IP (or --ip) wins; without a port there is nothing to default.
        let i = args(Some("orders"), None, Some("10.0.0.5"), Some(80))
            .resolve_toward("127.0.0.1:8848")
            .await
            .unwrap();
        assert_eq!(i.addr.to_string(), "10.0.0.5:80");
        assert!(
            args(Some("orders"), None, None, None)
                .resolve_toward("127.0.0.1:8848")
                .await
                .is_err()
        );
    }

    #[test]
    fn every_missing_part_is_named_at_once() {
        let CliError::Usage { message: m, .. } =
            args(None, None, None, Some(80)).resolve().unwrap_err()
        else {
            panic!("expected a usage error")
        };
        assert_eq!(
            m,
            "SERVICE: missing (give it, or set GANGWAY_SERVICE); IP:PORT: missing (give it \
             after SERVICE, or set --ip (GANGWAY_IP))"
        );
        let CliError::Usage { message: m, .. } = args(Some("o"), None, Some("$(POD_IP)"), Some(80))
            .resolve()
            .unwrap_err()
        else {
            panic!("expected a usage error")
        };
        assert!(m.starts_with("--ip (GANGWAY_IP) \"$(POD_IP)\""), "{m}");
    }

    #[test]
    fn ports_name_the_kubernetes_service_link_trap() {
        assert_eq!(parse_port("8080"), Ok(8080));
        assert!(parse_port("0").unwrap_err().contains("1-65535"));
        assert!(parse_port("http").unwrap_err().contains("got \"http\""));
        let e = parse_port("tcp://10.0.0.11:8848").unwrap_err();
        assert!(e.contains("enableServiceLinks: false"), "{e}");
    }
}
