//! `groupcast audit BATCH`: a batch's full event history as a timeline.

use clap::Args;
use jiff::tz::TimeZone;

use super::{human_duration, human_time, outln, print_table, CliError, RedisArgs};
use crate::events::options::{deployment_zone, SendWindow};
use crate::events::{Event, Recorded};
use crate::keys::validate_batch_id;
use crate::phone::mask;

/// Audit flags.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch.
    pub batch: String,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show recipient numbers in full (masked as 010****5678 by default).
    #[arg(long)]
    pub show_numbers: bool,
}

/// A one-line summary of an event, its times in the deployment's zone
/// (`GROUPCAST_TIMEZONE`, else UTC).
pub(crate) fn summary(e: &Event, show_numbers: bool) -> String {
    summary_in(e, show_numbers, &deployment_zone())
}

/// The zone a batch's times are shown in: that of its options (the first
/// chunk's, which every chunk shares; [`SendWindow::zone`]), else the
/// deployment's.
pub(crate) fn batch_zone(events: &[Result<Recorded, (String, String)>]) -> TimeZone {
    events
        .iter()
        .filter_map(|r| match &r.as_ref().ok()?.event {
            Event::ChunkAssigned(e) => e.opts.as_deref().and_then(SendWindow::from_canonical),
            _ => None,
        })
        .next()
        .map_or_else(deployment_zone, |w| w.zone())
}

/// ` [code n, ...]` of failures by code, or nothing.
fn by_code(by: &std::collections::BTreeMap<String, u64>) -> String {
    if by.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by.iter().map(|(c, n)| format!("{c}: {n}")).collect();
    format!(" [{}]", parts.join(", "))
}

/// [`summary`], its times in `tz` with their offset.
pub(crate) fn summary_in(e: &Event, show_numbers: bool, tz: &TimeZone) -> String {
    let num = |n: &str| if show_numbers { n.to_string() } else { mask(n) };
    let at = |ms: u64| zoned_time(ms, tz);
    match e {
        Event::ChunkAssigned(e) => chunk_assigned(e),
        Event::GenerationClosed(e) => format!(
            "generation {} closed ({}): {} chunks, {} recipients",
            e.gen, e.reason, e.chunks, e.recipients
        ),
        Event::ChunkParked(e) => format!(
            "chunk {} parked until generation {} has a group",
            e.seq, e.gen
        ),
        Event::GroupRequested(e) => format!("group requested for generation {}", e.gen),
        Event::GroupCreated(e) => format!("generation {} group {}", e.gen, e.group_id),
        Event::ChunksReleased(e) => format!(
            "{} parked chunk(s) of generation {} released",
            e.chunks, e.gen
        ),
        Event::GroupDiscarded(e) if e.group_id == e.kept => format!(
            "group {} of generation {} deleted (stopped by a cancel)",
            e.group_id, e.gen
        ),
        Event::GroupDiscarded(e) => format!(
            "losing group {} of generation {} deleted (kept {})",
            e.group_id, e.gen, e.kept
        ),
        Event::ChunkLoaded(e) => chunk_loaded(e, &num),
        Event::GenerationReady(e) => format!(
            "generation {} complete ({} chunks): send enqueued",
            e.gen, e.chunks
        ),
        Event::SendScheduled(e) => format!(
            "generation {} group {} held until {} ({})",
            e.gen,
            e.group_id,
            at(e.at_ms),
            e.reason.replace('_', " ")
        ),
        Event::SendTriggered(e) => format!(
            "generation {} group {} {}",
            e.gen,
            e.group_id,
            e.outcome.replace('_', " ")
        ),
        Event::SendRefused(e) => format!("generation {} send REFUSED: {}", e.gen, e.reason),
        Event::GenerationFailed(e) => generation_failed(e),
        Event::GroupCompleted(e) => format!(
            "generation {} group {} {}: {} delivered, {} failed",
            e.gen, e.group_id, e.status, e.sent_success, e.sent_failed
        ),
        Event::BatchReported(e) => batch_reported(e),
        Event::BatchSealed(e) => format!("SEALED: the batch ends at seq {}", e.last),
        Event::BatchClosed(e) => batch_closed(e),
        Event::SendClaimed(e) => match e.n {
            Some(n) => format!("generation {} send claimed (claim {n})", e.gen),
            None => format!("generation {} send claimed", e.gen),
        },
        Event::ClaimGivenBack(e) => claim_given_back(e, tz),
        Event::BatchCancelled(e) => batch_cancelled(e),
        Event::ReportDelivered(e) => report_delivered(e),
        Event::InputRejected(e) => input_rejected(e),
        Event::GenerationDelivered(e) => generation_delivered(e),
        Event::BatchDelivered(e) => batch_delivered(e),
        Event::BatchOrigin(e) => format!("follows up batch {}", e.describe()),
        Event::DeadLetterHandled(e) => dead_letter_handled(e),
        Event::BatchStalled(e) => format!(
            "STALLED: no event for {} (since {})",
            human_duration(e.quiet_for_ms),
            at(e.quiet_since_ms)
        ),
    }
}

