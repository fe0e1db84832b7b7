//! `gangway-fuzz`: runs the fuzz targets and prints, per target, inputs run, inputs/s,
//! rejections and failures (each failing input saved to a file). Exit status 1 on any failure.
//!
//! ```text
//! cargo run --release -p gangway-fuzz -- --inputs 1000000 --target all
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gangway_fuzz::{Options, Target};

/// Fuzzes gangway's parsers of outside input (docs/fuzz.md).
#[derive(Parser)]
#[command(name = "gangway-fuzz")]
struct Args {
    /// Inputs per target.
    #[arg(long, default_value_t = 100_000)]
    inputs: u64,
    /// Targets to run (comma-separated), or `all`.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    target: Vec<TargetArg>,
    /// Stop each target after this many seconds even if its inputs were not all run.
    #[arg(long)]
    seconds: Option<f64>,
    /// Seed of the random source: the same seed runs the same inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where failing inputs are saved.
    #[arg(long, default_value = "target/fuzz-failures")]
    out: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TargetArg {
    All,
    Rest,
    NacosHttp,
    NacosGrpc,
    Native,
    Cli,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut targets = Vec::new();
    for t in &args.target {
        let chosen: &[Target] = match t {
            TargetArg::All => &Target::ALL,
            TargetArg::Rest => &[Target::Rest],
            TargetArg::NacosHttp => &[Target::NacosHttp],
            TargetArg::NacosGrpc => &[Target::NacosGrpc],
            TargetArg::Native => &[Target::Native],
            TargetArg::Cli => &[Target::Cli],
        };
        for c in chosen {
            if !targets.contains(c) {
                targets.push(*c);
            }
        }
    }
    let options = Options {
        inputs: args.inputs,
        time_limit: args.seconds.map(Duration::from_secs_f64),
        seed: args.seed,
        out_dir: args.out,
        ..Options::default()
    };
    gangway_fuzz::install_panic_hook();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut failed = false;
    println!(
        "{:<11} {:>10} {:>10} {:>10} {:>8} {:>9} {:>8}",
        "target", "inputs", "inputs/s", "rejected", "timeouts", "failures", "seconds"
    );
    for target in targets {
        let report = match runtime.block_on(gangway_fuzz::run(target, &options)) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{}: could not run: {e:#}", target.name());
                failed = true;
                continue;
            }
        };
        println!(
            "{:<11} {:>10} {:>10.0} {:>10} {:>8} {:>9} {:>8.1}",
            target.name(),
            report.inputs,
            report.rate(),
            report.rejections,
            report.timeouts,
            report.failures.len(),
            report.elapsed.as_secs_f64()
        );
        for f in &report.failures {
            failed = true;
            let saved = f
                .saved
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(not saved)".into());
            println!(
                "  input {}: {}\n    saved to {saved}",
                f.index,
                first_line(&f.reason, 400)
            );
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn first_line(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("");
    line.chars().take(max).collect()
}
