//! `groupcast bench --lanes`: the priority lanes race of issue 12, measured.
//!
//! A private `redis-server`, the mock provider limited to `--rate-limit`
//! requests/s, workers limited to the same, a `bulk` batch of
//! `--recipients` (default 100,000, in chunks of `--chunk-size`, default
//! 250) appended at once, and `--urgent-after-ms` later an `urgent` batch of
//! 20. Prints one JSON line: how long the urgent batch took from its append
//! to its report (both by Redis' clock: entry ids), how far the bulk batch
//! had got by then, and how long the bulk batch took.

use std::time::{Duration, Instant};

use super::workload::{bench_template, recipients};
use super::{failed_checks, start_mock, start_workers, BenchArgs, Procs, WorkerFlags};
use crate::redis_server::{free_port, RedisServer};
use groupcast::cli::CliError;
use groupcast::events::entry_millis;
use groupcast::events::Chunk;
use groupcast::keys::Keyspace;
use groupcast::keys::Priority;
use groupcast::producer::{cut, Producer};
use groupcast::provider::{ProviderClient, ProviderConfig};
use groupcast::store::queue::read_after;
use groupcast::store::Store;

/// Recipients of the urgent batch.
const URGENT_RECIPIENTS: usize = 20;

/// Appends a batch's chunks to its ingest stream of `lane`; returns when the
/// first one was appended (ms, Redis' clock).
async fn append(store: &Store, lane: Priority, chunks: &[Chunk]) -> Result<u64, CliError> {
    let Some(first) = chunks.first() else {
        return Ok(0);
    };
    let shard = store.keys.shard_of(&first.batch);
    let ids = Producer::new(store.clone())
        .max_unread(0)
        .append_encoded(shard, lane, chunks.iter().map(Chunk::encode).collect())
        .await?;
    Ok(ids.first().map(|id| entry_millis(id)).unwrap_or(0))
}

/// Runs the race and prints its JSON line.
pub(super) async fn run(args: &BenchArgs) -> Result<(), CliError> {
    let bulk_n = args.recipients.unwrap_or(100_000);
    let size = args.chunk_size.unwrap_or(250);
    let exe = std::env::current_exe()
        .map_err(|e| CliError::Failed(format!("cannot find my own binary: {e}")))?;
    let server = RedisServer::start().map_err(|e| CliError::Usage(e.to_string()))?;
    let store = Store::connect(&server.url(), Keyspace::new("bench", 1)).await?;
    let mut procs = Procs(Vec::new());
    let port = free_port().map_err(|e| CliError::Failed(e.to_string()))?;
    let base_url = format!("http://127.0.0.1:{port}");
    let rate = args.rate_limit.to_string();
    start_mock(&exe, port, 1_000_000, &["--rate-limit", &rate], &mut procs).await?;
    let flags = WorkerFlags {
        workers: args.workers,
        concurrency: args.concurrency,
        group_cap: 1_000_000,
        rate: (args.rate_limit, 1),
        procs: &mut procs,
    };
    start_workers(&exe, &store, &server.url(), &base_url, flags).await?;

    let template = bench_template();
    let (bulk, urgent) = ("lanes-bulk", "lanes-urgent");
    let bulk_chunks = cut(bulk, &template, recipients(0, bulk_n, 0, bulk_n), size);
    let urgent_chunks = cut(
        urgent,
        &template,
        recipients(1, bulk_n, 0, URGENT_RECIPIENTS),
        size,
    );
    let bulk_at = append(&store, Priority::Bulk, &bulk_chunks).await?;
    tokio::time::sleep(Duration::from_millis(args.urgent_after_ms)).await;
    let urgent_at = append(&store, Priority::Urgent, &urgent_chunks).await?;

    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let reported = both_reports(&store, (bulk, urgent), deadline, args.timeout_secs).await?;
    let provider = ProviderClient::new(ProviderConfig {
        base_url,
        api_key: super::API_KEY.into(),
        api_secret: super::API_SECRET.into(),
        ..ProviderConfig::default()
    })
    .map_err(|e| CliError::Failed(e.to_string()))?;
    let batches = [bulk.to_string(), urgent.to_string()];
    let failed = failed_checks(&store, &provider, &batches, 1_000_000).await?;
    let line = result_line(
        args,
        bulk_chunks.len(),
        (bulk_at, urgent_at),
        &reported,
        failed.is_empty(),
    );
    println!("{line}");
    drop(procs);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "verification failed: {:?}",
            failed
                .iter()
                .map(|f| format!("{}: {}", f.batch, f.detail))
                .collect::<Vec<_>>()
        )))
    }
}

/// When each batch reported (ms, Redis' clock), and how far the bulk batch
/// had got when the urgent one did.
struct Reported {
    urgent_done: Option<u64>,
    bulk_done: Option<u64>,
    /// The bulk batch's registered count, and whether it had reported,
    /// when the urgent batch reported.
    bulk_registered_then: Option<(i64, bool)>,
}

/// Waits for both batches' reports (`bulk`, `urgent`), until `deadline`.
async fn both_reports(
    store: &Store,
    (bulk, urgent): (&str, &str),
    deadline: Instant,
    timeout_secs: u64,
) -> Result<Reported, CliError> {
    // Both reports, by the reports stream (entry ids: Redis' clock).
    let mut reader = store.blocking().await?;
    let reports = store.keys.reports(0);
    let mut after = "0-0".to_string();
    let (mut urgent_done, mut bulk_done) = (None, None);
    let mut bulk_registered_then = None;
    while urgent_done.is_none() || bulk_done.is_none() {
        if Instant::now() > deadline {
            return Err(CliError::Failed(format!(
                "the batches did not report in {timeout_secs}s"
            )));
        }
        for e in read_after(&mut reader, &reports, &after, 10, 250).await? {
            if e.is_delivery_report() {
                after = e.id;
                continue;
            }
            let at = entry_millis(&e.id);
            match e.get("batch") {
                Some(b) if b == urgent.as_bytes() => {
                    urgent_done = Some(at);
                    let p = store.batch(bulk).state().await?;
                    bulk_registered_then = Some((p.int("registered"), p.get("report").is_some()));
                }
                Some(b) if b == bulk.as_bytes() => bulk_done = Some(at),
                _ => {}
            }
            after = e.id;
        }
    }
    Ok(Reported {
        urgent_done,
        bulk_done,
        bulk_registered_then,
    })
}

/// The bench's JSON line: the batches appended at `(bulk_at, urgent_at)`,
/// what `reported` says, and whether both verified.
fn result_line(
    args: &BenchArgs,
    bulk_chunks: usize,
    (bulk_at, urgent_at): (u64, u64),
    reported: &Reported,
    verified: bool,
) -> serde_json::Value {
    let secs = |from: u64, to: Option<u64>| to.map(|t| t.saturating_sub(from) as f64 / 1000.0);
    let (registered, bulk_reported) = reported.bulk_registered_then.unwrap_or((0, false));
    serde_json::json!({
        "bench": "lanes",
        "rate_limit": args.rate_limit,
        "bulk_recipients": args.recipients.unwrap_or(100_000),
        "bulk_chunks": bulk_chunks,
        "urgent_recipients": URGENT_RECIPIENTS,
        "urgent_submitted_after_s": secs(bulk_at, Some(urgent_at)),
        "urgent_submit_to_report_s": secs(urgent_at, reported.urgent_done),
        "bulk_registered_at_urgent_report": registered,
        "bulk_reported_before_urgent": bulk_reported,
        "bulk_append_to_report_s": secs(bulk_at, reported.bulk_done),
        "verified": verified,
    })
}