/// The summary of `chunk_assigned`: the chunk, its generation, and the batch options it
/// set.
fn chunk_assigned(e: &crate::events::ChunkAssigned) -> String {
    format!(
        "chunk {} ({} recipients{}) → generation {}",
        e.seq,
        e.count,
        if e.last { ", last" } else { "" },
        e.gen
    ) + &e
        .opts
        .as_deref()
        .map(|o| format!("; batch options: {}", SendWindow::describe_canonical(o)))
        .unwrap_or_default()
}

/// The summary of `chunk_loaded`: what was registered, and the first failures (`num`
/// shows or masks a number).
fn chunk_loaded(e: &crate::events::ChunkLoaded, num: &dyn Fn(&str) -> String) -> String {
    let mut s = format!(
        "chunk {} loaded into {}: {} registered ({} already there), {} failed",
        e.seq,
        e.group_id,
        e.registered,
        e.duplicates,
        e.failed.len()
    );
    for f in e.failed.iter().take(3) {
        s.push_str(&format!(" [{} {}]", num(&f.to), f.code));
    }
    if e.failed.len() > 3 {
        s.push_str(" …");
    }
    s
}

/// The summary of `generation_failed`: what was given up, and what that means for the
/// generation's recipients.
fn generation_failed(e: &crate::events::GenerationFailed) -> String {
    format!(
        "generation {} FAILED: its {} was given up ({}); {}",
        e.gen,
        e.op,
        e.reason,
        match (e.op.as_str(), e.recall) {
            ("create", _) => "its chunks end as failed",
            ("send", false) => "nothing went out: never sent",
            ("send", true) => "its send was claimed: the provider is asked whether it went out",
            _ => "its outcome is unknown",
        }
    )
}

/// The summary of `batch_reported`: the report's counts.
fn batch_reported(e: &crate::events::BatchReported) -> String {
    format!(
    "REPORT {}: {} generations, {} recipients, {} registered, {} failed, {} delivered, {} duplicate(s), {} chunk(s) rejected, {} seq(s) missing{}{}",
    e.outcome,
    e.generations,
    e.recipients,
    e.registered,
    e.failed,
    e.sent_success,
    e.duplicates,
    e.rejected,
    e.missing,
    match (e.outcome.as_str(), e.unsent) {
        ("cancelled", _) => format!(
            ", {} generation(s) stopped ({} registered, never sent)",
            e.stopped, e.unsent
        ),
        (_, 0) => String::new(),
        (_, n) => format!(", {n} registered never sent (sends given up)"),
    },
    match e.unknown {
        0 => String::new(),
        n => format!(", {n} registered with an unknown outcome"),
    }
)
}

/// The summary of `batch_closed`: the reason and the seqs given up.
fn batch_closed(e: &crate::events::BatchClosed) -> String {
    let m = e.missing_seqs();
    format!(
        "CLOSED ({}): {} missing seq(s){}",
        e.reason,
        m.count,
        if m.is_empty() {
            String::new()
        } else {
            format!(" {}", m.text())
        }
    )
}

/// The summary of `claim_given_back`: until when the send is held, and whether the
/// generation was stopped (times in `tz`).
fn claim_given_back(e: &crate::events::ClaimGivenBack, tz: &TimeZone) -> String {
    format!(
        "generation {} send claim {} given back: held until {} ({}){}",
        e.gen,
        e.n,
        zoned_time(e.at_ms, tz),
        e.reason.replace('_', " "),
        if e.stopped {
            ", the batch was cancelled: generation stopped"
        } else {
            ""
        }
    )
}

