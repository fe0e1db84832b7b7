//! The parts of the `gangway` command that other crates use: its argument parsers
//! ([`args`]), so that the fuzz harness (`crates/fuzz`) drives the very functions clap calls.

pub mod args;
