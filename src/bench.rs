//! `delayd bench`: the raw confirmed-publish ceiling, delayd's drain rate,
//! its lateness and its idle cost, measured in one run on one machine.

use std::path::PathBuf;

use clap::Args;

use crate::cli::Failure;

/// Arguments of `delayd bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The TOML configuration file (only its [redis] and [amqp] are used).
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: PathBuf,
    /// Members in the backlog to drain.
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Body size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Members per second for the lateness phase.
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,
}

/// Runs the benchmark.
pub async fn run(_args: BenchArgs) -> Result<(), Failure> {
    Err(Failure::runtime("bench is not built yet"))
}
