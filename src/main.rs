//! The `groupcast` command.

use std::process::ExitCode;

use clap::Parser;

// glibc's malloc showed as the top cost of a worker in `perf` (many threads
// allocating and freeing message buffers); mimalloc is made for that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = groupcast::cli::Cli::parse();
    // Threads named after the command, so that `top -H` and `perf` tell a
    // worker from a mock provider on the same machine.
    let name = match &cli.command {
        groupcast::cli::Command::Worker(_) => "gc-worker",
        groupcast::cli::Command::MockProvider(_) => "gc-mock",
        groupcast::cli::Command::Bench(_) => "gc-bench",
        _ => "groupcast",
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name(name)
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
