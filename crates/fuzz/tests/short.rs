//! A short run of every target, so the harness never rots between long runs (docs/fuzz.md):
//! a few hundred inputs each, in the debug build.

use gangway_fuzz::{Options, Target};

#[tokio::test(flavor = "current_thread")]
async fn every_target_runs_clean_for_a_few_hundred_inputs() {
    gangway_fuzz::install_panic_hook();
    let options = Options {
        inputs: 400,
        seed: 7,
        out_dir: std::env::temp_dir().join("gangway-fuzz-test"),
        ..Options::default()
    };
    for target in Target::ALL {
        let report = gangway_fuzz::run(target, &options)
            .await
            .expect("the target runs");
        assert_eq!(report.inputs, 400, "{}", target.name());
        assert!(
            report.failures.is_empty(),
            "{}: {:#?}",
            target.name(),
            report.failures
        );
        // The mutations reach past the first byte: some inputs are accepted, some refused.
        assert!(report.rejections > 0, "{}: nothing refused", target.name());
        assert!(
            report.rejections < report.inputs,
            "{}: nothing accepted",
            target.name()
        );
    }
}

#[test]
fn a_seed_runs_the_same_inputs() {
    let a = gangway_fuzz::targets::cli::run(&Options {
        inputs: 300,
        ..Options::default()
    });
    let b = gangway_fuzz::targets::cli::run(&Options {
        inputs: 300,
        ..Options::default()
    });
    assert_eq!(a.rejections, b.rejections);
}
