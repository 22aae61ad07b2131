//! `groupcast seal`: declare a batch's last seq after its chunks, for a
//! producer that learns where its batch ends only after writing its last
//! chunk (or that stopped before flagging one). The batch then takes seqs
//! 0..=last and ends when each has arrived, as if chunk `last` had been
//! flagged. Running it again with the same seq changes nothing.

use clap::Args;

use super::close::{batch_log, confirm_on_disk, what_remains};
use super::{CliError, RedisArgs};
use crate::store::batch::Sealing;
use crate::worker::WorkerConfig;

/// Seal flags.
#[derive(Debug, Args)]
pub struct SealArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch to seal.
    pub batch: String,
    /// Its last seq: the batch takes seqs 0 to this one.
    #[arg(long)]
    pub last: u32,
    /// How long the batch's events are kept once it reports (use the
    /// workers' `--retention`).
    #[arg(long, default_value_t = WorkerConfig::RETENTION.into(), value_parser = crate::human::flag_duration)]
    pub retention: crate::human::FlagDuration,
}

/// Runs `groupcast seal`.
pub(crate) async fn run(args: SealArgs) -> Result<(), CliError> {
    let log = batch_log(&args.redis, &args.batch, args.retention).await?;
    match log.seal(args.last).await? {
        Sealing::Sealed(last) => {
            confirm_on_disk(&args.redis, &log, "seal", "seal").await?;
            let p = log.state().await?;
            let b = &args.batch;
            println!("batch {b}: ends at seq {last}");
            if p.report().is_some() || p.get("closed").is_some() {
                println!("batch {b}: {}", what_remains(&p));
            } else {
                let arrived = p.int("seqs") + p.int("holes");
                println!(
                    "batch {b}: {arrived} of {} seq(s) arrived; it ends when the others do",
                    u64::from(last) + 1
                );
            }
            Ok(())
        }
        Sealing::Conflict(why) | Sealing::Ended(why) => {
            Err(CliError::Failed(format!("{why}: nothing changed")))
        }
    }
}