/// The summary of `batch_cancelled`: the generations stopped and those being sent.
fn batch_cancelled(e: &crate::events::BatchCancelled) -> String {
    format!(
    "CANCELLED ({}): {} generation(s) stopped {:?} ({} registered recipient(s) never sent), {} being sent {:?}",
    e.reason,
    e.stopped.len(),
    e.stopped,
    e.unsent,
    e.sending.len(),
    e.sending
)
}

/// The summary of `report_delivered`: which report reached the webhook,
/// and its answer.
fn report_delivered(e: &crate::events::ReportDelivered) -> String {
    format!(
        "{} delivered to the webhook ({})",
        if e.report.is_some() {
            "delivery report"
        } else {
            "report"
        },
        e.status
    )
}

/// The summary of `input_rejected`: the reason, and what it says of the batch's end.
fn input_rejected(e: &crate::events::InputRejected) -> String {
    let reason = options_read_as_written(&e.reason);
    let mut s = match e.seq {
        Some(seq) => format!("chunk {seq} rejected: {reason}"),
        None => format!("input rejected: {reason}"),
    };
    match (&e.last_conflict, e.last) {
        (Some(why), _) => s.push_str(&format!("; {why}")),
        (None, Some(last)) => s.push_str(&format!("; the batch ends at seq {last}")),
        _ => {}
    }
    s
}

/// The summary of `generation_delivered`: a generation's delivery results.
fn generation_delivered(e: &crate::events::GenerationDelivered) -> String {
    format!(
        "generation {} delivery results{}: {} delivered, {} failed{}, {} unknown",
        e.gen,
        if e.window_ended {
            " (the delivery window ended)"
        } else {
            ""
        },
        e.delivered,
        e.failed,
        by_code(&e.failed_by_code),
        e.unknown
    )
}

/// The summary of `batch_delivered`: the delivery report's counts.
fn batch_delivered(e: &crate::events::BatchDelivered) -> String {
    format!(
    "delivery report: of {} recipients, {} delivered, {} failed ({} at registration, {} at delivery){}, {} unknown, {} duplicates, {} not sent{}",
    e.recipients,
    e.delivered,
    e.failed,
    e.failed_at_registration,
    e.failed_at_delivery,
    by_code(&e.failed_by_code),
    e.unknown,
    e.duplicates,
    e.not_sent,
    e.origin
        .as_deref()
        .map(|o| format!("; follows up {o}"))
        .unwrap_or_default()
)
}

/// The summary of `dead_letter_handled`: an operator's act on a dead letter.
fn dead_letter_handled(e: &crate::events::DeadLetterHandled) -> String {
    format!(
        "dead letter {} ({}) {} by {}; it had been dead-lettered: {}",
        e.entry,
        e.what,
        if e.action == "purge" {
            "PURGED"
        } else {
            "redriven"
        },
        e.by,
        e.reason
    )
}

/// A conflict's reason with both batch options as people write them:
/// `accept.lua`, which has no time-zone database, names them in canonical
/// form (`seq 1 has the batch options 1796359239000|bulk|, but the batch has
/// |normal|`). Any other reason is returned as it is.
fn options_read_as_written(reason: &str) -> String {
    const HAS: &str = " has the batch options ";
    const BUT: &str = ", but the batch has ";
    let Some((head, rest)) = reason.split_once(HAS) else {
        return reason.to_string();
    };
    let Some((theirs, ours)) = rest.split_once(BUT) else {
        return reason.to_string();
    };
    format!(
        "{head}{HAS}({}){BUT}({})",
        SendWindow::describe_canonical(theirs),
        SendWindow::describe_canonical(ours)
    )
}

/// An event as a person reads it on the board: [`json_of`], with `time`
/// and the times in `summary` in `tz` (the batch's zone, [`batch_zone`])
/// with their offset.
pub(crate) fn json_in(r: &Recorded, show_numbers: bool, tz: &TimeZone) -> serde_json::Value {
    let mut v = json_of(r, show_numbers);
    v["time"] = zoned_time(r.millis(), tz).into();
    v["summary"] = summary_in(&r.event, show_numbers, tz).into();
    v
}

