//! The `delayd` binary: parse arguments, run a command, map errors to exit codes.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = delayd::cli::Cli::parse();
    delayd::cli::main(cli)
}
