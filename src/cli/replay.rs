//! `groupcast replay`: rebuilds batch states from their event streams alone;
//! `--verify` compares with the live copy instead of replacing it.

use clap::Args;

use super::{CliError, RedisArgs};
use crate::keys::validate_batch_id;
use crate::store::Store;

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
        if args.verify {
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
        } else {
            log.restore(&rebuilt).await?;
            println!(
                "{b}: state rebuilt from its events ({} fields)",
                rebuilt.fields.len()
            );
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