/// An event as `audit --json` prints it.
pub(crate) fn json_of(r: &Recorded, show_numbers: bool) -> serde_json::Value {
    serde_json::json!({
        "id": r.id,
        "time": human_time(r.millis()),
        "type": r.event.type_name(),
        "key": r.key,
        "summary": summary(&r.event, show_numbers),
    })
}

/// Runs audit.
pub(crate) async fn run(args: AuditArgs) -> Result<(), CliError> {
    validate_batch_id(&args.batch)
        .map_err(|e| CliError::Usage(format!("{:?}: {e}", args.batch)))?;
    let store = args.redis.connect().await?;
    let events = store.batch(&args.batch).events().await?;
    let queued = store.queued(store.keys.shard_of(&args.batch)).await?;
    let waiting = queued.of(&args.batch);
    if events.is_empty() {
        let Some(w) = waiting else {
            return Err(CliError::Failed(format!(
                "no events for batch {} (unknown, or past its retention), and no chunk of it waits in the ingest stream",
                args.batch
            )));
        };
        if args.json {
            outln!("{}", super::status::queued_json(&args.batch, w, &queued));
        } else {
            outln!("{}; no events yet", queued.describe(w));
        }
        return Ok(());
    }
    if let Some(w) = waiting {
        // On stderr, so that `--json` output stays one event per line.
        eprintln!(
            "{} more chunk(s) of batch {} wait unread in the ingest stream",
            w.chunks, args.batch
        );
    }
    let tz = batch_zone(&events);
    let t0 = events
        .iter()
        .find_map(|r| r.as_ref().ok().map(Recorded::millis))
        .unwrap_or(0);
    let mut rows = Vec::new();
    for r in &events {
        match r {
            Ok(r) => {
                if args.json {
                    outln!("{}", json_of(r, args.show_numbers));
                } else {
                    rows.push(vec![
                        zoned_time(r.millis(), &tz),
                        format!("+{}", human_duration(r.millis().saturating_sub(t0))),
                        r.event.type_name().to_string(),
                        summary_in(&r.event, args.show_numbers, &tz),
                    ]);
                }
            }
            Err((id, why)) => {
                if args.json {
                    outln!("{}", serde_json::json!({"id": id, "error": why}));
                } else {
                    rows.push(vec![
                        id.clone(),
                        String::new(),
                        "UNREADABLE".into(),
                        why.clone(),
                    ]);
                }
            }
        }
    }
    if !args.json {
        print_table(&["time", "since start", "event", "what"], &rows);
    }
    Ok(())
}

/// `ms` in `tz` with its offset (`2026-12-01 18:00:05 +09:00`).
fn zoned_time(ms: u64, tz: &TimeZone) -> String {
    crate::human::time_in(i64::try_from(ms).unwrap_or(i64::MAX), tz)
        .unwrap_or_else(|| human_time(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::ChunkAssigned;

    /// A chunk refused for other batch options names both as people write
    /// them, not as `accept.lua` stored them.
    #[test]
    fn a_conflicts_batch_options_read_as_written() {
        let e = Event::InputRejected(crate::events::InputRejected {
            seq: Some(1),
            reason: "seq 1 has the batch options 1796115600000|bulk|21:00:00-08:00:00@Asia/Seoul, \
                     but the batch has |normal|"
                .into(),
            ..Default::default()
        });
        assert_eq!(
            summary(&e, false),
            "chunk 1 rejected: seq 1 has the batch options (priority bulk, send at \
             2026-12-01 18:00 +09:00, quiet hours 21:00-08:00 Asia/Seoul), but the batch has \
             (priority normal, send once ready, no quiet hours)"
        );
    }

    /// The batch options a chunk carried, as a person reads them (the issue
    /// saw `batch options 1796359239000|normal|`).
    #[test]
    fn a_chunks_batch_options_read_as_written() {
        let e = Event::ChunkAssigned(ChunkAssigned {
            seq: 1,
            gen: 0,
            count: 5,
            last: true,
            digest: "d".into(),
            duplicates: Vec::new(),
            opts: Some("1796115600000|bulk|21:00:00-08:00:00@Asia/Seoul".into()),
        });
        assert_eq!(
            summary(&e, false),
            "chunk 1 (5 recipients, last) → generation 0; batch options: priority bulk, \
             send at 2026-12-01 18:00 +09:00, quiet hours 21:00-08:00 Asia/Seoul"
        );
    }
}
