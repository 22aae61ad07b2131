//! `groupcast status [BATCH]`: a batch's state, or an overview of the streams.

use clap::Args;

use super::{human_duration, outln, print_table, CliError, RedisArgs};
use crate::events::options::{Priority, SendWindow};
use crate::keys::validate_batch_id;
use crate::projection::{field, Projection};
use crate::store::overview::{Queued, QueuedBatch};
use crate::store::Store;

/// Status flags.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// A batch (omit for the streams overview).
    pub batch: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Wait until the batch has reported, then print its status (a batch
    /// whose chunks are still queued or in flight is waited for; Ctrl-C
    /// stops waiting).
    #[arg(long, requires = "batch")]
    pub wait: bool,
}

/// How often `status --wait` reads the batch's state again: a person is
/// waiting, and one read of the projection is one round trip.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Reads `batch`'s state until it holds a report, saying once on stderr what
/// it waits for.
async fn wait_for_report(store: &Store, batch: &str) -> Result<(), CliError> {
    let mut said = false;
    loop {
        let p = store.batch(batch).state().await?;
        if p.get("report").is_some() {
            return Ok(());
        }
        // A mistyped id would be waited for forever: a batch must have a
        // state or chunks queued (the same rule as without --wait).
        if p.fields.is_empty() {
            let queued = store.queued(store.keys.shard_of(batch)).await?;
            if queued.of(batch).is_none() {
                return Err(CliError::Failed(format!(
                    "no state for batch {batch} (unknown, or past its retention), and no chunk of it waits in the ingest stream: nothing to wait for"
                )));
            }
        }
        if !said {
            eprintln!(
                "waiting for batch {batch}'s report (Ctrl-C stops waiting; the batch goes on)"
            );
            said = true;
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// A batch's generations as JSON (`done`: the provider's final status).
pub(crate) fn generations_json(p: &Projection) -> Vec<serde_json::Value> {
    (0..p.generations())
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
                "claimed": p.gen_field(g, "claimed").is_some(),
                "sent": p.gen_field(g, "sent"),
                "refused": p.gen_field(g, "refused"),
                "done": p.gen_field(g, "done"),
                "scheduledAtMs": p.gen_field(g, "at").and_then(|v| v.parse::<u64>().ok()),
            })
        })
        .collect()
}

/// The state of a batch as JSON.
pub(crate) fn batch_json(batch: &str, p: &Projection) -> serde_json::Value {
    let gens = generations_json(p);
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
        "cancelled": p.cancelled(),
        "stoppedGenerations": p.int(crate::projection::field::STOPPED),
        "unsentRecipients": p.int(crate::projection::field::UNSENT),
        "unknownRecipients": p.int(crate::projection::field::UNKNOWN),
        "providerRefusedCredentials": p.get(field::CREDS_REFUSED),
        "chunksAfterEnd": p.int(field::AFTER_END),
        "lastEventMs": p.int("hb"),
        "options": options_json(p),
        "generations": gens,
    })
}

