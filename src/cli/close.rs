//! `groupcast close`: stop waiting for a batch's seqs that never arrived.
//!
//! Every generation with loaded recipients is sent, the others are closed,
//! and the batch reports (`partial`, with the missing seqs counted). Later
//! chunks of it are dead-lettered. Running it again changes nothing.

use clap::Args;

use super::{CliError, RedisArgs};
use crate::keys::validate_batch_id;
use crate::store::batch::{BatchLog, BatchPolicy, Closing};
use crate::worker::WorkerConfig;

/// Close flags.
#[derive(Debug, Args)]
pub struct CloseArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch to close.
    pub batch: String,
    /// Why, recorded in the batch's `batch_closed` event.
    #[arg(long, default_value = "closed by an operator")]
    pub reason: String,
    /// How long the batch's events are kept once it reports (use the
    /// workers' `--retention`).
    #[arg(long, default_value_t = WorkerConfig::RETENTION.into(), value_parser = crate::human::flag_duration)]
    pub retention: crate::human::FlagDuration,
}

/// The log of `batch` (its id checked) for a command that can end it: its
/// report is queued for delivery whether or not the workers have a webhook
/// (a worker without one acknowledges it), and kept for `retention`.
pub(super) async fn batch_log(
    redis: &RedisArgs,
    batch: &str,
    retention: crate::human::FlagDuration,
) -> Result<BatchLog, CliError> {
    validate_batch_id(batch).map_err(|e| CliError::Usage(format!("invalid batch id: {e}")))?;
    let store = redis
        .connect()
        .await?
        .with_policy(BatchPolicy::for_operator(retention.into()));
    // Its work (the sends a close makes ready, the deletes a cancel
    // queues) goes to its lane.
    Ok(store.batch_in_its_lane(batch).await?)
}

/// Answers once the event an operator's command recorded under event key
/// `key` is on disk ([`Store::command_on_disk`]): an error when Redis lost
/// it meanwhile, so that the operator gives the command again.
///
/// [`Store::command_on_disk`]: crate::store::Store::command_on_disk
pub(super) async fn confirm_on_disk(
    redis: &RedisArgs,
    log: &BatchLog,
    key: &str,
    command: &str,
) -> Result<(), CliError> {
    use crate::store::durability::witness::CommandOnDisk;
    match redis.connect().await?.command_on_disk(log, key).await? {
        CommandOnDisk::NoWait | CommandOnDisk::OnDisk => Ok(()),
        CommandOnDisk::Lost => Err(CliError::Failed(format!(
            "batch {}: Redis restarted and lost the {command} before it reached its disk: run `groupcast {command}` again",
            log.batch
        ))),
    }
}

/// Runs `groupcast close`.
pub(crate) async fn run(args: CloseArgs) -> Result<(), CliError> {
    let log = batch_log(&args.redis, &args.batch, args.retention).await?;
    match log.close(&args.reason).await? {
        Closing::Closed { missing } => {
            confirm_on_disk(&args.redis, &log, "closed", "close").await?;
            let b = &args.batch;
            println!(
                "batch {b}: closed ({}); {missing} missing seq(s) given up on",
                args.reason
            );
            let p = log.state().await?;
            println!("batch {b}: {}", what_remains(&p));
            Ok(())
        }
        Closing::AlreadyReported(outcome) => {
            println!(
                "batch {}: already reported ({outcome}); nothing to close",
                args.batch
            );
            Ok(())
        }
        Closing::Unknown => Err(CliError::Failed(format!(
            "batch {}: no chunk of it was ever recorded (or its events expired); check the batch id and --prefix",
            args.batch
        ))),
    }
}

/// What a batch that takes no more chunks still waits for before its
/// report, truthfully: a generation whose provider operation fails for good
/// is given up and counted (unsent, unknown or failed), so each of these
/// ends either way.
pub(crate) fn what_remains(p: &crate::projection::Projection) -> String {
    if let Some(outcome) = p.report() {
        return format!("reported ({outcome})");
    }
    let reports = match p.cancelled() {
        Some(_) => "it reports `cancelled`",
        None => "it reports",
    };
    let u = p.unfinished();
    if u.is_empty() {
        return format!("every generation is done: {reports} now");
    }
    format!(
        "{reports} once these generations are done: {} (a provider operation that fails for good is given up and counted, so each ends either way)",
        u.describe()
    )
}
