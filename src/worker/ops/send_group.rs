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
//! `send_at` goes at once, unless that falls inside quiet hours. The
//! schedule is decided by the claim script on the Redis clock, in the same
//! atomic step as the claim: checked first (before the provider is read,
//! [`ClaimMode::Check`]), then again when claiming.
//!
//! Right before the send, the send is *claimed* (`claim_send.lua`, the
//! `send_claimed` event): the claim and a cancel are linearized on the
//! batch's state, so either the cancel came first (the claim is refused and
//! the group is never sent; the cancel deletes it) or the claim did (the
//! cancel leaves the generation alone: it is sent and counted). A claim
//! answer lets the provider call start until the claim's lifetime ends
//! (`claim_lifetime`, cut where quiet hours begin), with [`SEND_MARGIN`]
//! to spare; a try that cannot start it by then (a limiter or durability
//! wait) retries, and the retry claims again: the schedule is checked anew,
//! and a batch found held gives the claim back (`claim_given_back`), so a
//! cancel can stop it. A worker that crashes after the claim retries the
//! same way; the provider's status, read first, tells a send that went out.
//!
//! When Redis may lose its last acknowledged writes in a crash, the send also
//! waits until the generation's `ready` event and the claim are on disk
//! (`config.durable`, [`on_disk`]): a send must never rest on facts Redis
//! can still take back (the generation would be redone in a new group and
//! sent twice, or a cancel would stop a generation that was sent).

use std::time::{Duration, Instant};

use crate::events::options::SendWindow;
use crate::events::{Event, SendRefused};
use crate::keys::Priority;
use crate::projection::{event_key, field, Projection};
use crate::provider::{GroupStatus, ProviderErrorKind};
use crate::store::batch::{BatchLog, Claim, ClaimArgs, ClaimMode};
use crate::store::queue::DelayedEntry;
use crate::store::StoreError;
use crate::worker::ops::{
    on_disk, provider_slots, OnDisk, Op, OpError, Outcome, RetryCause, WorkItem,
};
use crate::worker::Ctx;

/// Runs a send item.
pub async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let p = log
        .read(&[
            field::key(&event_key::send(gen)),
            field::group(gen),
            field::registered_in(gen),
            field::unsure_in(gen),
            field::key(&event_key::ready(gen)),
            field::OPTIONS.into(),
            field::claimed(gen),
            field::claim_back(gen),
            field::failed_in(gen),
        ])
        .await?;
    let ready_id = match standing(&p, gen) {
        Standing::Ready(id) => id.to_string(),
        other => return Ok(not_sendable(item, &other)),
    };
    // Held until `send_at`, and never inside the batch's quiet hours: a
    // check before the provider is read, unless a claim is in place (a
    // retry: the provider's status comes first, since the send may have
    // gone out with its answer lost; the claim then re-checks the schedule
    // and gives the claim back if the batch is held).
    let window = p
        .get(field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .unwrap_or_default();
    let claimed = p.int(&field::claimed(gen)) > p.int(&field::claim_back(gen));
    if window.holds() && !claimed {
        if let Decided::Out(o) = decide(ctx, &log, &window, gen, ClaimMode::Check).await? {
            return Ok(o);
        }
    }
    let Some(group_id) = p.group_of(gen).map(str::to_string) else {
        return Ok(Outcome::Dead(format!(
            "generation {gen} is ready but has no group"
        )));
    };
    let (poll, poll_ms) = first_poll(ctx, lane, &item.batch, gen, &group_id);
    let send = Sendable {
        item,
        lane,
        log,
        window,
        group_id,
        ready_id,
        registered: p.registered_in(gen),
        unsure: p.unsure_in(gen),
        poll,
        poll_ms,
        booked_both: claimed,
    };
    if let Some(back) = provider_slots(ctx, lane, if claimed { 2 } else { 1 }).await? {
        return Ok(back);
    }
    let group = match ctx.provider.get_group(&send.group_id).await {
        Ok(g) => g,
        Err(e) => return Ok(super::provider_failed(ctx, &item.batch, &e).await),
    };
    if group.status != GroupStatus::Pending {
        return not_pending(&send, group.status).await;
    }
    let held = group.count.registered_success;
    if let Some(reason) = count_mismatch(&send, held) {
        return refuse(&send, reason).await;
    }
    claim_and_send(ctx, &send).await
}

