//! The sizes of `delayd bench --fair`, as its flags: read by the passes
//! and by the report that prints them.

use clap::Args;

/// The sizes of `--fair`; the defaults are the load the fairness bar is set for.
#[derive(Debug, Clone, Args)]
pub struct FairSizes {
    /// `--fair`: members of the heavy tenant's burst, all due at once.
    #[arg(long = "fair-heavy", default_value_t = 200_000)]
    pub heavy: usize,
    /// `--fair`: light tenants writing during the burst.
    #[arg(long = "fair-light-tenants", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub light_tenants: u32,
    /// `--fair`: light members per second, in all, each due as written.
    #[arg(long = "fair-light-rate", default_value_t = 200)]
    pub light_rate: u32,
    /// `--fair`: seconds each pass measures (the light tenants write for
    /// as long; what is left of a burst then is cancelled).
    #[arg(long = "fair-secs", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub secs: u64,
    /// `--fair`: the business `max_rate` of the second pair of passes.
    #[arg(long = "fair-max-rate", default_value_t = 2000)]
    pub max_rate: u32,
    /// `--fair`: the `tenant_window` of the last burst pass (tenants, no
    /// `max_rate`).
    #[arg(long = "fair-window", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub window: u32,
    /// `--fair`: members of each saturated tenant in the weights pass.
    #[arg(long = "fair-saturated", default_value_t = 60_000)]
    pub saturated: usize,
}