/// The batch's options (priority, `send_at`, quiet hours) as JSON.
pub(crate) fn options_json(p: &Projection) -> serde_json::Value {
    let w = p
        .get(field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .unwrap_or_default();
    serde_json::json!({
        "priority": w.priority.name(),
        "sendAt": w.send_at_text(),
        "quietHours": w.quiet_text(),
        "advertising": w.ad.as_ref().map(|a| serde_json::json!({
            "nightConsent": a.night_consent,
            "heldAtNight": !a.night_consent,
            "pair": a.pair,
        })),
    })
}

/// Runs status.
pub(crate) async fn run(args: StatusArgs) -> Result<(), CliError> {
    let store = args.redis.connect().await?;
    match &args.batch {
        Some(batch) => batch_status(&store, batch, args.wait, args.json).await,
        None => overview(&store, args.json).await,
    }
}

/// `status BATCH`: the batch's state (after its report, with `wait`), or
/// what of it waits in the ingest stream when it has no state yet.
async fn batch_status(store: &Store, batch: &str, wait: bool, json: bool) -> Result<(), CliError> {
    validate_batch_id(batch).map_err(|e| CliError::Usage(format!("{batch:?}: {e}")))?;
    if wait {
        wait_for_report(store, batch).await?;
    }
    let p = store.batch(batch).state().await?;
    let queued = store.queued(store.keys.shard_of(batch)).await?;
    let waiting = queued.of(batch);
    if p.fields.is_empty() {
        let Some(w) = waiting else {
            return Err(CliError::Failed(format!(
                "no state for batch {batch} (unknown, or past its retention), and no chunk of it waits in the ingest stream"
            )));
        };
        if json {
            outln!("{}", queued_json(batch, w, &queued));
        } else {
            outln!("{}", queued.describe(w));
        }
        return Ok(());
    }
    if json {
        let mut v = batch_json(batch, &p);
        v["queuedChunks"] = waiting.map_or(0, |w| w.chunks).into();
        outln!("{v}");
        return Ok(());
    }
    outln!("{}", headline(batch, &p));
    let window = p
        .get(field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .unwrap_or_default();
    if window.holds() || window.priority != Priority::Normal || window.ad.is_some() {
        outln!("{}", window.describe());
    }
    for line in state_notes(batch, &p) {
        outln!("{line}");
    }
    if let Some(line) = delivery_line(batch, &p) {
        // Before tracking's first page (or with `--delivery-window 0`,
        // never) there is nothing read to show.
        let read =
            p.get(field::DL_GENS).is_some() || store.batch(batch).has_delivery_results().await?;
        if read {
            outln!("{line}");
        } else {
            outln!("delivery: no results read yet (workers read them after the send unless started with --delivery-window 0)");
        }
    }
    for line in queue_notes(&p, waiting, &queued) {
        outln!("{line}");
    }
    let hb = p.int("hb") as u64;
    if hb > 0 {
        // The clock that stamped the heartbeat: the batch's server's.
        let now = store.batch(batch).server_time_ms().await?.max(hb);
        outln!(
            "last event {} ({} ago)",
            window.time_text(i64::try_from(hb).unwrap_or(i64::MAX)),
            human_duration(now.saturating_sub(hb))
        );
    }
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
        &generation_rows(&p, &window),
    );
    Ok(())
}

/// The batch's first line: its outcome (or where it stands) and its counts.
fn headline(batch: &str, p: &Projection) -> String {
    let outcome = match (p.get("report"), p.cancelled()) {
        (Some(o), _) => o,
        (None, Some(_)) => "cancelled, finishing the sends claimed before the cancel",
        (None, None) if p.get(field::CREDS_REFUSED).is_some() => {
            "in flight, but the provider refused credentials"
        }
        (None, None) => "in flight",
    };
    let last = p
        .last_seq()
        .map(|l| (l + 1).to_string())
        .unwrap_or_else(|| "?".into());
    format!(
        "batch {batch}: {outcome}; {} of {last} chunks, {} recipients, {} registered, {} failed, {} rejected input(s), {} stall(s)",
        p.int("seqs"),
        p.int("recipients"),
        p.int("registered"),
        p.int("failed"),
        p.int("rejected"),
        p.int("stalls"),
    )
}

/// What the state says needs saying: a cancel, and credentials the
/// provider refused (with what to do about them).
fn state_notes(batch: &str, p: &Projection) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(why) = p.cancelled() {
        notes.push(format!(
            "cancelled ({why}): {} generation(s) stopped, never sent ({} registered recipient(s)); later chunks are refused",
            p.int(crate::projection::field::STOPPED),
            p.int(crate::projection::field::UNSENT),
        ));
    }
    if let Some(why) = p.get(field::CREDS_REFUSED) {
        let then = if p.get("report").is_some() {
            "submit the batch again".to_string()
        } else {
            format!("`groupcast dlq redrive --batch {batch}`")
        };
        notes.push(format!(
            "provider refused credentials: {why}. Fix GROUPCAST_PROVIDER_API_KEY / \
             GROUPCAST_PROVIDER_API_SECRET, restart the workers, then {then}"
        ));
    }
    notes
}

