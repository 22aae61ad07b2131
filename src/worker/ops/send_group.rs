//! `send`: trigger a complete generation's send, exactly once.
//!
//! Guarded twice: the terminal marker (the `send/<gen>` event key) on entry,
//! then the provider's own view (a group no longer `PENDING` was sent). Before
//! sending, the provider's registered count must equal what our events say
//! was loaded, else the send is refused and dead-lettered (fail closed): a
//! silent rejection at the provider must never go out as a partial send. A
//! `409` means another worker's send already happened.
//!
//! A batch with a `send_at` or quiet hours holds its ready generations until
//! the instant they may go (the work item waits in the delayed set; the
//! first hold is recorded as `send_scheduled`); a generation ready after
//! `send_at` goes at once, unless that falls inside quiet hours.
//!
//! Right before the send, the send is *claimed* (`claim_send.lua`, the
//! `send_claimed` event): the claim and a cancel are linearized on the
//! batch's state, so either the cancel came first (the claim is refused and
//! the group is never sent; the cancel deletes it) or the claim did (the
//! cancel leaves the generation alone: it is sent and counted). A worker that
//! crashes after the claim finds it again on the retry and sends.
//!
//! When Redis may lose its last acknowledged writes in a crash, the send also
//! waits until the generation's `ready` event and the claim are on disk
//! (`config.durable`, [`on_disk`]): a send must never rest on facts Redis
//! can still take back (the generation would be redone in a new group and
//! sent twice, or a cancel would stop a generation that was sent).

use std::time::Duration;

use crate::events::options::SendWindow;
use crate::events::{Event, SendRefused, SendScheduled};
use crate::keys::Priority;
use crate::projection::{event_key, field};
use crate::provider::{GroupStatus, ProviderErrorKind};
use crate::store::batch::Claim;
use crate::store::queue::DelayedEntry;
use crate::worker::ops::{
    on_disk, provider_slots, OnDisk, Op, OpError, Outcome, RetryCause, WorkItem,
};
use crate::worker::Ctx;

