//! `track`: read a finished group's message list until every message has
//! its delivery result or the delivery window (`--delivery-window`, from
//! the send) ends, then count the generation delivered and, when it was the
//! last, decide the batch's delivery report (`delivered.lua`).
//!
//! `completed.lua` enqueues the item with the fact that the provider
//! finished the group. Each pass reads the list from the item's `cursor`:
//! the first page that still had a message without a result (the pages
//! before it are final, their counts and records written). Every page read
//! is written at once (`track_page.lua`, overwrites), so a worker killed in
//! the middle of a pass loses nothing, and the pass it repeats only reads
//! again: no request that changes anything at the provider is made here.
//! Between passes the item waits in the delayed set, twice as long each
//! time from `--track-first-wait` (2 s) up to ten minutes; the shared rate
//! limiter counts every read.

use std::time::Duration;

use crate::keys::Priority;
use crate::projection::{event_key, field};
use crate::provider::ListedMessage;
use crate::results::{NotSentReason, Outcome as RecipientOutcome, Record, Stage, Status};
use crate::store::batch::BatchLog;
use crate::store::delivery::{BatchDelivery, PageCounts};
use crate::worker::ops::{provider_slots, OpError, Outcome, RetryCause, WorkItem};
use crate::worker::{Ctx, WorkerConfig};

/// Messages asked for per page (the provider's largest).
pub(crate) const PAGE: u32 = 500;

/// One page, as tracking counts it: its counts, the records of the
/// messages not delivered (number → [`Record::encode`]), and how many
/// messages have no result yet (0 once the window ended: they are unknown).
pub(crate) fn tally(
    gen: u32,
    messages: &[ListedMessage],
    window_ended: bool,
) -> (PageCounts, Vec<(String, String)>, usize) {
    let mut counts = PageCounts::default();
    let mut records = Vec::new();
    let mut pending = 0;
    let mut record = |m: &ListedMessage, outcome, stage, code: &str| {
        let r = Record {
            outcome,
            stage,
            gen,
            code: code.to_string(),
            message_id: m.message_id.clone(),
            seq: None,
        };
        records.push((m.to.clone(), r.encode()));
    };
    for m in messages {
        let status = Status::of(&m.status_code);
        if matches!(
            status,
            Status::FailedAtDelivery | Status::RefusedAtRegistration
        ) && !m.reason.is_empty()
        {
            counts
                .reasons
                .entry(m.status_code.clone())
                .or_insert_with(|| crate::events::clip(&m.reason, 4 * crate::events::QUOTE_MAX));
        }
        match status {
            Status::Delivered => counts.delivered += 1,
            Status::FailedAtDelivery => {
                counts.failed += 1;
                *counts
                    .failed_by_code
                    .entry(m.status_code.clone())
                    .or_default() += 1;
                record(m, RecipientOutcome::Failed, Stage::Delivery, &m.status_code);
            }
            // Counted by the batch's report already (`chunk_loaded`); kept
            // here with its message id.
            Status::RefusedAtRegistration => record(
                m,
                RecipientOutcome::Failed,
                Stage::Registration,
                &m.status_code,
            ),
            Status::RepeatedAdd => {}
            Status::Pending if window_ended => {
                counts.unknown += 1;
                record(m, RecipientOutcome::Unknown, Stage::Delivery, "");
            }
            Status::Pending => pending += 1,
        }
    }
    (counts, records, pending)
}

/// The wait before the next pass, after waiting `last` (zero: the first).
pub(crate) fn next_wait(config: &WorkerConfig, last: Duration) -> Duration {
    if last.is_zero() {
        config.track_first_wait
    } else {
        last.saturating_mul(2)
    }
    .min(WorkerConfig::TRACK_MAX_WAIT)
}

