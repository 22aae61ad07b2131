//! The `groupcast` command line: the product's commands
//! ([`groupcast::cli::Command`]) and the rigs' (`demo`, `mock-provider`,
//! `bench`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use groupcast::cli::LogFormat;

use crate::{bench, demo, mock_provider};

/// Bulk notifications through a provider's group API, event-sourced on Redis Streams.
#[derive(Debug, Parser)]
#[command(name = "groupcast", version)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human, env = "GROUPCAST_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands: the product's, then the rigs'.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A command of the product.
    #[command(flatten)]
    Product(groupcast::cli::Command),
    /// Run everything on this machine: workers, a mock provider, a batch.
    Demo(demo::DemoArgs),
    /// Serve the mock provider (the provider contract plus test hooks).
    MockProvider(mock_provider::MockProviderArgs),
    /// Run a whole campaign on this machine and print its costs as JSON.
    Bench(bench::BenchArgs),
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> ExitCode {
    let log_format = cli.log_format;
    // The demo and the bench print their own progress and results: they log
    // only when GROUPCAST_LOG asks (`quiet`).
    let result = match cli.command {
        Command::Product(command) => {
            return groupcast::cli::run(groupcast::cli::Cli {
                log_format,
                command,
            })
            .await
        }
        Command::Demo(a) => {
            groupcast::cli::start_logging(log_format, true);
            demo::run(a).await
        }
        Command::MockProvider(a) => {
            groupcast::cli::start_logging(log_format, false);
            mock_provider::run(a).await
        }
        Command::Bench(a) => {
            groupcast::cli::start_logging(log_format, true);
            bench::run(a).await
        }
    };
    groupcast::cli::exit_code(result)
}

/// A command line parsed (`command` and then `flags`, after the program's
/// name): the commands' unit tests build their arguments with it.
#[cfg(test)]
pub(crate) fn parse(command: &[&str], flags: &[&str]) -> Command {
    let argv = ["groupcast"].iter().chain(command).chain(flags);
    Cli::try_parse_from(argv).expect("parse").command
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_offers_the_products_commands_and_the_rigs() {
        let names: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        for name in [
            "worker",
            "submit",
            "serve",
            "demo",
            "mock-provider",
            "bench",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        Cli::command().debug_assert();
    }
}
