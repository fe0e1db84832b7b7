//! `gangway lab`: measure what an instance leaving costs, with real processes.
pub mod classic;
pub mod cli;
pub mod liveness;
pub mod load;
pub mod process;
pub mod report;
pub mod scenario;
pub mod suite;