/// Runs a send item.
pub async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let (send_key, ready_key) = (event_key::send(gen), event_key::ready(gen));
    let schedule_key = event_key::schedule(gen);
    let claim_key = event_key::claim(gen);
    let p = log
        .read(&[
            field::key(&send_key),
            field::group(gen),
            field::registered_in(gen),
            field::unsure_in(gen),
            field::key(&ready_key),
            field::OPTIONS.into(),
            field::key(&schedule_key),
            field::key(&claim_key),
        ])
        .await?;
    if p.appended(&send_key).is_some() {
        return Ok(Outcome::Done);
    }
    let Some(ready_id) = p.appended(&ready_key) else {
        // make_ready appends the event and this item together: an item
        // without the event comes from writes Redis lost (a worker held it
        // in memory and re-queued it after the restart). Stale, like such a
        // load item: the generation gets a send item of its own when it is
        // ready again, and nothing was sent (a send waits until what it
        // relies on is on disk). A dead letter would ask an operator for a
        // replay that can do nothing.
        tracing::warn!(batch = %item.batch, gen, "send work item for a generation our events do not show ready (lost Redis writes?): dropped as stale");
        return Ok(Outcome::Done);
    };
    // Held until `send_at`, and never inside the batch's quiet hours.
    if let Some(window) = p
        .get(field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .filter(SendWindow::holds)
    {
        let now = log.server_time_ms().await?;
        let at = u64::try_from(window.release_at(now as i64)).unwrap_or(0);
        if at > now {
            if p.appended(&schedule_key).is_none() {
                let group_id = p.group_of(gen).unwrap_or_default().to_string();
                let reason = match window.send_at {
                    Some(s) if s as u64 >= at => "send_at",
                    _ => "quiet_hours",
                };
                let e = Event::SendScheduled(SendScheduled {
                    gen,
                    group_id,
                    at_ms: at,
                    reason: reason.into(),
                });
                log.append(&schedule_key, &e).await?;
                tracing::info!(batch = %item.batch, gen, at_ms = at, reason, "send scheduled");
            }
            return Ok(Outcome::Retry {
                delay: Some(Duration::from_millis(at - now)),
                spend: false,
                cause: RetryCause::Scheduled,
                reason: format!("generation {gen} is held until {at} (Unix ms)"),
            });
        }
    }
    let Some(group_id) = p.group_of(gen).map(str::to_string) else {
        return Ok(Outcome::Dead(format!(
            "generation {gen} is ready but has no group"
        )));
    };
    let registered = p.registered_in(gen);
    // Recipients of chunks given up on may or may not have been registered
    // before the add failed for good: the provider may hold up to that many
    // more than our events count.
    let unsure = p.unsure_in(gen);
    // The first read of the group's status, soon after the send.
    let first_poll = ctx.config.next_poll(std::time::Duration::ZERO);
    let poll = DelayedEntry {
        op: Op::Poll.name().into(),
        d: crate::events::encode_payload(&WorkItem {
            batch: item.batch.clone(),
            gen,
            seq: None,
            group_id: Some(group_id.clone()),
            attempt: 0,
            since: 0,
            poll_delay_ms: first_poll.as_millis() as u64,
        }),
        c: None,
        lane,
    }
    .encode();
    let poll_ms = first_poll.as_millis() as u64;

    // The send makes two provider requests: the status read, then the send.
    // A first try books them one by one. A try after a claim (the earlier
    // one read the status, then the limiter gave the entry back before the
    // send) books both at once: booked one by one again, each try's read
    // could take the slot the send needs (the lane's horizon, or its owed
    // slot), try after try, and the send would never go (seen in
    // tests/liveness: a claimed generation unsent for 90 s at 8/s). A
    // booking refused reserves nothing, so one for both goes as soon as the
    // schedule has room for two, or the lane is owed its share.
    let booked_both = p.appended(&claim_key).is_some();
    if let Some(back) = provider_slots(ctx, lane, if booked_both { 2 } else { 1 }).await? {
        return Ok(back);
    }
    let group = match ctx.provider.get_group(&group_id).await {
        Ok(g) => g,
        Err(e) => return Ok(Outcome::from_provider(&e)),
    };
    if group.status == GroupStatus::Deleted {
        // Only a cancel deletes a generation's own group, and only one whose
        // send was not claimed: this item is stale.
        tracing::info!(batch = %item.batch, gen, group = %group_id, "group deleted by a cancel: not sent");
        return Ok(Outcome::Done);
    }
    if group.status != GroupStatus::Pending {
        log.sent(gen, &group_id, "already_sent", poll_ms, &poll)
            .await?;
        return Ok(Outcome::Done);
    }
    let held = group.count.registered_success;
    if held < registered || held > registered + unsure {
        let expected = match unsure {
            0 => registered.to_string(),
            _ => format!(
                "{registered} (up to {} with given-up chunks)",
                registered + unsure
            ),
        };
        let reason = format!(
            "provider has {held} registered messages in group {group_id}, our events say {expected}: not sending"
        );
        tracing::error!(batch = %item.batch, gen, %reason, "send refused");
        metrics::counter!("groupcast_sends_refused_total").increment(1);
        let e = Event::SendRefused(SendRefused {
            gen,
            group_id,
            reason: reason.clone(),
        });
        log.append(&event_key::refused(gen), &e).await?;
        return Ok(Outcome::Dead(reason));
    }
    let claim = match log.claim_send(gen).await? {
        Claim::Claimed(id) => id,
        Claim::Cancelled(why) => {
            tracing::info!(batch = %item.batch, gen, reason = %why, "batch cancelled before this generation's send: not sent");
            return Ok(Outcome::Done);
        }
    };
    match on_disk(
        ctx,
        &log,
        &[(&ready_key, ready_id), (&claim_key, &claim)],
        || format!("generation {gen} just became ready, or its send was just claimed"),
    )
    .await?
    {
        OnDisk::Yes => {}
        OnDisk::NotYet(wait) | OnDisk::Gone(wait) => return Ok(wait),
    }
    if !booked_both {
        if let Some(back) = provider_slots(ctx, lane, 1).await? {
            return Ok(back);
        }
    }
    let outcome = match ctx.provider.send_group(&group_id).await {
        Ok(_) => "sent",
        Err(e) if e.kind() == ProviderErrorKind::AlreadySent => "already_sent",
        Err(e) => return Ok(Outcome::from_provider(&e)),
    };
    if log.sent(gen, &group_id, outcome, poll_ms, &poll).await? {
        metrics::counter!("groupcast_groups_sent_total", "outcome" => outcome).increment(1);
        tracing::info!(batch = %item.batch, gen, group = %group_id, outcome, "group sent");
    }
    Ok(Outcome::Done)
}
