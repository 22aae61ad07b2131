//! `claim_send.lua`: claim a generation's send before the provider is asked
//! to send it, deciding the batch's schedule (`send_at`, quiet hours) in the
//! same atomic step on the Redis clock. The claim and [`super::cancel`] are
//! linearized on the batch's state: a cancel first refuses the claim (never
//! sent); a claim first is left alone by the cancel. A call that finds the
//! batch held gives a claim in place back (`claim_given_back`), so that a
//! cancel stops the generation; in a cancelled batch (the cancel saw the
//! claim) it stops the generation itself. A claim answer grants the send
//! until `until`: `now + lifetime`, cut where quiet hours begin. A new
//! claim records its end (`send_claimed.until_ms`, `g:<gen>:until`); in a
//! cancelled batch a claim is never renewed past it: a renewal answers no
//! later end, and a call after it gives the claim back (`expired`) and stops
//! the generation.

use super::settle::{stop_generation, try_report};
use super::{entry_id, reply, BatchPolicy, Db, Run};
use crate::events::options::{hold, HoldDecision, ScheduleArgs};
use crate::events::{ClaimGivenBack, Event, SendClaimed, SendScheduled};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// What a claim call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    /// Decide the schedule and take (or renew) the claim when free.
    Claim,
    /// Decide the schedule only: record a hold, take no claim and give none
    /// back (the check before the provider's status is read).
    Check,
}

impl ClaimMode {
    /// The script's argument.
    pub fn name(self) -> &'static str {
        match self {
            ClaimMode::Claim => "claim",
            ClaimMode::Check => "check",
        }
    }
}

/// The arguments of a claim call besides the batch and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimArgs {
    /// The generation.
    pub gen: u32,
    /// Claim or check.
    pub mode: ClaimMode,
    /// How long a claim lets the send start (ms).
    pub lifetime_ms: u64,
    /// The schedule, as the worker computed it.
    pub schedule: ScheduleArgs,
}

impl ClaimArgs {
    /// A claim of generation `gen`'s send in a batch without a schedule,
    /// valid for a minute (operators' tools and tests).
    pub fn unscheduled(gen: u32) -> ClaimArgs {
        ClaimArgs {
            gen,
            mode: ClaimMode::Claim,
            lifetime_ms: 60_000,
            schedule: ScheduleArgs::default(),
        }
    }
}

/// `claim_send.lua` at Redis time `now` (ms). Returns `claimed, entry id,
/// until, now, n, new|renewed`, `free, now`, `held, at, reason, now, given back
/// 0|1`, `stale, now`, `cancelled, reason` or `done` (sent, done, or its
/// send given up).
pub fn claim_send(
    db: &mut Db,
    batch: &str,
    policy: &BatchPolicy,
    a: &ClaimArgs,
    now: u64,
) -> Vec<String> {
    let gen = a.gen;
    let mut r = Run::new(db, batch);
    let found = Found::read(&r, gen);
    if let (false, Some(reason)) = (found.live, &found.cancelled) {
        return reply(["cancelled", reason]);
    }
    // Sent, done, or its send given up (`give_up_send`): never claimed again.
    if r.get(&field::key(&event_key::send(gen))).is_some()
        || r.get(&gk(gen, generation::DONE)).is_some()
        || r.get(&gk(gen, generation::GIVEN_UP)).is_some()
    {
        return reply(["done"]);
    }
    // A claim in place in a cancelled batch lives no longer than it was
    // given: past its end its send never started (a send starts within its
    // claim's lifetime, and the caller has just read the group unsent), so
    // it is given back and its generation stopped, as the cancel would
    // have; before its end a renewal does not extend it.
    let granted = r
        .get(&field::claim_until(gen))
        .and_then(|v| v.parse::<u64>().ok());
    let bound =
        granted.filter(|_| found.live && found.cancelled.is_some() && a.mode == ClaimMode::Claim);
    let until = match schedule(bound, now, a) {
        HoldDecision::Stale => return reply(["stale", &now.to_string()]),
        HoldDecision::Free { until } => bound.map_or(until, |end| until.min(end)),
        HoldDecision::Held { at, reason } => {
            return held(&mut r, policy, a, found, at, reason, now)
        }
    };
    if a.mode != ClaimMode::Claim {
        return reply(["free", &now.to_string()]);
    }
    grant(&mut r, gen, found, until, now)
}

/// A field of generation `gen` in the state: `g:<gen>:<f>`.
fn gk(gen: u32, f: &str) -> String {
    field::gen(gen, f)
}

/// What a claim call finds in the state: the claim in place and the
/// batch's cancel.
struct Found {
    /// The number of the last claim taken (given back or not).
    n: i64,
    /// Whether claim `n` is in place (not given back).
    live: bool,
    /// Its event's entry id, when in place.
    claim_id: Option<String>,
    /// The cancel's reason, when the batch was cancelled.
    cancelled: Option<String>,
}