/// Chunks outside the batch's counts: those that came after it ended, and
/// those still waiting in the ingest stream (`waiting`, of `queued`).
fn queue_notes(p: &Projection, waiting: Option<&QueuedBatch>, queued: &Queued) -> Vec<String> {
    let mut notes = Vec::new();
    let after_end = p.int(field::AFTER_END);
    if after_end > 0 {
        notes.push(format!(
            "{after_end} chunk(s) came after the batch ended: counted, not loaded, not dead-lettered"
        ));
    }
    if let Some(w) = waiting {
        notes.push(format!(
            "{} more chunk(s) wait unread in the ingest stream{}",
            w.chunks,
            if queued.read_by_a_worker() {
                ""
            } else {
                " (no worker reads it)"
            }
        ));
    }
    notes
}

/// One row per generation: its group, counts, and where its send stands
/// (holds shown in `window`'s zone).
fn generation_rows(p: &Projection, window: &SendWindow) -> Vec<Vec<String>> {
    (0..p.generations())
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
                    .or_else(|| p.gen_field(g, "sent").map(str::to_string))
                    .or_else(|| {
                        let at = p.gen_field(g, "at")?.parse::<u64>().ok()?;
                        // In the zone the batch's quiet hours are in:
                        // the hold is most often theirs.
                        Some(format!(
                            "held until {}",
                            window.time_text(i64::try_from(at).ok()?)
                        ))
                    })
                    .unwrap_or_else(|| "-".into()),
                f("done"),
            ]
        })
        .collect()
}

/// A queued batch (chunks waiting, no state yet) as JSON.
pub(crate) fn queued_json(batch: &str, w: &QueuedBatch, q: &Queued) -> serde_json::Value {
    serde_json::json!({
        "batch": batch,
        "state": "queued",
        "queuedChunks": w.chunks,
        "queuedRecipients": w.recipients,
        "lastSeq": w.last_seq,
        "queuedSinceMs": w.since_ms,
        "shard": w.shard,
        "ingestGroupExists": q.group_exists,
        "ingestConsumers": q.consumers,
    })
}

