//! `poll`: read a sent group until the provider finishes it, then record it
//! (which decides the batch's report when it is the last one).
//!
//! The reads back off (100 ms after the send, then twice as late each time,
//! up to `--poll-interval`). While the next wait is shorter than that, and
//! at most [`IN_PLACE_MAX`], the handler waits in place, its consumer slot
//! given back, and reads again:
//! a small group is usually finished within a read or two, and each trip
//! through the delayed set instead costs about a dozen Redis commands (the
//! retry, its promotion, a read of the item and its acknowledgement). Once
//! the wait reaches `--poll-interval`, the item goes back through the
//! delayed set between reads, which also refreshes the batch's heartbeat for
//! the watchdog.

use std::time::Duration;

use crate::keys::Priority;
use crate::projection::{event_key, field};
use crate::provider::GroupStatus;
use crate::store::batch::Completion;
use crate::worker::ops::{provider_slots, OpError, Outcome, RetryCause, WorkItem};
use crate::worker::Ctx;

/// The longest wait a poll makes in place between two reads. The waits in
/// place add up to less than twice this, far below the watchdog's
/// `--stall-after` (no heartbeat is stamped meanwhile) and a worker's drain
/// timeout, whatever `--poll-interval` is.
pub(crate) const IN_PLACE_MAX: Duration = Duration::from_secs(1);

/// Runs a poll item. The reads made in place advance the item's
/// `poll_delay_ms`, so that a retry goes on backing off from the last wait.
pub(crate) async fn run(
    ctx: &Ctx,
    lane: Priority,
    item: &mut WorkItem,
) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    if log.appended(&event_key::done(gen)).await?.is_some() {
        return Ok(Outcome::Done);
    }
    let Some(group_id) = item.group_id.as_deref() else {
        return Ok(Outcome::Dead("poll item without a group id".into()));
    };
    let (group, status) = loop {
        if let Some(back) = provider_slots(ctx, lane, 1).await? {
            return Ok(back);
        }
        let group = match ctx.provider.get_group(group_id).await {
            Ok(g) => g,
            Err(e) => return Ok(super::provider_failed(ctx, &item.batch, &e).await),
        };
        match group.status {
            GroupStatus::Complete => break (group, "COMPLETE"),
            GroupStatus::Failed => break (group, "FAILED"),
            _ => {}
        }
        // Not finished: read again twice as late as before this read.
        let next = ctx
            .config
            .next_poll(Duration::from_millis(item.poll_delay_ms));
        if next < ctx.config.poll_interval
            && next <= IN_PLACE_MAX
            && crate::worker::slot::wait_without_slot(next).await
        {
            item.poll_delay_ms = next.as_millis() as u64;
            continue;
        }
        // Through the delayed set; waiting is not a failed attempt. The
        // delay is the longest; the retry decision waits twice as long as
        // before this read, up to it (`WorkerConfig::next_poll`).
        return Ok(Outcome::Retry {
            delay: Some(ctx.config.poll_interval),
            spend: false,
            cause: RetryCause::NotFinished,
            reason: format!("group {group_id} is still {:?}", group.status),
        });
    };
    let r = log
        .completed(
            gen,
            group_id,
            status,
            group.count.sent_success,
            group.count.sent_failed,
        )
        .await?;
    if r == Completion::NotSent {
        // The poll came from a send Redis has since lost (its writes were
        // not yet on disk). The send item, redelivered with the lost
        // acknowledgement, finds the group sent and records the send with a
        // poll of its own; this one is stale.
        tracing::warn!(batch = %item.batch, gen, group = %group_id, "poll of a generation whose send our events do not show (lost Redis writes?): dropped as stale");
        return Ok(Outcome::Done);
    }
    if r == Completion::Reported {
        metrics::counter!("groupcast_batches_reported_total").increment(1);
        let p = log
            .read(&[field::FIRST_ACCEPTED.into(), field::HEARTBEAT.into()])
            .await?;
        let hb = p.heartbeat().and_then(|v| v.parse::<u64>().ok());
        let took = hb
            .unwrap_or(0)
            .saturating_sub(p.first_accepted_ms().unwrap_or(0));
        metrics::histogram!("groupcast_batch_duration_seconds").record(took as f64 / 1000.0);
        tracing::info!(batch = %item.batch, "batch reported");
    }
    Ok(Outcome::Done)
}
