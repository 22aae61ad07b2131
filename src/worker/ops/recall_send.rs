//! A send given up, and its `recall`: the generation must still end, and
//! truthfully.
//!
//! When a send item is given up (the provider refused it for good, it kept
//! failing past `--retry-for`, or the count check refused it),
//! `give_up_send.lua` records it and the generation takes no claim any more.
//! With no claim in place nothing went out: the generation is done
//! `unsent`. With a claim in place the send may have gone out with its
//! answer lost: a `recall` item asks the provider, by deleting the group.
//! Deleted (or found deleted), it can never go out: done `unsent`. Refused
//! because the group is no longer pending, it went out: recorded as sent,
//! and polled like any other. A poll or a recall given up leaves the
//! group's outcome unknown: done `unknown`.

use crate::keys::Priority;
use crate::projection::{event_key, field};
use crate::protocol::GivenUp;
use crate::provider::{GroupStatus, ProviderErrorKind};
use crate::results::NotSentReason;
use crate::store::batch::SendGiveUp;
use crate::worker::ops::send_group::first_poll;
use crate::worker::ops::track_delivery::record_not_sent;
use crate::worker::ops::{provider_slots, Op, OpError, Outcome, WorkItem};
use crate::worker::Ctx;

/// Runs a recall item.
pub(crate) async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let Some(group_id) = item.group_id.as_deref().filter(|g| !g.is_empty()) else {
        return Ok(Outcome::Dead("recall item without a group id".into()));
    };
    let gen = item.gen;
    let log = ctx.store.batch_in(&item.batch, lane);
    let send_key = event_key::send(gen);
    let done_key = event_key::done(gen);
    let p = log
        .read(&[field::key(&send_key), field::key(&done_key)])
        .await?;
    if p.appended(&done_key).is_some() || p.appended(&send_key).is_some() {
        return Ok(Outcome::Done);
    }
    if let Some(back) = provider_slots(ctx, lane, 1).await? {
        return Ok(back);
    }
    let went_out = match ctx.provider.delete_group(group_id).await {
        Ok(()) => false,
        // Not there: never sent (a sent group stays listed).
        Err(e) if e.status() == Some(404) => false,
        Err(e) if e.kind() == ProviderErrorKind::Permanent => {
            // Refused: the group is no longer pending (it went out), or was
            // deleted by an earlier try whose answer was lost. Look; the
            // look waits for its slot, holding the entry (as a delete does).
            ctx.limiter.acquire(1).await?;
            match ctx.provider.get_group(group_id).await {
                Ok(g) if g.status == GroupStatus::Deleted => false,
                Ok(g) if g.status == GroupStatus::Pending => {
                    return Ok(Outcome::Dead(format!(
                        "cannot delete pending group {group_id}: {e}"
                    )))
                }
                Ok(_) => true,
                Err(ge) => return Ok(super::provider_failed(ctx, &item.batch, &ge).await),
            }
        }
        Err(e) => return Ok(super::provider_failed(ctx, &item.batch, &e).await),
    };
    if went_out {
        let (poll, poll_ms) = first_poll(ctx, lane, &item.batch, gen, group_id);
        if log
            .sent(gen, group_id, "sent_before_give_up", poll_ms, &poll)
            .await?
        {
            tracing::warn!(batch = %item.batch, gen, group = %group_id, "the send given up had gone out: recorded as sent, and polled");
        }
        return Ok(Outcome::Done);
    }
    // Deleted: who was in it is read for `groupcast results` (only reads;
    // a wait or a passing failure tries again).
    if let Some(back) =
        record_not_sent(ctx, lane, &log, gen, group_id, NotSentReason::Unsent).await?
    {
        return Ok(back);
    }
    let reason = format!("group {group_id} deleted at the provider: never sent");
    record(
        ctx,
        lane,
        Op::Recall,
        item,
        GivenUp::Unsent,
        &reason,
        group_id,
    )
    .await
}

/// Gives up a send, poll or recall item for good: records it
/// (`give_up_send.lua`) before the item is dead-lettered, so that its
/// generation and the batch still end. Other ops: nothing to record.
pub(crate) async fn give_up(
    ctx: &Ctx,
    lane: Priority,
    op: Op,
    item: &WorkItem,
    reason: &str,
) -> Result<(), OpError> {
    let what = match op {
        Op::Send => GivenUp::Send,
        Op::Poll => GivenUp::Poll,
        Op::Recall => GivenUp::Recall,
        _ => return Ok(()),
    };
    let group = match item.group_id.as_deref() {
        Some(g) => g.to_string(),
        None => ctx
            .store
            .batch_in(&item.batch, lane)
            .group_of(item.gen)
            .await?
            .unwrap_or_default(),
    };
    let reason = crate::events::clip(reason, 4 * crate::events::QUOTE_MAX);
    record(ctx, lane, op, item, what, &reason, &group).await?;
    Ok(())
}

/// Records `what` for `item`'s generation, and says so.
async fn record(
    ctx: &Ctx,
    lane: Priority,
    op: Op,
    item: &WorkItem,
    what: GivenUp,
    reason: &str,
    group: &str,
) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let got = log.give_up_send(gen, what, reason, group).await?;
    match got {
        SendGiveUp::Unsent(recipients) => {
            metrics::counter!("groupcast_generations_failed_total", "op" => op.name()).increment(1);
            tracing::error!(batch = %item.batch, gen, recipients, %reason, "send given up: the generation ends unsent");
        }
        SendGiveUp::Unknown(recipients) => {
            metrics::counter!("groupcast_generations_failed_total", "op" => op.name()).increment(1);
            tracing::error!(batch = %item.batch, gen, recipients, %reason, "given up: the generation's outcome is unknown");
        }
        SendGiveUp::Recalling => {
            tracing::warn!(batch = %item.batch, gen, %reason, "send given up with its claim in place: the provider is asked whether it went out");
        }
        SendGiveUp::Stale => {
            tracing::warn!(batch = %item.batch, gen, %reason, "given up, but what the item rested on is not recorded (lost Redis writes?): nothing given up");
        }
        SendGiveUp::Sent | SendGiveUp::Done => {}
    }
    Ok(Outcome::Done)
}