impl Found {
    /// Reads generation `gen`'s claim and the batch's cancel.
    fn read(r: &Run, gen: u32) -> Found {
        let mut n = r.num(&gk(gen, generation::CLAIMED));
        let mut live = n > r.num(&gk(gen, generation::GIVEN_BACK));
        // The claim in place, by its event's key; a state that lost that key (a
        // write Redis lost) holds no claim: it is taken again under the same
        // number.
        let mut claim_id = None;
        if live {
            claim_id = r.get(&field::key(&claim_key(gen, n)));
            if claim_id.is_none() {
                (live, n) = (false, n - 1);
            }
        }
        Found {
            n,
            live,
            claim_id,
            cancelled: r.get(field::CANCELLED),
        }
    }
}

/// The schedule at `now`: held when a bound claim (`bound`, its end) has
/// expired, else as the batch's schedule says.
fn schedule(bound: Option<u64>, now: u64, a: &ClaimArgs) -> HoldDecision {
    match bound {
        Some(end) if now >= end => HoldDecision::Held {
            at: end,
            reason: "expired",
        },
        _ => hold(now, a.lifetime_ms, &a.schedule),
    }
}

/// The batch is held until `at` for `reason`: records the hold once, and a
/// claim call gives the claim in place back (stopping the generation in a
/// cancelled batch).
fn held(
    r: &mut Run,
    policy: &BatchPolicy,
    a: &ClaimArgs,
    found: Found,
    at: u64,
    reason: &str,
    now: u64,
) -> Vec<String> {
    let (gen, n) = (a.gen, found.n);
    let group = r.get(&gk(gen, generation::GROUP));
    if reason != "expired" && r.get(&field::key(&event_key::schedule(gen))).is_none() {
        r.emit(
            &event_key::schedule(gen),
            Event::SendScheduled(SendScheduled {
                gen,
                group_id: group.clone().unwrap_or_default(),
                at_ms: at,
                reason: reason.into(),
            }),
            true,
        );
        r.put(gk(gen, generation::SCHEDULED_AT), at);
    }
    // Only a claim gives a claim back: the worker claims after it
    // read the provider's status (a send whose answer was lost is
    // told from one never started); a check comes before that read.
    if !found.live || a.mode != ClaimMode::Claim {
        r.flush();
        return reply(["held", &at.to_string(), reason, &now.to_string(), "0"]);
    }
    let stopping = found.cancelled.is_some();
    let unsent = if stopping {
        r.num(&gk(gen, generation::REGISTERED))
    } else {
        0
    };
    r.emit(
        &event_key::back(gen, n),
        Event::ClaimGivenBack(ClaimGivenBack {
            gen,
            n: n as u32,
            at_ms: at,
            reason: reason.into(),
            stopped: stopping,
            unsent: unsent as u64,
        }),
        true,
    );
    r.put(gk(gen, generation::GIVEN_BACK), n);
    let Some(why) = found.cancelled else {
        r.flush();
        return reply(["held", &at.to_string(), reason, &now.to_string(), "1"]);
    };
    let closed = r.get(&gk(gen, generation::CLOSED)).is_some();
    let (c, recipients) = (
        r.num(&gk(gen, generation::CHUNKS)),
        r.num(&gk(gen, generation::RECIPIENTS)),
    );
    stop_generation(r, gen, closed, group, c, recipients);
    r.flush();
    r.incr("stopped", 1);
    r.incr("unsent", unsent);
    r.incr("done", 1);
    r.incr("sent_success", 0);
    r.incr("sent_failed", 0);
    try_report(r, policy);
    reply(["cancelled", &why])
}

/// The send may go until `until`: renews the claim in place, or takes a
/// new one.
fn grant(r: &mut Run, gen: u32, found: Found, until: u64, now: u64) -> Vec<String> {
    let until_ms = until;
    let (until, now) = (until.to_string(), now.to_string());
    if let (true, Some(id)) = (found.live, &found.claim_id) {
        return reply(["claimed", id, &until, &now, &found.n.to_string(), "renewed"]);
    }
    let n = found.n + 1;
    let id = r.emit(
        &claim_key(gen, n),
        Event::SendClaimed(SendClaimed {
            gen,
            n: (n > 1).then_some(n as u32),
            until_ms: Some(until_ms),
        }),
        true,
    );
    r.put(field::claim_until(gen), until_ms);
    r.put(gk(gen, generation::CLAIMED), n);
    r.flush();
    reply([
        "claimed",
        &entry_id(id),
        &until,
        &now,
        &n.to_string(),
        "new",
    ])
}

/// The event key of claim `n` of generation `gen`: `claim/<gen>` for the
/// first, `claim/<gen>/<n>` after.
pub fn claim_key(gen: u32, n: i64) -> String {
    if n <= 1 {
        event_key::claim(gen)
    } else {
        event_key::claim_again(gen, n)
    }
}