/// Runs a track item.
pub(crate) async fn run(
    ctx: &Ctx,
    lane: Priority,
    item: &mut WorkItem,
) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let Some(group_id) = item.group_id.clone() else {
        // No group: the batch reported with no generation left to track
        // (settle.lua): only its delivery report is left to decide. An
        // operator's command queues it whatever the workers' flags: with
        // tracking off there is no delivery report.
        if ctx.config.delivery_window.is_zero() {
            return Ok(Outcome::Done);
        }
        return decide(ctx, &log, None, "", false, item).await;
    };
    let keep = ctx.config.results_retention;
    // One read: whether the generation is counted already, and when it was sent.
    let (delivered_key, send_key) = (event_key::gen_delivered(gen), event_key::send(gen));
    let p = log
        .read(&[field::key(&delivered_key), field::key(&send_key)])
        .await?;
    if p.appended(&delivered_key).is_some() {
        // Counted already: only the batch's decision may be left.
        return decide(ctx, &log, Some(gen), &group_id, false, item).await;
    }
    let now = ctx.store.shard_time_ms(log.keys.shard).await?;
    let sent_ms = p
        .appended(&send_key)
        .and_then(|id| id.split('-').next()?.parse::<u64>().ok())
        .unwrap_or(now);
    let window_end = sent_ms.saturating_add(ctx.config.delivery_window.as_millis() as u64);
    let ended = now >= window_end;
    let keep_for = Duration::from_millis(window_end.saturating_sub(now)) + keep;
    let mut page = item.cursor.clone();
    let mut first_pending: Option<Option<String>> = None;
    let mut pending_total = 0;
    loop {
        if let Some(back) = provider_slots(ctx, lane, 1).await? {
            item.cursor = first_pending.unwrap_or(page);
            return Ok(back);
        }
        let listed = match ctx
            .provider
            .list_messages(&group_id, page.as_deref(), PAGE)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                item.cursor = first_pending.unwrap_or(page);
                return Ok(super::provider_failed(ctx, &item.batch, &e).await);
            }
        };
        let (counts, records, pending) = tally(gen, &listed.messages, ended);
        let key = page.as_deref().unwrap_or_default();
        if !log
            .track_page(gen, &group_id, key, &counts, keep_for, &records)
            .await?
        {
            // Another worker counted the generation meanwhile.
            return decide(ctx, &log, Some(gen), &group_id, false, item).await;
        }
        if first_pending.is_none() {
            // Final and behind the cursor from now on: never read again.
            count_final_page(&counts);
        }
        if pending > 0 && first_pending.is_none() {
            first_pending = Some(page.clone());
        }
        pending_total += pending;
        match listed.next_key {
            Some(next) if !listed.messages.is_empty() => page = Some(next),
            _ => break,
        }
    }
    let Some(cursor) = first_pending else {
        return decide(ctx, &log, Some(gen), &group_id, ended, item).await;
    };
    item.cursor = cursor;
    let wait = next_wait(&ctx.config, Duration::from_millis(item.poll_delay_ms))
        .min(Duration::from_millis(window_end.saturating_sub(now)))
        .max(Duration::from_millis(100));
    item.poll_delay_ms = wait.as_millis() as u64;
    Ok(Outcome::Retry {
        delay: Some(wait),
        spend: false,
        cause: RetryCause::AwaitingResults,
        reason: format!(
            "{pending_total} message(s) of group {group_id} have no delivery result yet"
        ),
    })
}

/// Records every message of `group_id` (generation `gen`) that the
/// provider registered as never sent, for `reason`: the group of a
/// generation a cancel stopped, or whose send was given up, about to be
/// deleted. Read from the message list before the delete, so that
/// `groupcast results --status not_sent` can name them; only reads at the
/// provider, and each page is written as it comes (a repeat overwrites).
/// Some(outcome): the caller gives the item back with it (no slot, or a
/// passing provider failure); a refusal for good only leaves the
/// recipients unnamed (None).
pub(super) async fn record_not_sent(
    ctx: &Ctx,
    lane: Priority,
    log: &BatchLog,
    gen: u32,
    group_id: &str,
    reason: NotSentReason,
) -> Result<Option<Outcome>, OpError> {
    let keep = ctx.config.results_keep();
    let mut page: Option<String> = None;
    loop {
        if let Some(back) = provider_slots(ctx, lane, 1).await? {
            return Ok(Some(back));
        }
        let listed = match ctx
            .provider
            .list_messages(group_id, page.as_deref(), PAGE)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                return Ok(match super::provider_failed(ctx, &log.batch, &e).await {
                    // Refused for good (a provider that will not list a
                    // group being deleted, or deleted): its recipients stay
                    // counted, not named; the delete or recall goes on.
                    Outcome::Dead(why) => {
                        tracing::warn!(batch = %log.batch, gen, group = %group_id, reason = %why, "the group's messages could not be listed: its recipients are counted, not named");
                        None
                    }
                    back => Some(back),
                });
            }
        };
        let records: Vec<(String, String)> = listed
            .messages
            .iter()
            .filter(|m| {
                !matches!(
                    Status::of(&m.status_code),
                    Status::RefusedAtRegistration | Status::RepeatedAdd
                )
            })
            .map(|m| {
                let r = Record::not_sent(gen, reason, &m.message_id);
                (r.field(&m.to), r.encode())
            })
            .collect();
        log.record_outcomes(&records, keep).await?;
        match listed.next_key {
            Some(next) if !listed.messages.is_empty() => page = Some(next),
            _ => return Ok(None),
        }
    }
}

