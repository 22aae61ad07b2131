//! `groupcast status [BATCH]`: a batch's state, or an overview of the streams.

use clap::Args;
use redis::AsyncCommands;

use super::{human_duration, human_time, print_table, CliError, RedisArgs};
use crate::keys::{validate_batch_id, LOADERS_GROUP, OPERATORS_GROUP};
use crate::projection::Projection;

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
            println!("{}", batch_json(batch, &p));
            return Ok(());
        }
        let outcome = p.get("report").unwrap_or("in flight");
        let last = p
            .last_seq()
            .map(|l| (l + 1).to_string())
            .unwrap_or_else(|| "?".into());
        println!(
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
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(hb);
            println!(
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
    let keys = &store.keys;
    let mut conn = store.conn.clone();
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for shard in 0..keys.shards() {
        for (stream, group) in [
            (keys.ingest(shard), Some(LOADERS_GROUP)),
            (keys.work(shard), Some(OPERATORS_GROUP)),
            (keys.dead_letters(shard), None),
            (keys.reports(shard), None),
        ] {
            let len: u64 = conn.xlen(&stream).await.unwrap_or(0);
            let (mut pending, mut lag) = (String::from("-"), String::from("-"));
            if let Some(g) = group {
                if let Ok(v) = redis::cmd("XINFO")
                    .arg("GROUPS")
                    .arg(&stream)
                    .query_async::<redis::Value>(&mut conn)
                    .await
                {
                    let info = group_info(&v, g);
                    pending = info.0.unwrap_or_else(|| "-".into());
                    lag = info.1.unwrap_or_else(|| "-".into());
                }
            }
            json.push(serde_json::json!({"stream": stream, "length": len, "group": group, "pending": pending, "lag": lag}));
            rows.push(vec![
                stream,
                len.to_string(),
                group.unwrap_or("-").to_string(),
                pending,
                lag,
            ]);
        }
        let delayed: u64 = conn.zcard(keys.delayed(shard)).await.unwrap_or(0);
        let active: u64 = conn.scard(keys.active(shard)).await.unwrap_or(0);
        json.push(serde_json::json!({"shard": shard, "delayedRetries": delayed, "batchesInFlight": active}));
        rows.push(vec![
            keys.delayed(shard),
            delayed.to_string(),
            "(delayed retries)".into(),
            "-".into(),
            "-".into(),
        ]);
        rows.push(vec![
            keys.active(shard),
            active.to_string(),
            "(batches in flight)".into(),
            "-".into(),
            "-".into(),
        ]);
    }
    if args.json {
        println!("{}", serde_json::Value::Array(json));
    } else {
        print_table(
            &["key", "length", "consumer group", "pending", "lag"],
            &rows,
        );
    }
    Ok(())
}

fn group_info(v: &redis::Value, group: &str) -> (Option<String>, Option<String>) {
    let redis::Value::Array(groups) = v else {
        return (None, None);
    };
    for g in groups {
        let redis::Value::Array(kv) = g else { continue };
        let get = |name: &str| {
            kv.chunks(2)
                .find(|p| {
                    redis::from_redis_value::<String>(p[0].clone())
                        .ok()
                        .as_deref()
                        == Some(name)
                })
                .and_then(|p| p.get(1))
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
        };
        if get("name").as_deref() == Some(group) {
            return (get("pending"), get("lag"));
        }
    }
    (None, None)
}
