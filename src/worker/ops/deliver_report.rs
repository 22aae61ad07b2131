//! `report`: POST a decided report to the webhook, with an `Idempotency-Key`
//! header, until it is accepted.

use serde_json::json;

use crate::events::options::SendWindow;
use crate::events::{Event, ReportDelivered};
use crate::keys::Priority;
use crate::projection::{event_key, field, Projection};
use crate::seq_ranges::MISSING_RANGES_MAX;
use crate::worker::ops::{OpError, Outcome, RetryCause, WorkItem};
use crate::worker::webhook::FieldNames;
use crate::worker::Ctx;

/// The report of a batch, as JSON, from its state, with its fields named
/// as in the reports stream and the board's API (snake_case, see
/// `docs/reports.md`): every field of the `batch_reported` event, under its
/// name there, and what a receiver needs beyond it.
pub(crate) fn report_json(batch: &str, p: &Projection) -> serde_json::Value {
    let groups: Vec<_> = (0..p.generations())
        .map(|g| {
            json!({
                "generation": g,
                "group_id": p.gen_field(g, "group"),
                "recipients": p.gen_int(g, "n"),
                "registered": p.gen_int(g, "reg"),
                "failed": p.gen_int(g, "fail"),
                "status": p.gen_field(g, "done"),
                "scheduled_at": p.gen_field(g, "at").and_then(|ms| rfc3339(ms.parse().ok()?)),
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
        "batch_id": batch,
        "priority": window.priority.name(),
        "send_at": window.send_at_text(),
        "quiet_hours": window.quiet_text(),
        "held_for_night": held_for_night,
        "outcome": p.get("report"),
        "generations": p.generations(),
        "chunks": p.int("seqs"),
        "recipients": p.int("recipients"),
        "registered": p.int("registered"),
        "failed": p.int("failed"),
        "failed_by_reason": failed_by_reason,
        "duplicates": p.int(field::DUPLICATES),
        "rejected": p.int(field::REJECTED),
        "last_conflict": p.get(field::LAST_CONFLICT),
        "missing": p.int(field::MISSING),
        "missing_seq_count": missing.count,
        "missing_seq_ranges": missing.ranges,
        "missing_seq_ranges_total": missing.ranges_total,
        "closed": p.get(field::CLOSED),
        "sent_success": p.int("sent_success"),
        "sent_failed": p.int("sent_failed"),
        "cancelled": p.cancelled(),
        "stopped": p.int(field::STOPPED),
        "unsent": p.int(field::UNSENT),
        "unknown": p.int(field::UNKNOWN),
        "sent_generations": sent.len(),
        "sent_recipients": sent_recipients,
        "groups": groups,
        "origin": p.get(field::ORIGIN),
    })
}

/// The report's fields under the names earlier releases sent
/// (`--webhook-field-names camel`): (name now, name then). A field not
/// listed was not sent then and is left out.
const CAMEL_NAMES: &[(&str, &str)] = &[
    ("batch_id", "batchId"),
    ("priority", "priority"),
    ("send_at", "sendAt"),
    ("quiet_hours", "quietHours"),
    ("outcome", "outcome"),
    ("chunks", "chunks"),
    ("recipients", "recipients"),
    ("registered", "registered"),
    ("failed", "failed"),
    ("failed_by_reason", "failedByReason"),
    ("duplicates", "duplicates"),
    ("rejected", "rejected"),
    ("last_conflict", "lastConflict"),
    ("missing", "missing"),
    ("missing_seq_count", "missingSeqCount"),
    ("missing_seq_ranges", "missingSeqRanges"),
    ("missing_seq_ranges_total", "missingSeqRangesTotal"),
    ("closed", "closed"),
    ("sent_success", "sentSuccess"),
    ("sent_failed", "sentFailed"),
    ("cancelled", "cancelled"),
    ("stopped", "stoppedGenerations"),
    ("unsent", "unsentRecipients"),
    ("unknown", "unknownRecipients"),
    ("sent_generations", "sentGenerations"),
    ("sent_recipients", "sentRecipients"),
    ("groups", "groups"),
];

/// A group's fields under the names earlier releases sent.
const CAMEL_GROUP_NAMES: &[(&str, &str)] = &[
    ("generation", "generation"),
    ("group_id", "groupId"),
    ("recipients", "recipients"),
    ("registered", "registered"),
    ("failed", "failed"),
    ("status", "status"),
    ("scheduled_at", "scheduledAt"),
];

/// The report as the webhook's body names its fields.
pub(crate) fn webhook_body(report: serde_json::Value, names: FieldNames) -> serde_json::Value {
    match names {
        FieldNames::Snake => report,
        FieldNames::Camel => {
            let mut body = renamed(&report, CAMEL_NAMES);
            if let Some(groups) = report["groups"].as_array() {
                body["groups"] = groups
                    .iter()
                    .map(|g| renamed(g, CAMEL_GROUP_NAMES))
                    .collect();
            }
            body
        }
    }
}

/// The fields of `object` named in `names`, under their other names.
fn renamed(object: &serde_json::Value, names: &[(&str, &str)]) -> serde_json::Value {
    names
        .iter()
        .filter_map(|(now, then)| Some((then.to_string(), object.get(*now)?.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Unix ms as RFC 3339 (UTC).
fn rfc3339(ms: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(ms)
        .ok()
        .map(|t| t.to_string())
}

/// Runs a report item.
pub(crate) async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
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
    let body = webhook_body(
        report_json(&item.batch, &state),
        ctx.config.webhook_field_names,
    );
    // The same on every retry of this report, so a receiver can drop a
    // second copy; the idempotency key earlier releases sent already.
    let id = format!("{}:report", item.batch);
    post(ctx, &log, url, &id, &body, event_key::DELIVERED, None).await
}

/// The delivery report of a batch, as JSON: its `batch_delivered` event's
/// fields (`docs/reports.md`), with the batch id and `report` =
/// `delivery`.
pub(crate) fn delivery_report_json(
    batch: &str,
    e: &crate::events::BatchDelivered,
) -> serde_json::Value {
    let mut v = serde_json::to_value(e).unwrap_or_default();
    v["batch_id"] = json!(batch);
    v["report"] = json!("delivery");
    v
}

/// Runs a delivery report item: the batch's second report, with its own
/// idempotency key (`<batch>:delivery`).
pub(crate) async fn run_delivery(
    ctx: &Ctx,
    lane: Priority,
    item: &WorkItem,
) -> Result<Outcome, OpError> {
    let Some(url) = ctx.config.report_webhook.as_deref() else {
        return Ok(Outcome::Done);
    };
    let log = ctx.store.batch_in(&item.batch, lane);
    if log
        .appended(event_key::DELIVERY_REPORT_DELIVERED)
        .await?
        .is_some()
    {
        return Ok(Outcome::Done);
    }
    let Some(recorded) = log.recorded(event_key::DELIVERY_REPORT).await? else {
        return Ok(Outcome::Dead(
            "delivery report work item for a batch with no delivery report".into(),
        ));
    };
    let Event::BatchDelivered(e) = recorded.event else {
        return Ok(Outcome::Dead(
            "the batch's delivery_report event is not a batch_delivered".into(),
        ));
    };
    let body = delivery_report_json(&item.batch, &e);
    let id = format!("{}:delivery", item.batch);
    post(
        ctx,
        &log,
        url,
        &id,
        &body,
        event_key::DELIVERY_REPORT_DELIVERED,
        Some("delivery"),
    )
    .await
}

/// POSTs `body` to the webhook with the idempotency key `id` (signed when
/// secrets are configured) and records its acceptance under `delivered_key`
/// (`report`: which report, absent for the batch's report).
async fn post(
    ctx: &Ctx,
    log: &crate::store::batch::BatchLog,
    url: &str,
    id: &str,
    body: &serde_json::Value,
    delivered_key: &str,
    report: Option<&str>,
) -> Result<Outcome, OpError> {
    // Signed over these exact bytes; serializing a JSON value cannot fail.
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut request = ctx
        .webhook
        .post(url)
        .header("Idempotency-Key", id)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(secrets) = &ctx.config.webhook_secrets {
        // The attempt's time, on this machine's clock: the receiver compares
        // it with its own wall clock, not with Redis'.
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        request = request
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", secrets.signature(id, timestamp, &body));
    }
    let sent = request.body(body).send().await;
    match sent {
        Ok(r) if r.status().is_success() => {
            let e = Event::ReportDelivered(ReportDelivered {
                status: r.status().as_u16(),
                report: report.map(str::to_string),
            });
            log.append(delivered_key, &e).await?;
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
            // reqwest names the URL, whose query or userinfo may hold a token.
            reason: format!(
                "report webhook unreachable: {}",
                crate::redact::error_chain(&crate::redact::reqwest_error(e))
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report's fields that earlier releases did not send (left out of
    /// the camelCase body).
    const NEW_FIELDS: &[&str] = &["generations", "held_for_night", "origin"];

    fn keys(v: &serde_json::Value) -> Vec<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn a_report() -> serde_json::Value {
        let mut p = Projection::default();
        p.fields.insert("report".into(), "completed".into());
        p.fields.insert("gen".into(), "0".into());
        p.fields.insert(field::gen(0, "group"), "G1".into());
        report_json("b1", &p)
    }

    #[test]
    fn the_report_names_its_fields_in_snake_case() {
        let report = a_report();
        let snake = |k: &String| {
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        assert!(keys(&report).iter().all(snake), "{report}");
        for g in report["groups"].as_array().into_iter().flatten() {
            assert!(keys(g).iter().all(snake), "{g}");
        }
        assert_eq!(webhook_body(report.clone(), FieldNames::Snake), report);
    }

    /// `--webhook-field-names camel` sends exactly the names (and values)
    /// earlier releases sent.
    #[test]
    fn camel_names_are_the_earlier_releases() {
        let report = a_report();
        let camel = webhook_body(report.clone(), FieldNames::Camel);
        let mut names = keys(&camel);
        names.sort();
        let mut then: Vec<String> = CAMEL_NAMES.iter().map(|(_, t)| t.to_string()).collect();
        then.sort();
        assert_eq!(names, then);
        assert_eq!(camel["batchId"], "b1");
        assert_eq!(camel["stoppedGenerations"], report["stopped"]);
        for new in NEW_FIELDS {
            assert!(camel.get(new).is_none(), "{new} in {camel}");
        }
        assert_eq!(
            camel["groups"][0]["groupId"],
            report["groups"][0]["group_id"]
        );
        // Every name of now is either renamed or new.
        for k in keys(&report) {
            assert!(
                CAMEL_NAMES.iter().any(|(now, _)| *now == k) || NEW_FIELDS.contains(&k.as_str()),
                "{k} has no earlier name and is not listed as new"
            );
        }
    }
}
