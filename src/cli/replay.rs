//! `groupcast replay`: rebuilds batch states from their event streams alone;
//! `--verify` compares with the live copy instead of replacing it.
//!
//! Rebuilding is safe while workers run: each batch's state is replaced in
//! one server-side step that first checks no event was appended since the
//! rebuild read the last one (and folds the new ones in and tries again
//! otherwise), so no idempotency key or count written by a live append is
//! lost. The output says "rebuilt atomically".

use clap::Args;

use super::{CliError, RedisArgs};
use crate::keys::validate_batch_id;
use crate::store::batch::Rebuilt;
use crate::store::Store;

/// How many times a rebuild folds in events appended while it read before
/// it gives up on a batch that never goes quiet.
const REBUILD_TRIES: u32 = 50;

/// Replay flags.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// One batch.
    #[arg(long, conflicts_with = "all")]
    pub batch: Option<String>,
    /// Every batch with events.
    #[arg(long)]
    pub all: bool,
    /// Compare the rebuilt state with the live one; print every difference
    /// and exit 1 on any. Nothing is written.
    #[arg(long)]
    pub verify: bool,
}

/// Every batch id that has an event stream (on a cluster, every master is
/// scanned: a SCAN cursor belongs to one node).
pub async fn all_batches(store: &Store) -> Result<Vec<String>, CliError> {
    let pattern = format!("{}:{{s*}}:b:*:events", store.keys.prefix());
    let keys = store
        .scan_match(&pattern)
        .await
        .map_err(|e| CliError::Redis(format!("SCAN: {e}")))?;
    let mut out: Vec<String> = keys
        .iter()
        .filter_map(|k| {
            k.split(":b:")
                .nth(1)
                .and_then(|r| r.strip_suffix(":events"))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// Runs replay.
pub async fn run(args: ReplayArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    let batches = match (&args.batch, args.all) {
        (Some(b), _) => {
            validate_batch_id(b).map_err(|e| CliError::Usage(format!("--batch {b:?}: {e}")))?;
            vec![b.clone()]
        }
        (None, true) => all_batches(&store).await?,
        (None, false) => return Err(CliError::Usage("give --batch ID or --all".into())),
    };
    let mut differing = 0;
    for b in &batches {
        let log = store.batch(b);
        if !args.verify {
            // Safe while workers run: the state is replaced only if no event
            // was appended since the fold read the last one (checked in the
            // same script), so a live append is never overwritten.
            match log.rebuild(REBUILD_TRIES).await? {
                Rebuilt::Replaced { fields, retries: 0 } => {
                    println!("{b}: state rebuilt atomically from its events ({fields} fields)")
                }
                Rebuilt::Replaced { fields, retries } => println!(
                    "{b}: state rebuilt atomically from its events ({fields} fields; \
                     events were appended while it read, folded in: {retries} more tries)"
                ),
                Rebuilt::Undecodable(bad) => {
                    differing += 1;
                    for (id, why) in bad {
                        println!("{b}: entry {id} cannot be decoded: {why}");
                    }
                    println!("{b}: not rebuilt");
                }
                Rebuilt::Busy { tries } => {
                    differing += 1;
                    println!(
                        "{b}: not rebuilt: events were appended during each of {tries} tries; \
                         try again when the batch is quieter"
                    );
                }
            }
            continue;
        }
        let rebuilt = match log.replay().await? {
            Ok(p) => p,
            Err(bad) => {
                differing += 1;
                for (id, why) in bad {
                    println!("{b}: entry {id} cannot be decoded: {why}");
                }
                continue;
            }
        };
        let live = log.state().await?;
        let diff = live.diff(&rebuilt);
        if diff.is_empty() {
            println!(
                "{b}: live state matches its replay ({} fields)",
                live.fields.len()
            );
        } else {
            differing += 1;
            println!("{b}: {} difference(s) (live vs replay):", diff.len());
            for d in diff {
                println!("  {d}");
            }
        }
    }
    if differing > 0 {
        return Err(CliError::Failed(format!(
            "{differing} of {} batch(es) differ",
            batches.len()
        )));
    }
    Ok(())
}
