//! The CLI's argument parsers, the functions clap calls (`gangway_cli::args`): `--meta K=V`,
//! `IP:PORT`, `--server`, names, weights, ports, durations. Pure functions: the invariants are
//! no panic and, where a value is accepted, that it means what was typed (round trips).

use gangway_cli::args;

use crate::{Case, Gen, Options, Outcome, Report, Runner, Target, panics};

/// Valid inputs the mutations start from.
const SEEDS: &[&str] = &[
    "10.0.0.1:8080",
    "[::1]:80",
    "host.example:443",
    "http://127.0.0.1:8848/",
    "zone=a",
    "version=1.2=3",
    "orders",
    "1.5",
    "8080",
    "500ms",
    "3s",
    "2m",
];

/// Runs the CLI target.
pub fn run(options: &Options) -> Report {
    let mut g = Gen::new(options.seed);
    let mut runner = Runner::new(Target::Cli, options);
    while runner.more() {
        let input = match g.below(3) {
            0 => String::from_utf8_lossy(&g.bytes(64)).into_owned(),
            1 => g.string(),
            _ => {
                let mut b = g.pick(SEEDS).as_bytes().to_vec();
                g.mutate_bytes(&mut b);
                String::from_utf8_lossy(&b).into_owned()
            }
        };
        let before = panics();
        let outcome = match std::panic::catch_unwind(|| check(&input)) {
            Ok(Ok(true)) => Outcome::Accepted,
            Ok(Ok(false)) => Outcome::Rejected,
            Ok(Err(reason)) => Outcome::Broken(reason),
            Err(_) => Outcome::Broken("panic".into()),
        };
        let case = Case {
            description: format!("input: {input:?}"),
            raw: input.into_bytes(),
        };
        runner.record(&case, outcome, before);
    }
    runner.finish()
}

/// Feeds `s` to every parser. `Ok(true)`: some parser accepted it; `Err`: an accepted value
/// does not mean what was typed.
fn check(s: &str) -> Result<bool, String> {
    let mut accepted = false;
    if let Ok(addr) = args::parse_addr(s) {
        accepted = true;
        let shown = addr.to_string();
        if args::parse_addr(&shown).as_ref() != Ok(&addr) {
            return Err(format!(
                "parse_addr({s:?}) = {addr:?} does not re-parse from {shown:?}"
            ));
        }
    }
    if let Ok((k, v)) = args::parse_meta(s) {
        accepted = true;
        if format!("{k}={v}") != s || k.trim().is_empty() {
            return Err(format!("parse_meta({s:?}) = ({k:?}, {v:?})"));
        }
    }
    if let Ok(server) = args::parse_server(s) {
        accepted = true;
        if server != s {
            return Err(format!("parse_server({s:?}) = {server:?}"));
        }
    }
    if let Ok(name) = args::parse_name(s) {
        accepted = true;
        if name != s {
            return Err(format!("parse_name({s:?}) = {name:?}"));
        }
    }
    if let Ok(w) = args::parse_weight(s) {
        accepted = true;
        if !w.is_finite() || w < 0.0 {
            return Err(format!("parse_weight({s:?}) = {w}"));
        }
    }
    if let Ok(p) = args::parse_port(s) {
        accepted = true;
        if p == 0 {
            return Err(format!("parse_port({s:?}) = 0"));
        }
    }
    accepted |= args::parse_count(s).is_ok();
    if let Ok(d) = args::parse_duration(s) {
        accepted = true;
        let shown = args::format_duration(d);
        if args::parse_duration(&shown).is_err() {
            return Err(format!(
                "parse_duration({s:?}) = {d:?}, shown {shown:?}, does not re-parse"
            ));
        }
    }
    accepted |= args::parse_period(s).is_ok();
    Ok(accepted)
}
