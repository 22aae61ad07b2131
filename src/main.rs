//! The `groupcast` command.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = groupcast::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("groupcast: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(groupcast::cli::run(cli))
}