/// What a send item's state says before anything else is asked.
#[derive(Debug, PartialEq, Eq)]
enum Standing<'a> {
    /// The generation was sent (its terminal marker is recorded).
    Sent,
    /// Its send was given up.
    GivenUp,
    /// No `ready` event: the item is stale.
    NotReady,
    /// Ready, with the `ready` event's entry id: the send goes on.
    Ready(&'a str),
}

/// Where generation `gen`'s send stands, from its state.
fn standing(p: &Projection, gen: u32) -> Standing<'_> {
    if p.appended(&event_key::send(gen)).is_some() {
        return Standing::Sent;
    }
    if p.failed_in(gen) == Some("send") {
        return Standing::GivenUp;
    }
    match p.appended(&event_key::ready(gen)) {
        Some(id) => Standing::Ready(id),
        None => Standing::NotReady,
    }
}

/// The outcome of an item whose generation is not to be sent (`standing`
/// is not [`Standing::Ready`]), said in the log.
fn not_sendable(item: &WorkItem, standing: &Standing) -> Outcome {
    let gen = item.gen;
    match standing {
        Standing::GivenUp => {
            // Given up (`give_up_send.lua`): never claimed again, so a redrive
            // of this item cannot send it (the claim refuses it too).
            tracing::info!(batch = %item.batch, gen, "this generation's send was given up: not sent");
        }
        Standing::NotReady => {
            // make_ready appends the event and this item together: an item
            // without the event comes from writes Redis lost (a worker held it
            // in memory and re-queued it after the restart). Stale, like such a
            // load item: the generation gets a send item of its own when it is
            // ready again, and nothing was sent (a send waits until what it
            // relies on is on disk). A dead letter would ask an operator for a
            // replay that can do nothing.
            tracing::warn!(batch = %item.batch, gen, "send work item for a generation our events do not show ready (lost Redis writes?): dropped as stale");
        }
        Standing::Sent | Standing::Ready(_) => {}
    }
    Outcome::Done
}

/// A ready generation whose group is known: what its send goes on with.
struct Sendable<'a> {
    item: &'a WorkItem,
    lane: Priority,
    log: BatchLog,
    /// The batch's schedule.
    window: SendWindow,
    group_id: String,
    /// The `ready` event's entry id.
    ready_id: String,
    /// Recipients our events say were registered in the group.
    registered: u64,
    /// Recipients of chunks given up on: they may or may not have been
    /// registered before the add failed for good, so the provider may hold
    /// up to that many more than our events count.
    unsure: u64,
    /// The first status read's delayed entry, and its delay in ms.
    poll: Vec<u8>,
    poll_ms: u64,
    /// Whether both provider requests were booked at once. The send makes
    /// two provider requests: the status read, then the send. A first try
    /// books them one by one. A try after a claim (the earlier one read the
    /// status, then the limiter gave the entry back before the send) books
    /// both at once: booked one by one again, each try's read could take the
    /// slot the send needs (the lane's horizon, or its owed slot), try after
    /// try, and the send would never go (seen in rigs/tests/liveness: a claimed
    /// generation unsent for 90 s at 8/s). A booking refused reserves
    /// nothing, so one for both goes as soon as the schedule has room for
    /// two, or the lane is owed its share.
    booked_both: bool,
}

/// The provider's group is no longer pending: deleted (stale, or never
/// sendable) or already sent.
async fn not_pending(send: &Sendable<'_>, status: GroupStatus) -> Result<Outcome, OpError> {
    let (item, gen, group_id) = (send.item, send.item.gen, &send.group_id);
    if status == GroupStatus::Deleted {
        // A cancel deletes a generation's own group, and only one whose
        // send was not claimed: then this item is stale. With no cancel on
        // record (one Redis lost after its delete went out, or a deletion
        // made at the provider by hand), the generation can never be sent:
        // given up (counted unsent), so that the batch still ends.
        if send
            .log
            .read(&[field::CANCELLED.into()])
            .await?
            .cancelled()
            .is_some()
        {
            tracing::info!(batch = %item.batch, gen, group = %group_id, "group deleted by a cancel: not sent");
            return Ok(Outcome::Done);
        }
        return Ok(Outcome::Dead(format!(
            "group {group_id} was deleted at the provider, and no cancel is on record: generation {gen} can never be sent"
        )));
    }
    send.log
        .sent(gen, group_id, "already_sent", send.poll_ms, &send.poll)
        .await?;
    Ok(Outcome::Done)
}

