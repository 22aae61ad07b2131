//! `groupcast dlq list|show|redrive`: inspect dead letters and put them back.

use clap::{Args, Subcommand};

use super::{human_time, outln, print_table, CliError, RedisArgs};
use crate::events::entry_millis;
use crate::store::queue::Entry;
use crate::store::Store;

/// Dead-letter flags.
#[derive(Debug, Args)]
pub struct DlqArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// What to do.
    #[command(subcommand)]
    pub action: DlqAction,
}

/// Dead-letter actions.
#[derive(Debug, Subcommand)]
pub enum DlqAction {
    /// List dead letters (every shard).
    List {
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter with every field.
    Show {
        /// The dead letter's id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back on the stream they came from (after fixing the
    /// cause), and remove them from the dead letters. A work item starts a
    /// fresh retry budget (--retry-for counts again from its next failure).
    Redrive {
        /// Dead letter ids.
        ids: Vec<String>,
        /// Every dead letter.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

async fn all(store: &Store) -> Result<Vec<(u32, Entry)>, CliError> {
    Ok(store.dead_letter_entries().await?)
}

/// A dead letter as JSON (payloads shown by size).
pub fn describe(e: &Entry) -> serde_json::Value {
    let original: serde_json::Map<String, serde_json::Value> = e
        .fields
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k, v)))
        .map(|(k, v)| {
            let shown = if k == "d" || k == "c" {
                format!("<{} bytes>", v.len())
            } else {
                String::from_utf8_lossy(v).into_owned()
            };
            (k.to_string(), serde_json::Value::String(shown))
        })
        .collect();
    serde_json::json!({
        "id": e.id,
        "time": human_time(entry_millis(&e.id)),
        "source": e.text("source"),
        "entry": e.text("entry"),
        // Letters written before reasons were redacted may hold a token.
        "reason": e.text("reason").map(|r| crate::redact::text(&r)),
        "deliveries": e.text("deliveries"),
        "consumer": e.text("consumer"),
        "original": original,
    })
}

/// Runs a dead-letter action.
pub async fn run(args: DlqArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    match args.action {
        DlqAction::List { json } => {
            let letters = all(&store).await?;
            if json {
                for (_, e) in &letters {
                    outln!("{}", describe(e));
                }
            } else {
                let rows: Vec<Vec<String>> = letters
                    .iter()
                    .map(|(_, e)| {
                        vec![
                            e.id.clone(),
                            human_time(entry_millis(&e.id)),
                            e.text("source").unwrap_or_default(),
                            e.text("f:op").unwrap_or_else(|| "chunk".into()),
                            e.text("reason").unwrap_or_default(),
                        ]
                    })
                    .collect();
                print_table(&["id", "time", "from", "kind", "reason"], &rows);
                outln!("{} dead letter(s)", rows.len());
            }
        }
        DlqAction::Show { id, json } => {
            let letters = all(&store).await?;
            let (_, e) = letters
                .iter()
                .find(|(_, e)| e.id == id)
                .ok_or_else(|| CliError::Failed(format!("no dead letter {id}")))?;
            let d = describe(e);
            if json {
                outln!("{d}");
            } else {
                outln!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
            }
        }
        DlqAction::Redrive { ids, all: every } => {
            if ids.is_empty() && !every {
                return Err(CliError::Usage("give dead letter ids, or --all".into()));
            }
            let letters = all(&store).await?;
            let mut n = 0;
            for (shard, e) in letters.iter().filter(|(_, e)| every || ids.contains(&e.id)) {
                let Some(source) = store
                    .redrive_letter(*shard, e)
                    .await
                    .map_err(|err| CliError::Redis(format!("redriving {}: {err}", e.id)))?
                else {
                    continue;
                };
                outln!("redrove {} to {source}", e.id);
                n += 1;
            }
            outln!("{n} dead letter(s) redriven");
        }
    }
    Ok(())
}
