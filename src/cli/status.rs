//! `groupcast status [BATCH]`: a batch's state, or an overview of the streams.

use clap::Args;

use super::{human_duration, human_time, outln, print_table, CliError, RedisArgs};
use crate::keys::{validate_batch_id, LOADERS_GROUP, OPERATORS_GROUP};
use crate::projection::Projection;
use crate::store::Store;

/// Status flags.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// A batch (omit for the streams overview).
    pub batch: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The state of a batch as JSON.
pub fn batch_json(batch: &str, p: &Projection) -> serde_json::Value {
    let gens: Vec<_> = (0..p.generations())
        .map(|g| {
            serde_json::json!({
                "generation": g,
                "group": p.gen_field(g, "group"),
                "recipients": p.gen_int(g, "n"),
                "chunks": p.gen_int(g, "c"),
                "loaded": p.gen_int(g, "l"),
                "registered": p.gen_int(g, "reg"),
                "failed": p.gen_int(g, "fail"),
                "closed": p.gen_field(g, "closed"),
                "sent": p.gen_field(g, "sent"),
                "refused": p.gen_field(g, "refused"),
                "done": p.gen_field(g, "done"),
            })
        })
        .collect();
    serde_json::json!({
        "batch": batch,
        "chunks": p.int("seqs"),
        "lastSeq": p.last_seq(),
        "recipients": p.int("recipients"),
        "registered": p.int("registered"),
        "failed": p.int("failed"),
        "rejected": p.int("rejected"),
        "stalls": p.int("stalls"),
        "report": p.get("report"),
        "lastEventMs": p.int("hb"),
        "generations": gens,
    })
}

/// Runs status.
pub async fn run(args: StatusArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    if let Some(batch) = &args.batch {
        validate_batch_id(batch).map_err(|e| CliError::Usage(format!("{batch:?}: {e}")))?;
        let p = store.batch(batch).state().await?;
        if p.fields.is_empty() {
            return Err(CliError::Failed(format!(
                "no state for batch {batch} (unknown, or past its retention)"
            )));
        }
        if args.json {
            outln!("{}", batch_json(batch, &p));
            return Ok(());
        }
        let outcome = p.get("report").unwrap_or("in flight");
        let last = p
            .last_seq()
            .map(|l| (l + 1).to_string())
            .unwrap_or_else(|| "?".into());
        outln!(
            "batch {batch}: {outcome}; {} of {last} chunks, {} recipients, {} registered, {} failed, {} rejected input(s), {} stall(s)",
            p.int("seqs"),
            p.int("recipients"),
            p.int("registered"),
            p.int("failed"),
            p.int("rejected"),
            p.int("stalls"),
        );
        let hb = p.int("hb") as u64;
        if hb > 0 {
            let now = now_ms().max(hb);
            outln!(
                "last event {} ({} ago)",
                human_time(hb),
                human_duration(now.saturating_sub(hb))
            );
        }
        let rows: Vec<Vec<String>> = (0..p.generations())
            .map(|g| {
                let f = |k: &str| p.gen_field(g, k).unwrap_or("-").to_string();
                vec![
                    g.to_string(),
                    f("group"),
                    p.gen_int(g, "n").to_string(),
                    format!("{}/{}", p.gen_int(g, "l"), p.gen_int(g, "c")),
                    p.gen_int(g, "reg").to_string(),
                    p.gen_int(g, "fail").to_string(),
                    f("closed"),
                    p.gen_field(g, "refused")
                        .map(|r| format!("REFUSED: {r}"))
                        .unwrap_or_else(|| f("sent")),
                    f("done"),
                ]
            })
            .collect();
        print_table(
            &[
                "gen",
                "group",
                "recipients",
                "loaded",
                "registered",
                "failed",
                "closed",
                "send",
                "provider",
            ],
            &rows,
        );
        return Ok(());
    }
    overview(&store, args.json).await
}

/// The streams overview: every stream with its consumer group's pending
/// count and lag, the delayed retries, and the batches in flight with how
/// long each has been quiet.
async fn overview(store: &Store, json: bool) -> Result<(), CliError> {
    let keys = &store.keys;
    let now = now_ms();
    let mut rows = Vec::new();
    let mut streams = Vec::new();
    let mut batch_rows = Vec::new();
    let mut batches = Vec::new();
    for shard in 0..keys.shards() {
        for (stream, what, group) in [
            (keys.ingest(shard), "ingest", Some(LOADERS_GROUP)),
            (keys.work(shard), "work", Some(OPERATORS_GROUP)),
            (keys.dead_letters(shard), "dead letters", None),
            (keys.reports(shard), "reports", None),
        ] {
            let len = store.stream_len(&stream).await?;
            let (mut pending, mut lag) = (None, None);
            if let Some(g) = group {
                // No group yet (no worker ever started): nothing pending.
                if let Ok(Some(info)) = store.group_info(&stream, g).await {
                    pending = info.pending;
                    lag = info.lag;
                }
            }
            let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            rows.push(vec![
                stream.clone(),
                what.to_string(),
                len.to_string(),
                group.unwrap_or("-").to_string(),
                show(pending),
                show(lag),
            ]);
            streams.push(serde_json::json!({
                "key": stream, "shard": shard, "what": what, "length": len,
                "group": group, "pending": pending, "lag": lag,
            }));
        }
        let delayed = store.delayed_len(shard).await?;
        rows.push(vec![
            keys.delayed(shard),
            "delayed retries".into(),
            delayed.to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
        ]);
        streams.push(serde_json::json!({
            "key": keys.delayed(shard), "shard": shard, "what": "delayed retries",
            "length": delayed, "group": null, "pending": null, "lag": null,
        }));
        let mut active = store.active_batches(shard).await?;
        active.sort();
        for b in active {
            let p = store.batch(&b).state().await?;
            let hb = p.int("hb") as u64;
            let quiet = (hb > 0).then(|| now.saturating_sub(hb));
            let last = p
                .last_seq()
                .map(|l| (l + 1).to_string())
                .unwrap_or_else(|| "?".into());
            batch_rows.push(vec![
                b.clone(),
                shard.to_string(),
                format!("{}/{last}", p.int("seqs")),
                p.int("recipients").to_string(),
                p.int("registered").to_string(),
                format!("{}/{}", sent_count(&p), p.generations()),
                quiet.map_or("-".into(), human_duration),
                p.int("stalls").to_string(),
            ]);
            batches.push(serde_json::json!({
                "batch": b, "shard": shard, "chunks": p.int("seqs"), "lastSeq": p.last_seq(),
                "recipients": p.int("recipients"), "registered": p.int("registered"),
                "groupsSent": sent_count(&p), "generations": p.generations(), "quietMs": quiet, "stalls": p.int("stalls"),
            }));
        }
    }
    if json {
        outln!(
            "{}",
            serde_json::json!({"streams": streams, "batchesInFlight": batches})
        );
        return Ok(());
    }
    print_table(
        &["key", "what", "entries", "consumer group", "pending", "lag"],
        &rows,
    );
    outln!();
    if batch_rows.is_empty() {
        outln!("no batches in flight");
    } else {
        outln!("{} batch(es) in flight:", batch_rows.len());
        print_table(
            &[
                "batch",
                "shard",
                "chunks",
                "recipients",
                "registered",
                "groups sent",
                "quiet for",
                "stalls",
            ],
            &batch_rows,
        );
    }
    Ok(())
}

/// Generations of a batch whose group was sent.
fn sent_count(p: &Projection) -> u32 {
    (0..p.generations())
        .filter(|g| p.gen_field(*g, "sent").is_some())
        .count() as u32
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