/// Why the send must not go, when the provider holds `held` registered
/// messages and our events say otherwise (fail closed).
fn count_mismatch(send: &Sendable, held: u64) -> Option<String> {
    let (registered, unsure) = (send.registered, send.unsure);
    if held >= registered && held <= registered + unsure {
        return None;
    }
    let expected = match unsure {
        0 => registered.to_string(),
        _ => format!(
            "{registered} (up to {} with given-up chunks)",
            registered + unsure
        ),
    };
    Some(format!(
        "provider has {held} registered messages in group {}, our events say {expected}: not sending",
        send.group_id
    ))
}

/// Refuses the send for `reason`: records `send_refused` and dead-letters
/// the item.
async fn refuse(send: &Sendable<'_>, reason: String) -> Result<Outcome, OpError> {
    let gen = send.item.gen;
    tracing::error!(batch = %send.item.batch, gen, %reason, "send refused");
    metrics::counter!("groupcast_sends_refused_total").increment(1);
    let e = Event::SendRefused(SendRefused {
        gen,
        group_id: send.group_id.clone(),
        reason: reason.clone(),
    });
    send.log.append(&event_key::refused(gen), &e).await?;
    Ok(Outcome::Dead(reason))
}

/// Claims the send, waits for what it rests on to be on disk, and sends the
/// group while the claim lasts.
async fn claim_and_send(ctx: &Ctx, send: &Sendable<'_>) -> Result<Outcome, OpError> {
    let (log, gen, group_id) = (&send.log, send.item.gen, &send.group_id);
    let claim = match decide(ctx, log, &send.window, gen, ClaimMode::Claim).await? {
        Decided::Claimed(c) => c,
        Decided::Free => {
            return Err(StoreError::UnexpectedReply {
                script: "claim_send",
                reply: "free (to a claim)".into(),
            }
            .into())
        }
        Decided::Out(o) => return Ok(o),
    };
    let ready_key = event_key::ready(gen);
    match on_disk(
        ctx,
        log,
        &[(&ready_key, &send.ready_id), (&claim.key, &claim.id)],
        || format!("generation {gen} just became ready, or its send was just claimed"),
    )
    .await?
    {
        OnDisk::Yes => {}
        OnDisk::NotYet(wait) | OnDisk::Gone(wait) => return Ok(wait),
    }
    if !send.booked_both {
        if let Some(back) = provider_slots(ctx, send.lane, 1).await? {
            return Ok(back);
        }
    }
    // The claim's lifetime: the provider call starts before it ends (cut
    // where quiet hours begin), with its transit to spare. Else the next
    // try claims again, checking the schedule anew.
    let left = claim.deadline.saturating_duration_since(Instant::now());
    if left < SEND_MARGIN {
        metrics::counter!("groupcast_send_claims_expired_total").increment(1);
        return Ok(Outcome::Retry {
            delay: Some(Duration::ZERO),
            spend: false,
            cause: RetryCause::ClaimExpired,
            reason: format!("generation {gen}'s send claim ends in {left:?}: claimed again"),
        });
    }
    let outcome = match ctx.provider.send_group(group_id).await {
        Ok(_) => "sent",
        Err(e) if e.kind() == ProviderErrorKind::AlreadySent => "already_sent",
        Err(e) => return Ok(super::provider_failed(ctx, &send.item.batch, &e).await),
    };
    if log
        .sent(gen, group_id, outcome, send.poll_ms, &send.poll)
        .await?
    {
        metrics::counter!("groupcast_groups_sent_total", "outcome" => outcome).increment(1);
        tracing::info!(batch = %send.item.batch, gen, group = %group_id, outcome, "group sent");
    }
    Ok(Outcome::Done)
}

