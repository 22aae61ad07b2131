//! `report`: POST a decided report to the webhook, with an `Idempotency-Key`
//! header, until it is accepted.

use serde_json::json;

use crate::events::options::SendWindow;
use crate::events::{Event, ReportDelivered};
use crate::keys::Priority;
use crate::projection::{event_key, field, Projection};
use crate::seq_ranges::MISSING_RANGES_MAX;
use crate::worker::ops::{OpError, Outcome, RetryCause, WorkItem};
use crate::worker::Ctx;

/// The report of a batch, as JSON, from its state.
pub fn report_json(batch: &str, p: &Projection) -> serde_json::Value {
    let groups: Vec<_> = (0..p.generations())
        .map(|g| {
            json!({
                "generation": g,
                "groupId": p.gen_field(g, "group"),
                "recipients": p.gen_int(g, "n"),
                "registered": p.gen_int(g, "reg"),
                "failed": p.gen_int(g, "fail"),
                "status": p.gen_field(g, "done"),
                "scheduledAt": p.gen_field(g, "at").and_then(|ms| rfc3339(ms.parse().ok()?)),
            })
        })
        .collect();
    let failed_by_reason: serde_json::Map<String, serde_json::Value> = p
        .fields
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix("fr:")?.to_string(),
                json!(v.parse::<u64>().ok()?),
            ))
        })
        .collect();
    let window = p
        .get(field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .unwrap_or_default();
    // Recipients in generations that were sent (all registered ones, unless
    // a cancel stopped some generations).
    let sent: Vec<u32> = (0..p.generations())
        .filter(|&g| p.gen_field(g, "sent").is_some())
        .collect();
    let sent_recipients: i64 = sent.iter().map(|&g| p.gen_int(g, "reg")).sum();
    // Recipients whose send the night-time advertising rule held.
    let held_for_night: i64 = (0..p.generations())
        .filter(|&g| {
            p.gen_field(g, "at")
                .and_then(|ms| ms.parse().ok())
                .is_some_and(|at| window.held_by_night_rule(at))
        })
        .map(|g| p.gen_int(g, "reg"))
        .sum();
    // As ranges, the first MISSING_RANGES_MAX: a batch holding seq
    // 4,000,000,000 reports in a few hundred bytes.
    let missing = p.missing_seqs(MISSING_RANGES_MAX);
    json!({
        "batchId": batch,
        "priority": window.priority.name(),
        "sendAt": window.send_at_text(),
        "quietHours": window.quiet_text(),
        "heldForNight": held_for_night,
        "outcome": p.get("report"),
        "chunks": p.int("seqs"),
        "recipients": p.int("recipients"),
        "registered": p.int("registered"),
        "failed": p.int("failed"),
        "failedByReason": failed_by_reason,
        "duplicates": p.int(field::DUPLICATES),
        "rejected": p.int(field::REJECTED),
        "lastConflict": p.get(field::LAST_CONFLICT),
        "missing": p.int(field::MISSING),
        "missingSeqCount": missing.count,
        "missingSeqRanges": missing.ranges,
        "missingSeqRangesTotal": missing.ranges_total,
        "closed": p.get(field::CLOSED),
        "sentSuccess": p.int("sent_success"),
        "sentFailed": p.int("sent_failed"),
        "cancelled": p.cancelled(),
        "stoppedGenerations": p.int(field::STOPPED),
        "unsentRecipients": p.int(field::UNSENT),
        "unknownRecipients": p.int(field::UNKNOWN),
        "sentGenerations": sent.len(),
        "sentRecipients": sent_recipients,
        "groups": groups,
    })
}

/// Unix ms as RFC 3339 (UTC).
fn rfc3339(ms: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(ms)
        .ok()
        .map(|t| t.to_string())
}

/// Runs a report item.
pub async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let Some(url) = ctx.config.report_webhook.as_deref() else {
        return Ok(Outcome::Done);
    };
    let log = ctx.store.batch_in(&item.batch, lane);
    let state = log.state().await?;
    if state.appended(event_key::DELIVERED).is_some() {
        return Ok(Outcome::Done);
    }
    if state.report().is_none() {
        return Ok(Outcome::Dead(
            "report work item for a batch with no report".into(),
        ));
    }
    let body = report_json(&item.batch, &state);
    let sent = ctx
        .webhook
        .post(url)
        .header("Idempotency-Key", format!("{}:report", item.batch))
        .json(&body)
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() => {
            let e = Event::ReportDelivered(ReportDelivered {
                status: r.status().as_u16(),
            });
            log.append(event_key::DELIVERED, &e).await?;
            Ok(Outcome::Done)
        }
        Ok(r) => Ok(Outcome::Retry {
            delay: None,
            spend: true,
            cause: RetryCause::Webhook,
            reason: format!("report webhook answered {}", r.status()),
        }),
        Err(e) => Ok(Outcome::Retry {
            delay: None,
            spend: true,
            cause: RetryCause::Webhook,
            reason: format!("report webhook unreachable: {e}"),
        }),
    }
}
