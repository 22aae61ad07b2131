//! `groupcast cancel`: stop a batch. Nothing of it goes out that had not
//! been claimed for sending: every generation whose send was not claimed is
//! stopped (never sent, its group deleted at the provider); a generation
//! whose send was claimed goes out and is counted. Later chunks are
//! refused, and the batch reports `cancelled` with the counts of what was
//! sent. Running it again changes nothing and answers the same.
//!
//! A batch id never seen (nothing recorded for it, no chunk of it waiting
//! in the ingest stream, no tombstone) is most likely mistyped, and a cancel
//! would block that id for the retention: it is refused unless `--force`
//! says the batch is to come (then it is remembered as cancelled, so that
//! its chunks are refused when they come).
//!
//! Exit codes: 0 when the batch is cancelled (now or before, or never seen
//! with `--force`); 1 when it had already reported otherwise (nothing to
//! stop), was never seen (without `--force`) or Redis failed; 2 for a bad
//! batch id.

use clap::Args;

use super::close::batch_log;
use super::{CliError, RedisArgs};
use crate::store::batch::Cancelling;
use crate::worker::WorkerConfig;

/// Cancel flags.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch to cancel.
    pub batch: String,
    /// Why, recorded in the batch's `batch_cancelled` event.
    #[arg(long, default_value = "cancelled by an operator")]
    pub reason: String,
    /// How long the batch's events are kept once it reports (use the
    /// workers' `--retention`).
    #[arg(long, default_value_t = WorkerConfig::RETENTION.into(), value_parser = crate::human::flag_duration)]
    pub retention: crate::human::FlagDuration,
    /// Cancel a batch id never seen too (nothing recorded, no chunk
    /// queued): its chunks, when they come, are refused.
    #[arg(long)]
    pub force: bool,
}

/// Runs `groupcast cancel`.
pub(crate) async fn run(args: CancelArgs) -> Result<(), CliError> {
    let log = batch_log(&args.redis, &args.batch, args.retention).await?;
    let b = &args.batch;
    let known = what_is_known(&args.redis, b).await?;
    if !known.recorded && known.queued.is_none() && !args.force {
        return Err(CliError::Failed(format!(
            "batch {b}: never seen: nothing of it is recorded and no chunk of it is queued \
             (check the batch id and --prefix); to cancel it before its chunks come, pass --force"
        )));
    }
    let cancelling = log.cancel(&args.reason).await?;
    if let Cancelling::Cancelled { .. } = cancelling {
        super::close::confirm_on_disk(&args.redis, &log, "cancelled", "cancel").await?;
    }
    match cancelling {
        Cancelling::Cancelled { seen: false, .. } => {
            match known.queued {
                Some(chunks) => println!(
                    "batch {b}: cancelled before any worker read it ({chunks} chunk(s) queued): nothing of it is sent, \
                     and its chunks are refused when they are read"
                ),
                None => println!(
                    "batch {b}: cancelled, never seen: no chunk of it was recorded (check the batch id and --prefix); \
                     it is remembered as cancelled and reported so, and its chunks are refused when they come"
                ),
            }
            Ok(())
        }
        Cancelling::Cancelled {
            stopped, unsent, ..
        } => {
            let p = log.state().await?;
            let reason = p.cancelled().unwrap_or(&args.reason);
            println!(
                "batch {b}: cancelled ({reason}); {stopped} generation(s) stopped, never sent \
                 ({unsent} registered recipient(s); their groups are deleted at the provider)"
            );
            let u = p.unfinished();
            if !u.sending.is_empty() || !u.polling.is_empty() {
                println!(
                    "batch {b}: generation(s) {:?} had their send claimed before the cancel: they go out (or went out) and are counted",
                    [u.sending.as_slice(), u.polling.as_slice()].concat()
                );
            }
            println!("batch {b}: {}", super::close::what_remains(&p));
            Ok(())
        }
        Cancelling::AlreadyReported(outcome) => Err(CliError::Failed(format!(
            "batch {b}: already reported ({outcome}): nothing more of it is sent; nothing to cancel"
        ))),
        Cancelling::Forgotten => Err(CliError::Failed(format!(
            "batch {b}: already reported, and its events have expired: nothing to cancel"
        ))),
    }
}

/// What is known of a batch before it is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    /// Its state, or the tombstone of its report, is there.
    recorded: bool,
    /// How many chunks of it wait unread in its shard's ingest streams
    /// (submitted, not read by a worker yet), if any.
    queued: Option<u64>,
}

/// Looks for the batch's state, tombstone and queued chunks. Read before
/// the cancel, not atomically with it: a chunk read in between only makes
/// the answer stale (at worst a refusal: the operator runs it again).
async fn what_is_known(redis: &super::RedisArgs, b: &str) -> Result<Known, CliError> {
    use crate::projection::field;
    let store = redis.connect().await?;
    let state = store.batch(b).state().await?;
    // A chunk of it was recorded (what `cancel.lua` calls seen): known,
    // and no need to read the ingest streams' backlog, chunks and all.
    if ["seqs", field::HOLES, field::REJECTED]
        .iter()
        .any(|f| state.get(f).is_some())
    {
        return Ok(Known {
            recorded: true,
            queued: None,
        });
    }
    let recorded = !state.fields.is_empty() || store.is_tombstoned(b).await?;
    let queued = store.queued(store.keys.shard_of(b)).await?;
    Ok(Known {
        recorded,
        queued: queued.of(b).map(|w| w.chunks),
    })
}