/// The first read of a sent group's status, soon after the send: its
/// delayed entry (for `sent.lua`) and its delay in ms.
pub(crate) fn first_poll(
    ctx: &Ctx,
    lane: Priority,
    batch: &str,
    gen: u32,
    group_id: &str,
) -> (Vec<u8>, u64) {
    let first = ctx.config.next_poll(Duration::ZERO);
    let poll_ms = first.as_millis() as u64;
    let entry = DelayedEntry {
        op: Op::Poll.name().into(),
        d: crate::events::encode_payload(&WorkItem {
            batch: batch.to_string(),
            gen,
            seq: None,
            group_id: Some(group_id.to_string()),
            attempt: 0,
            since: 0,
            poll_delay_ms: poll_ms,
            cursor: None,
        }),
        c: None,
        lane,
    }
    .encode();
    (entry, poll_ms)
}

/// The least of a claim's lifetime left for the provider call to start:
/// the request's transit, so that the provider receives it before the
/// lifetime ends (before quiet hours begin).
pub(crate) const SEND_MARGIN: Duration = Duration::from_millis(500);

/// A claim granted: the send may start until `deadline`.
struct Granted {
    /// The claim's event key (`claim/<gen>`, `claim/<gen>/<n>`).
    key: String,
    /// Its entry id.
    id: String,
    /// The claim's lifetime, on this process's clock: measured from before
    /// the script was asked, so never later than the Redis instant.
    deadline: Instant,
}

/// What [`decide`] found.
enum Decided {
    /// Claimed: send before the deadline.
    Claimed(Granted),
    /// A check: the schedule lets the send go.
    Free,
    /// Held, cancelled or done: the item's outcome.
    Out(Outcome),
}

/// Asks `claim_send.lua` to check the schedule (and claim, in
/// [`ClaimMode::Claim`]) at the Redis clock. The quiet window it gets is
/// computed here with the zone database, from a Redis clock reading; when
/// the window passed meanwhile (`stale`) it is computed again.
async fn decide(
    ctx: &Ctx,
    log: &BatchLog,
    window: &SendWindow,
    gen: u32,
    mode: ClaimMode,
) -> Result<Decided, StoreError> {
    for _ in 0..3 {
        // A daily window (quiet hours or the night rule) is computed from
        // the Redis clock; without one the script needs no reading.
        let now = if window.has_quiet() {
            log.server_time_ms().await?
        } else {
            0
        };
        let args = ClaimArgs {
            gen,
            mode,
            // At least twice the margin: a shorter lifetime would never
            // leave the send room to start, and the item would retry forever.
            lifetime_ms: ctx.config.claim_lifetime.max(SEND_MARGIN * 2).as_millis() as u64,
            schedule: window.schedule_args(now),
        };
        let asked = Instant::now();
        match log.claim_send(&args).await? {
            Claim::Claimed {
                id,
                n,
                until_ms,
                now_ms,
                renewed,
            } => {
                tracing::debug!(batch = %log.batch, gen, n, renewed, until_ms, "send claimed");
                return Ok(Decided::Claimed(Granted {
                    key: crate::protocol::claim_send::claim_key(gen, i64::from(n)),
                    id,
                    deadline: asked + Duration::from_millis(until_ms.saturating_sub(now_ms)),
                }));
            }
            Claim::Free => return Ok(Decided::Free),
            Claim::Held {
                at_ms,
                reason,
                now_ms,
                given_back,
            } => {
                if given_back {
                    metrics::counter!("groupcast_send_claims_given_back_total").increment(1);
                    tracing::info!(batch = %log.batch, gen, at_ms, %reason, "send held by its schedule: claim given back");
                }
                return Ok(Decided::Out(Outcome::Retry {
                    delay: Some(Duration::from_millis(at_ms.saturating_sub(now_ms))),
                    spend: false,
                    cause: RetryCause::Scheduled,
                    reason: format!("generation {gen} is held until {at_ms} (Unix ms, {reason})"),
                }));
            }
            Claim::Stale => continue,
            Claim::Cancelled(why) => {
                tracing::info!(batch = %log.batch, gen, reason = %why, "batch cancelled before this generation's send: not sent");
                return Ok(Decided::Out(Outcome::Done));
            }
            Claim::Done => return Ok(Decided::Out(Outcome::Done)),
        }
    }
    Ok(Decided::Out(Outcome::Retry {
        delay: Some(Duration::ZERO),
        spend: false,
        cause: RetryCause::Scheduled,
        reason: format!(
            "generation {gen}'s quiet window kept passing while checked: checked again"
        ),
    }))
}