/// The streams overview: every stream with its consumer group's pending
/// count and lag, the delayed retries, the batches queued in the ingest
/// streams, and the batches in flight with how long each has been quiet.
async fn overview(store: &Store, json: bool) -> Result<(), CliError> {
    let health = store.stream_health().await?;
    let queued = store.queued_all().await?;
    let in_flight = in_flight(store).await?;
    if json {
        let queued_json: Vec<_> = queued
            .iter()
            .flat_map(|q| q.batches.iter().map(|w| queued_json(&w.batch, w, q)))
            .collect();
        let batches: Vec<_> = in_flight.iter().map(InFlight::json).collect();
        outln!(
            "{}",
            serde_json::json!({"streams": health, "batchesQueued": queued_json, "batchesInFlight": batches})
        );
        return Ok(());
    }
    let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let rows: Vec<Vec<String>> = health
        .iter()
        .map(|h| {
            vec![
                h.key.clone(),
                h.what.to_string(),
                h.length.to_string(),
                h.group.unwrap_or("-").to_string(),
                show(h.consumers),
                show(h.pending),
                show(h.lag),
            ]
        })
        .collect();
    print_table(
        &[
            "key",
            "what",
            "entries",
            "consumer group",
            "consumers",
            "pending",
            "lag",
        ],
        &rows,
    );
    for q in &queued {
        if !q.batches.is_empty() {
            outln!();
            for w in &q.batches {
                outln!("{}", q.describe(w));
            }
        }
    }
    outln!();
    if in_flight.is_empty() {
        outln!("no batches in flight");
    } else {
        outln!("{} batch(es) in flight:", in_flight.len());
        let batch_rows: Vec<Vec<String>> = in_flight.iter().map(InFlight::row).collect();
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

/// A batch in flight, as the overview shows it.
struct InFlight {
    batch: String,
    shard: u32,
    p: Projection,
    /// How long it has been quiet (ms), once it has a heartbeat.
    quiet: Option<u64>,
}

impl InFlight {
    /// Its row in the overview's table.
    fn row(&self) -> Vec<String> {
        let p = &self.p;
        let last = p
            .last_seq()
            .map(|l| (l + 1).to_string())
            .unwrap_or_else(|| "?".into());
        vec![
            self.batch.clone(),
            self.shard.to_string(),
            format!("{}/{last}", p.int("seqs")),
            p.int("recipients").to_string(),
            p.int("registered").to_string(),
            format!("{}/{}", sent_count(p), p.generations()),
            self.quiet.map_or("-".into(), human_duration),
            p.int("stalls").to_string(),
        ]
    }

    /// It as JSON.
    fn json(&self) -> serde_json::Value {
        let p = &self.p;
        serde_json::json!({
            "batch": self.batch, "shard": self.shard, "chunks": p.int("seqs"), "lastSeq": p.last_seq(),
            "recipients": p.int("recipients"), "registered": p.int("registered"),
            "groupsSent": sent_count(p), "generations": p.generations(), "quietMs": self.quiet, "stalls": p.int("stalls"),
        })
    }
}

/// The batches in flight on every shard, by shard then id.
async fn in_flight(store: &Store) -> Result<Vec<InFlight>, CliError> {
    let mut batches = Vec::new();
    for shard in 0..store.keys.shards() {
        // How long a batch is quiet, on the clock that stamped its
        // heartbeat: its shard's server's.
        let now = store.shard_time_ms(shard).await?;
        let mut active = store.active_batches(shard).await?;
        active.sort();
        for b in active {
            let p = store.batch(&b).state().await?;
            let hb = p.int("hb") as u64;
            let quiet = (hb > 0).then(|| now.saturating_sub(hb));
            batches.push(InFlight {
                batch: b,
                shard,
                p,
                quiet,
            });
        }
    }
    Ok(batches)
}

/// Generations of a batch whose group was sent.
fn sent_count(p: &Projection) -> u32 {
    (0..p.generations())
        .filter(|g| p.gen_field(*g, "sent").is_some())
        .count() as u32
}

/// Delivery tracking's progress, once a generation was sent: how many
/// sent generations have all their results, and the counts so far by
/// outcome and by code. None before any send.
fn delivery_line(batch: &str, p: &crate::projection::Projection) -> Option<String> {
    let sent: Vec<u32> = (0..p.generations())
        .filter(|&g| matches!(p.gen_field(g, "done"), Some("COMPLETE" | "FAILED")))
        .collect();
    if sent.is_empty() {
        return None;
    }
    let done = sent
        .iter()
        .filter(|&&g| p.get(&field::delivered_in(g)).is_some())
        .count();
    let mut codes: Vec<String> = p
        .fields
        .iter()
        .filter_map(|(k, v)| Some(format!("{} {v}", k.strip_prefix("dlc:")?)))
        .collect();
    codes.sort();
    let state = if p.get(field::DL_REPORT).is_some() {
        "delivery report decided".to_string()
    } else {
        format!(
            "{done} of {} sent generation(s) have all their results",
            sent.len()
        )
    };
    Some(format!(
        "delivery: {state}; {} delivered, {} failed at delivery{}, {} unknown (`groupcast results {}` lists them)",
        p.int(field::DL_DELIVERED),
        p.int(field::DL_FAILED),
        if codes.is_empty() {
            String::new()
        } else {
            format!(" ({})", codes.join(", "))
        },
        p.int(field::DL_UNKNOWN),
        batch,
    ))
}
