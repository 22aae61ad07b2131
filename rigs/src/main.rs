//! The `groupcast` command: the product's commands and the rigs'.

use std::process::ExitCode;

use clap::Parser;
use groupcast_rigs::cli::{Cli, Command};

// glibc's malloc showed as the top cost of a worker in `perf` (many threads
// allocating and freeing message buffers); mimalloc is made for that.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Threads named after the command, so that `top -H` and `perf` tell a
    // worker from a mock provider on the same machine.
    let name = match &cli.command {
        Command::Product(groupcast::cli::Command::Worker(_)) => "gc-worker",
        Command::MockProvider(_) => "gc-mock",
        Command::Bench(_) => "gc-bench",
        _ => "groupcast",
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Product(groupcast::cli::Command::Worker(w)) = &cli.command {
        // A worker takes as many threads as it is told (`--threads`, 1 by
        // default), not one per core: on a machine shared with other workers
        // and Redis, a thread per core measured slower and costlier than one
        // (docs/benchmarks.md, "One thread a worker").
        builder.worker_threads(usize::from(w.worker.threads));
    }
    let runtime = match builder.thread_name(name).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("groupcast: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(groupcast_rigs::cli::run(cli))
}