/// Metrics of a page whose every message is final.
fn count_final_page(counts: &PageCounts) {
    metrics::counter!("groupcast_recipients_delivered_total").increment(counts.delivered);
    metrics::counter!("groupcast_recipients_unknown_total").increment(counts.unknown);
    for (code, n) in &counts.failed_by_code {
        metrics::counter!("groupcast_recipients_delivery_failed_total", "code" => code.clone())
            .increment(*n);
    }
}

/// Counts generation `gen` delivered and decides the batch's delivery
/// report if it was the last; a batch not reported yet is asked again.
async fn decide(
    ctx: &Ctx,
    log: &BatchLog,
    gen: Option<u32>,
    group_id: &str,
    window_ended: bool,
    item: &mut WorkItem,
) -> Result<Outcome, OpError> {
    let keep = ctx.config.results_retention;
    match log.delivered(gen, group_id, window_ended, keep).await? {
        BatchDelivery::Decided => {
            metrics::counter!("groupcast_delivery_reports_total").increment(1);
            tracing::info!(batch = %log.batch, ?gen, "delivery report decided");
            Ok(Outcome::Done)
        }
        BatchDelivery::Already | BatchDelivery::Tracking => Ok(Outcome::Done),
        BatchDelivery::Unreported => {
            let wait = next_wait(&ctx.config, Duration::from_millis(item.poll_delay_ms));
            item.poll_delay_ms = wait.as_millis() as u64;
            Ok(Outcome::Retry {
                delay: Some(wait),
                spend: false,
                cause: RetryCause::AwaitingResults,
                reason: "delivery results are in; the batch's report is not decided yet".into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(to: &str, code: &str) -> ListedMessage {
        ListedMessage {
            message_id: format!("M-{to}"),
            group_id: "G".into(),
            to: to.into(),
            status_code: code.into(),
            reason: if code == "4000" || code == "3000" {
                String::new()
            } else {
                format!("why {code}")
            },
            replacement: false,
        }
    }

    #[test]
    fn a_page_counts_each_message_once_by_its_status() {
        let page = [
            m("01000000001", "4000"),
            m("01000000002", "3104"),
            m("01000000003", "3000"),
            m("01000000004", "1062"),
            m("01000000005", "1026"),
            m("01000000006", "3043"),
        ];
        let (c, records, pending) = tally(2, &page, false);
        assert_eq!((c.delivered, c.failed, c.unknown, pending), (1, 2, 0, 1));
        assert_eq!(c.failed_by_code.get("3104"), Some(&1));
        // The provider's text of each failure code, once a page.
        assert_eq!(c.reasons.get("3104").map(String::as_str), Some("why 3104"));
        assert_eq!(c.reasons.get("1062").map(String::as_str), Some("why 1062"));
        assert_eq!(c.reasons.len(), 3);
        let numbers: Vec<&str> = records.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(numbers, ["01000000002", "01000000004", "01000000006"]);
        assert_eq!(records[0].1, "F|2|3104|M-01000000002");
        assert_eq!(records[1].1, "R|2|1062|M-01000000004");
        // Once the window ended, what has no result is unknown, and recorded.
        let (c, records, pending) = tally(2, &page, true);
        assert_eq!((c.unknown, pending), (1, 0));
        assert!(records.contains(&("01000000003".into(), "U|2||M-01000000003".into())));
    }

    #[test]
    fn passes_wait_longer_each_time_up_to_ten_minutes() {
        let c = WorkerConfig::default();
        let mut w = Duration::ZERO;
        let mut waits = Vec::new();
        for _ in 0..12 {
            w = next_wait(&c, w);
            waits.push(w.as_secs());
        }
        assert_eq!(waits[..4], [2, 4, 8, 16]);
        assert_eq!(*waits.last().unwrap_or(&0), 600);
    }
}
