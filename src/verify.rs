//! Checks the invariants for a batch, from our event log and, when a
//! provider client is given, from the provider's own view of each group:
//! the six safety invariants, and the seventh's truthful report (its
//! outcome and counts agree with the events; a reported batch has its
//! tombstone). A cancelled batch: no generation is sent after the cancel
//! unless its send was claimed before it, the generations it stopped are
//! never sent, and the report says `cancelled`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::events::{Chunk, Event, Recorded};
use crate::projection::Projection;
use crate::provider::{GroupStatus, ProviderClient};
use crate::seq_ranges::{covered, missing_ranges, Missing};
use crate::store::{Store, StoreResult};

/// One check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The invariant (1-7, or 0 for the log's own integrity).
    pub invariant: u8,
    /// Whether it held.
    pub ok: bool,
    /// What was checked, or what broke.
    pub detail: String,
}

/// Every check of one batch.
#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    /// The batch.
    pub batch: String,
    /// Whether the batch has reported.
    pub reported: bool,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Verification {
    /// Whether every check held.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
    /// The failed checks.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// A chunk's `chunk_loaded` event, as the checks need it.
#[derive(Debug, Clone)]
struct Loaded {
    /// Where the event stands in the batch's log.
    index: usize,
    /// The group it was loaded into.
    group_id: String,
    /// Recipients the provider registered.
    registered: u32,
    /// Recipients listed as registration failures.
    failed: usize,
    /// Whether the chunk was given up on (its registration unknown).
    given_up: bool,
}

/// What one generation's events say.
#[derive(Debug, Default)]
struct Gen {
    created: Vec<String>,
    discarded: Vec<String>,
    /// seq → recipients assigned.
    assigned: BTreeMap<u32, u32>,
    loaded: BTreeMap<u32, Loaded>,
    /// Where each `send_triggered` stands in the log.
    sends: Vec<usize>,
    refused: Vec<String>,
    closed: bool,
    /// Done with nobody to send to (status `empty`): never sent.
    empty: bool,
    /// Where its first `send_claimed` stands in the log.
    claim: Option<usize>,
    /// Every claim: its number and place in the log.
    claims: Vec<(u32, usize)>,
    /// Claims given back (`claim_given_back`): number → place in the log.
    backs: BTreeMap<u32, usize>,
    /// Stopped by a cancel (done with status `cancelled`): never sent.
    cancelled: bool,
    /// Its creation was given up (`generation_failed`): it has no group,
    /// and its chunks are loaded into none, as given up.
    failed: bool,
    /// Done after its send was given up (`give_up_send.lua`): `unsent`
    /// (never went out, its group deleted) or `unknown` (whether, or how,
    /// it went out is unknown).
    given_up: Option<String>,
}

impl Gen {
    /// The group the generation kept (the first one recorded).
    fn kept(&self) -> Option<&String> {
        self.created.first()
    }
    /// Done `unsent`: never went out.
    fn unsent(&self) -> bool {
        self.given_up.as_deref() == Some("unsent")
    }
    /// Recipients registered, as our events say.
    fn registered(&self) -> u64 {
        self.loaded.values().map(|l| u64::from(l.registered)).sum()
    }
    /// Recipients of given-up chunks: the provider may hold some of them.
    fn unsure(&self) -> u64 {
        self.loaded
            .values()
            .filter(|l| l.given_up)
            .map(|l| l.failed as u64)
            .sum()
    }
}

/// A batch's events, tallied per generation: what the checks read.
#[derive(Debug, Default)]
struct Tally {
    gens: BTreeMap<u32, Gen>,
    reports: usize,
    /// Keys of `input_rejected` events.
    rejected: BTreeSet<String>,
    /// Recipients of every assigned chunk (first copies only).
    recipients: u64,
    /// Copies of numbers the batch already had, by the assignments.
    duplicates: u64,
    /// Seqs refused for good (holes), not assigned later.
    holes: BTreeSet<u32>,
    /// The close, if any: its missing seqs (ranges and counts).
    closed: Option<Missing>,
    /// The report decided, if any.
    report: Option<crate::events::BatchReported>,
    /// Where the `batch_cancelled` stands in the log, if the batch was
    /// cancelled.
    cancelled: Option<usize>,
    /// Events appended after the report other than what may follow it
    /// (the report's delivery, the deletion of a group a cancel or a
    /// give-up stopped): (key, type).
    after_report: Vec<(String, &'static str)>,
}

impl Tally {
    /// Folds a batch's events.
    fn of(events: &[Recorded]) -> Tally {
        let mut t = Tally::default();
        for (i, r) in events.iter().enumerate() {
            let may_follow = matches!(
                r.event,
                Event::ReportDelivered(_)
                    | Event::GroupDiscarded(_)
                    | Event::BatchReported(_)
                    // An operator's purge or redrive of a dead letter: no work.
                    | Event::DeadLetterHandled(_)
                    // The delivery results of what was sent.
                    | Event::GenerationDelivered(_)
                    | Event::BatchDelivered(_)
            );
            if t.reported() && !may_follow {
                t.after_report.push((r.key.clone(), r.event.type_name()));
            }
            match &r.event {
                Event::ChunkAssigned(e) => {
                    t.gen(e.gen).assigned.insert(e.seq, e.count);
                    t.recipients += u64::from(e.count);
                    t.duplicates += e.duplicates.len() as u64;
                    t.holes.remove(&e.seq);
                }
                Event::BatchClosed(e) => t.closed = Some(e.missing_seqs()),
                Event::GroupCreated(e) => t.gen(e.gen).created.push(e.group_id.clone()),
                Event::GenerationFailed(e) => t.gen(e.gen).failed = true,
                Event::GroupDiscarded(e) => t.gen(e.gen).discarded.push(e.group_id.clone()),
                Event::ChunkLoaded(e) => {
                    let loaded = Loaded {
                        index: i,
                        group_id: e.group_id.clone(),
                        registered: e.registered,
                        failed: e.failed.len(),
                        given_up: e.given_up.is_some(),
                    };
                    t.gen(e.gen).loaded.insert(e.seq, loaded);
                }
                Event::SendTriggered(e) => t.gen(e.gen).sends.push(i),
                Event::SendRefused(e) => t.gen(e.gen).refused.push(e.reason.clone()),
                Event::GenerationClosed(e) => t.gen(e.gen).closed = true,
                Event::GroupCompleted(e) if e.status == "empty" => t.gen(e.gen).empty = true,
                Event::GroupCompleted(e) if e.status == "cancelled" => {
                    t.gen(e.gen).cancelled = true
                }
                Event::GroupCompleted(e) if e.status == "unsent" || e.status == "unknown" => {
                    t.gen(e.gen).given_up = Some(e.status.clone())
                }
                Event::SendClaimed(e) => {
                    let g = t.gen(e.gen);
                    g.claim.get_or_insert(i);
                    g.claims.push((e.n.unwrap_or(1), i));
                }
                Event::ClaimGivenBack(e) => {
                    t.gen(e.gen).backs.insert(e.n, i);
                }
                Event::BatchCancelled(_) => {
                    t.cancelled.get_or_insert(i);
                }
                Event::BatchReported(e) => {
                    t.reports += 1;
                    t.report.get_or_insert_with(|| e.clone());
                }
                Event::InputRejected(e) => {
                    t.rejected.insert(r.key.clone());
                    if let (true, Some(seq)) = (e.hole, e.seq) {
                        t.holes.insert(seq);
                    }
                }
                _ => {}
            }
        }
        t
    }

    fn gen(&mut self, gen: u32) -> &mut Gen {
        self.gens.entry(gen).or_default()
    }

    fn reported(&self) -> bool {
        self.reports > 0
    }
}

/// Collects checks.
#[derive(Default)]
struct Checks(Vec<Check>);

impl Checks {
    fn check(&mut self, invariant: u8, ok: bool, detail: impl Into<String>) {
        self.0.push(Check {
            invariant,
            ok,
            detail: detail.into(),
        });
    }
}

/// The log's own integrity: everything decodes, no write was lost, the live
/// state equals its replay.
fn log_checks(
    c: &mut Checks,
    undecodable: usize,
    decoded: usize,
    lost: &[(String, String)],
    diff: &[String],
) {
    c.check(
        0,
        undecodable == 0,
        format!(
            "{} events, {undecodable} undecodable",
            decoded + undecodable
        ),
    );
    c.check(
        0,
        lost.is_empty(),
        if lost.is_empty() {
            "no lost Redis writes were detected for this batch".into()
        } else {
            format!(
                "Redis lost acknowledged writes of this batch, so its events may not show \
                 everything the provider did (a second group for a generation, a send): {}",
                lost.iter()
                    .map(|(id, d)| format!("[{id}] {d}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        },
    );
    c.check(
        0,
        diff.is_empty(),
        if diff.is_empty() {
            "live state equals its replay".into()
        } else {
            format!("live state differs from replay: {}", diff.join("; "))
        },
    );
}

/// Invariants 1, 2, 3 and 6 of one generation, from our events alone.
/// `cancel_at`: where the batch's cancel stands in its log, if it was
/// cancelled.
fn generation_checks(
    c: &mut Checks,
    g: u32,
    st: &Gen,
    cap: u64,
    reported: bool,
    cancel_at: Option<usize>,
) {
    // 1. One group per generation.
    one_group_checks(c, g, st);
    // 2. Sent once, only when fully loaded.
    send_checks(c, g, st, reported);
    cancel_checks(c, g, st, cancel_at);
    // 3. Loaded once, into the generation's own group.
    load_checks(c, g, st);
    // 6. The cap.
    let n: u64 = st.assigned.values().map(|c| u64::from(*c)).sum();
    c.check(
        6,
        n <= cap,
        format!("gen {g}: {n} recipients assigned, cap {cap}"),
    );
}

/// Invariant 1 of generation `g`: one group, and the kept one never
/// discarded.
fn one_group_checks(c: &mut Checks, g: u32, st: &Gen) {
    let kept = st.kept();
    c.check(
        1,
        st.created.len() <= 1,
        format!("gen {g}: {} group(s) recorded", st.created.len()),
    );
    // (A cancel deletes the group of a generation it stopped; a send given
    // up before it went out deletes its group too.)
    c.check(
        1,
        st.cancelled || st.unsent() || st.discarded.iter().all(|d| Some(d) != kept),
        format!("gen {g}: the kept group was never discarded"),
    );
}

/// Invariant 2 of generation `g`: sent once, only when fully loaded
/// (`reported`: whether its batch was reported).
fn send_checks(c: &mut Checks, g: u32, st: &Gen, reported: bool) {
    c.check(
        2,
        st.sends.len() <= 1,
        format!("gen {g}: {} send event(s)", st.sends.len()),
    );
    // A refused send (the provider's count disagreed with our events)
    // leaves the generation unsent: never a pass.
    c.check(
        2,
        st.refused.is_empty(),
        if st.refused.is_empty() {
            format!("gen {g}: no send refused")
        } else {
            format!("gen {g}: send refused: {}", st.refused.join("; "))
        },
    );
    if let Some(&send_at) = st.sends.first() {
        let all_loaded_before = st.closed
            && st
                .assigned
                .keys()
                .all(|s| st.loaded.get(s).is_some_and(|l| l.index < send_at));
        c.check(
            2,
            all_loaded_before,
            format!("gen {g}: closed and every assigned chunk loaded before the send"),
        );
    } else if reported && !st.empty && !st.cancelled && st.given_up.is_none() {
        c.check(
            2,
            false,
            format!("gen {g}: batch reported but generation never sent"),
        );
    }
    // A send given up and done `unsent` never went out.
    if st.unsent() {
        c.check(
            2,
            st.sends.is_empty(),
            format!(
                "gen {g}: its send given up and counted unsent, and never sent ({} send event(s))",
                st.sends.len()
            ),
        );
    }
    if st.empty {
        c.check(
            2,
            st.sends.is_empty() && st.registered() == 0,
            format!("gen {g}: done with nobody registered, and not sent"),
        );
    }
}

/// Invariant 2 of generation `g` in a cancelled batch (`cancel_at`: where
/// the cancel stands in its log).
fn cancel_checks(c: &mut Checks, g: u32, st: &Gen, cancel_at: Option<usize>) {
    // A cancel: a generation it stopped is never sent, and holds no claim
    // (every claim it had was given back); one sent after it had its send
    // claimed before it, and that claim still in place at the cancel.
    let held_at = |at: usize| {
        st.claims
            .iter()
            .any(|(n, i)| *i < at && st.backs.get(n).is_none_or(|b| *b > at))
    };
    if st.cancelled {
        let in_place = st.claims.iter().any(|(n, _)| !st.backs.contains_key(n));
        c.check(
            2,
            cancel_at.is_some() && st.sends.is_empty() && !in_place,
            format!(
                "gen {g}: stopped by a cancel, never sent and no claim in place ({} send(s), claims {:?}, given back {:?})",
                st.sends.len(),
                st.claims,
                st.backs
            ),
        );
    }
    if let Some(at) = cancel_at {
        let late: Vec<usize> = st.sends.iter().copied().filter(|&s| s > at).collect();
        let claimed_before = held_at(at);
        c.check(
            2,
            late.is_empty() || claimed_before,
            format!(
                "gen {g}: no send after the cancel without a claim before it (sends at {:?}, claim at {:?}, cancel at {at})",
                st.sends, st.claim
            ),
        );
    }
}

/// Invariant 3 of generation `g`: each chunk loaded once, into the
/// generation's own group.
fn load_checks(c: &mut Checks, g: u32, st: &Gen) {
    let kept = st.kept();
    // (A chunk of copies only adds nobody: it names no group; nor does a
    // chunk given up because its generation's creation was.)
    let given_up_without_group =
        |l: &Loaded| st.failed && kept.is_none() && l.group_id.is_empty() && l.registered == 0;
    let wrong_group: Vec<u32> = st
        .loaded
        .iter()
        .filter(|(_, l)| l.registered > 0 || l.failed > 0)
        .filter(|(_, l)| !given_up_without_group(l))
        .filter(|(_, l)| Some(&l.group_id) != kept)
        .map(|(s, _)| *s)
        .collect();
    c.check(
        3,
        wrong_group.is_empty(),
        format!("gen {g}: every chunk loaded into the kept group (wrong: {wrong_group:?})"),
    );
    let unassigned: Vec<&u32> = st
        .loaded
        .keys()
        .filter(|s| !st.assigned.contains_key(s))
        .collect();
    c.check(
        3,
        unassigned.is_empty(),
        format!("gen {g}: only assigned chunks loaded (stray: {unassigned:?})"),
    );
}

/// What the provider says about one generation's groups.
struct ProviderView {
    /// The kept group, or why it could not be read.
    kept: Result<crate::provider::Group, String>,
    /// Each discarded group, and whether the provider has it deleted.
    discarded_gone: Vec<(String, bool)>,
}

/// Invariants 1, 2, 3 and 6 of one generation against the provider's view.
fn provider_checks(c: &mut Checks, g: u32, st: &Gen, view: &ProviderView, cap: u64) {
    let group_id = st.kept().map(String::as_str).unwrap_or("?");
    match &view.kept {
        Ok(group) => {
            let ours = st.registered();
            let theirs = group.count.registered_success;
            // Given-up chunks may have registered some recipients first.
            let within = theirs >= ours && theirs <= ours + st.unsure();
            c.check(
                3,
                within || st.sends.is_empty(),
                format!(
                    "gen {g}: provider registered {theirs} in {group_id}, our events {ours} (+ up to {} given up)",
                    st.unsure()
                ),
            );
            c.check(
                6,
                theirs <= cap,
                format!("gen {g}: provider holds {theirs} (cap {cap})"),
            );
            if !st.sends.is_empty() {
                c.check(
                    2,
                    group.status != GroupStatus::Pending,
                    format!("gen {g}: provider status {:?} after our send", group.status),
                );
            } else if st.given_up.as_deref() != Some("unknown") {
                // Only we send our groups: one sent without a send event
                // means events were lost (or a send is being recorded right
                // now). (A send given up with its outcome unknown may have
                // gone out: that is what `unknown` says.)
                c.check(
                    2,
                    matches!(group.status, GroupStatus::Pending | GroupStatus::Deleted),
                    format!(
                        "gen {g}: provider status {:?} of {group_id}, and no send event",
                        group.status
                    ),
                );
            }
        }
        Err(e) => c.check(
            3,
            false,
            format!("gen {g}: cannot read group {group_id} at the provider: {e}"),
        ),
    }
    for (d, gone) in &view.discarded_gone {
        c.check(
            1,
            *gone,
            format!("gen {g}: losing group {d} is deleted at the provider"),
        );
    }
}

/// Invariants 4, 5 and 7 of the whole batch. `last` is the batch's last
/// seq as its state says; `stream_reports` the entries in the reports stream
/// (when reported); `dead` the dead letters of the batch's chunks;
/// `tombstoned` whether the batch's id is remembered as reported.
fn batch_checks(
    c: &mut Checks,
    t: &Tally,
    last: Option<u32>,
    stream_reports: usize,
    dead: usize,
    tombstoned: bool,
) {
    // 4. One report decision, and one entry in the reports stream.
    c.check(4, t.reports <= 1, format!("{} report event(s)", t.reports));
    if t.reported() {
        c.check(
            4,
            stream_reports == 1,
            format!("{stream_reports} entr(ies) in the reports stream"),
        );
        nothing_lost_checks(c, t, last);
        // 7. The report tells the truth.
        if let Some(r) = &t.report {
            report_checks(c, t, last, r);
        }
        c.check(7, tombstoned, "a reported batch is remembered (tombstone)");
        // Nothing after the end: no chunk, park, create, send or other
        // record of work follows the report.
        c.check(
            7,
            t.after_report.is_empty(),
            if t.after_report.is_empty() {
                "no event after the report but its delivery".to_string()
            } else {
                format!("events after the report: {:?}", t.after_report)
            },
        );
    }
    c.check(
        5,
        dead >= t.rejected.len(),
        format!(
            "{} rejected input(s), {dead} dead letter(s) for the batch",
            t.rejected.len()
        ),
    );
}

/// Invariant 5 of a reported batch: nothing lost.
fn nothing_lost_checks(c: &mut Checks, t: &Tally, last: Option<u32>) {
    // 5. Nothing lost: every seq up to the last (or, closed without
    // one, the highest seen) is assigned, refused for good, or given up
    // by the close; every recipient registered or a listed failure.
    // As ranges: the work is proportional to the seqs that arrived,
    // never to the highest one.
    let present: Vec<u32> = t
        .gens
        .values()
        .flat_map(|g| g.assigned.keys())
        .chain(&t.holes)
        .copied()
        .collect();
    let top = last.or_else(|| {
        let c = t.closed.as_ref()?;
        let listed = c.ranges.last().map(|r| r[1]);
        present.iter().copied().chain(listed).max()
    });
    let gaps = missing_ranges(present, top, usize::MAX);
    // Given up by the close: no more seqs than it counted, and within
    // its ranges when it listed them all.
    let given_up = match &t.closed {
        None => gaps.is_empty(),
        Some(c) => {
            gaps.count <= c.count
                && (c.ranges_total > c.ranges.len() as u64 || covered(&gaps.ranges, &c.ranges))
        }
    };
    // A cancel gives up on whatever had not arrived.
    c.check(
        5,
        t.cancelled.is_some() || ((top.is_some() || t.gens.is_empty()) && given_up),
        format!(
            "every seq 0..={top:?} assigned, refused or given up (not: {} seq(s), {:?}...)",
            gaps.count,
            &gaps.ranges[..gaps.ranges.len().min(10)]
        ),
    );
    let accounted: u64 = t
        .gens
        .values()
        .flat_map(|g| g.loaded.values())
        .map(|l| u64::from(l.registered) + l.failed as u64)
        .sum();
    // A cancel stops the loading of generations it stopped: their
    // recipients not loaded yet are neither registered nor failed.
    c.check(
        5,
        accounted == t.recipients || (t.cancelled.is_some() && accounted <= t.recipients),
        format!(
            "{accounted} of {} recipients registered or listed as failures",
            t.recipients
        ),
    );
}

/// What the events count of a reported batch, as its report should.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counted {
    registered: u64,
    failed: u64,
    missing: u64,
    rejected: u64,
    unsent: u64,
    unknown: u64,
    stopped: u32,
}

impl Counted {
    /// The counts of the events tallied in `t`.
    fn of(t: &Tally) -> Counted {
        let registered: u64 = t.gens.values().map(Gen::registered).sum();
        let failed: u64 = t
            .gens
            .values()
            .flat_map(|g| g.loaded.values())
            .map(|l| l.failed as u64)
            .sum();
        let registered_in = |f: fn(&Gen) -> bool| -> u64 {
            t.gens.values().filter(|g| f(g)).map(Gen::registered).sum()
        };
        let stopped = match t.cancelled {
            Some(_) => t.gens.values().filter(|g| g.cancelled).count() as u32,
            None => 0,
        };
        Counted {
            registered,
            failed,
            missing: t.closed.as_ref().map_or(0, |c| c.count),
            rejected: t.rejected.len() as u64,
            unsent: registered_in(|g| g.cancelled || g.unsent()),
            unknown: registered_in(|g| g.given_up.as_deref() == Some("unknown")),
            stopped,
        }
    }

    /// The outcome these counts make (`last`: the batch's last seq, if
    /// known; `cancelled`: whether it was cancelled).
    fn outcome(&self, last: Option<u32>, cancelled: bool) -> &'static str {
        if cancelled {
            "cancelled"
        } else if self.registered == self.unsent {
            "failed"
        } else if self.failed == 0
            && self.rejected == 0
            && self.missing == 0
            && self.unsent == 0
            && self.unknown == 0
            && last.is_some()
        {
            "completed"
        } else {
            "partial"
        }
    }
}

/// Invariant 7 of a reported batch: report `r` tells what the events say.
fn report_checks(c: &mut Checks, t: &Tally, last: Option<u32>, r: &crate::events::BatchReported) {
    let n = Counted::of(t);
    let expected = n.outcome(last, t.cancelled.is_some());
    c.check(
        7,
        r.outcome == expected,
        format!(
            "report outcome {:?}, the counts say {expected:?}",
            r.outcome
        ),
    );
    let counts = (r.registered, r.failed, r.duplicates, r.rejected, r.missing);
    let ours = (n.registered, n.failed, t.duplicates, n.rejected, n.missing);
    c.check(
        7,
        counts == ours,
        format!(
            "report (registered, failed, duplicates, rejected, missing) {counts:?}, events {ours:?}"
        ),
    );
    c.check(
        7,
        r.failed_by_reason.values().sum::<u64>() == r.failed,
        format!("failures by reason add up to {}", r.failed),
    );
    let ours = (n.stopped, n.unsent, n.unknown);
    c.check(
        7,
        (r.stopped, r.unsent, r.unknown) == ours,
        format!(
            "report (stopped, unsent, unknown) {:?}, events {ours:?}",
            (r.stopped, r.unsent, r.unknown)
        ),
    );
}

/// Verifies a batch. `cap` is the group cap the workers ran with.
///
/// Reads the batch's log, its live state, the lost-write witness, its
/// reports and dead letters and (with a provider) each group; the checks
/// themselves are pure functions of what was read.
pub async fn verify_batch(
    store: &Store,
    provider: Option<&ProviderClient>,
    batch: &str,
    cap: u64,
) -> StoreResult<Verification> {
    let log = store.batch(batch);
    let mut c = Checks::default();

    // The events and the live state as of one moment: delivery tracking
    // goes on appending after the report, so the state is read between two
    // looks at the stream's length, and read again if an event came between.
    let (raw, live) = {
        let mut attempt = 0;
        loop {
            let raw = log.events().await?;
            let live = log.state().await?;
            let now = store.stream_len(&log.keys.events).await?;
            attempt += 1;
            if now == raw.len() as u64 || attempt == 5 {
                break (raw, live);
            }
        }
    };
    let undecodable = raw.iter().filter(|r| r.is_err()).count();
    let events: Vec<Recorded> = raw.into_iter().filter_map(Result::ok).collect();
    let lost = crate::store::durability::witness::lost_records(store, batch).await?;
    let diff = live.diff(&Projection::fold(&events));
    log_checks(&mut c, undecodable, events.len(), &lost, &diff);

    let tally = Tally::of(&events);
    for (g, st) in &tally.gens {
        generation_checks(&mut c, *g, st, cap, tally.reported(), tally.cancelled);
        if let (Some(p), Some(kept)) = (provider, st.kept()) {
            let view = provider_view(p, kept, &st.discarded).await;
            provider_checks(&mut c, *g, st, &view, cap);
        }
    }
    let stream_reports = if tally.reported() {
        count_reports(store, batch).await?
    } else {
        0
    };
    let dead = count_dead_letters(store, batch).await?;
    if tally.reported() {
        // Recipient data lives in the events (which expire with the batch),
        // while a generation waits for its group in its parked hash, and
        // until the report in the batch-wide dedupe hash and bitmap: none
        // may outlive the report.
        let gens = tally.gens.keys().max().map_or(0, |g| g + 1);
        let left = log.recipient_data_left(gens).await?;
        c.check(
            7,
            left.is_empty(),
            format!("no recipient data left outside the events after the report (keys {left:?})"),
        );
    }
    let tombstoned = tally.reported() && store.is_tombstoned(batch).await?;
    batch_checks(
        &mut c,
        &tally,
        live.last_seq(),
        stream_reports,
        dead,
        tombstoned,
    );

    Ok(Verification {
        batch: batch.to_string(),
        reported: tally.reported(),
        checks: c.0,
    })
}

/// Reads a generation's kept group and its discarded ones at the provider.
async fn provider_view(p: &ProviderClient, kept: &str, discarded: &[String]) -> ProviderView {
    let mut discarded_gone = Vec::new();
    for d in discarded {
        let gone = match get_group(p, d).await {
            Ok(grp) => grp.status == GroupStatus::Deleted,
            Err(e) => e.status() == Some(404),
        };
        discarded_gone.push((d.clone(), gone));
    }
    ProviderView {
        kept: get_group(p, kept).await.map_err(|e| e.to_string()),
        discarded_gone,
    }
}

/// Reads a group, trying transient failures again (a flaky provider must not
/// fail a verification).
async fn get_group(
    p: &ProviderClient,
    id: &str,
) -> Result<crate::provider::Group, crate::provider::ProviderError> {
    let mut attempt = 0;
    loop {
        match p.get_group(id).await {
            Err(e) if e.is_retryable() && attempt < 8 => {
                attempt += 1;
                let wait = e
                    .retry_after()
                    .unwrap_or(std::time::Duration::from_millis(50 << attempt.min(5)));
                tokio::time::sleep(wait).await;
            }
            other => return other,
        }
    }
}

async fn count_reports(store: &Store, batch: &str) -> StoreResult<usize> {
    let stream = store.keys.reports(store.keys.shard_of(batch));
    Ok(store
        .entries(&stream)
        .await?
        .iter()
        .filter(|e| e.get("batch") == Some(batch.as_bytes()) && !e.is_delivery_report())
        .count())
}

/// Dead letters whose original entry is a chunk of `batch`.
pub async fn count_dead_letters(store: &Store, batch: &str) -> StoreResult<usize> {
    let stream = store.keys.dead_letters(store.keys.shard_of(batch));
    Ok(store
        .entries(&stream)
        .await?
        .iter()
        .filter(|e| {
            e.get("f:d")
                .and_then(|d| Chunk::decode(d).ok())
                .is_some_and(|c| c.batch == batch)
        })
        .count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{
        ChunkAssigned, ChunkLoaded, GenerationClosed, GroupCreated, GroupDiscarded, SendTriggered,
    };

    fn rec(key: &str, event: Event) -> Recorded {
        Recorded {
            id: String::new(),
            key: key.into(),
            event,
        }
    }
    fn assigned(gen: u32, seq: u32, count: u32) -> Recorded {
        rec(
            &format!("assign/{seq}"),
            Event::ChunkAssigned(ChunkAssigned {
                seq,
                gen,
                count,
                last: false,
                digest: String::new(),
                duplicates: Vec::new(),
                opts: None,
            }),
        )
    }
    fn created(gen: u32, group_id: &str) -> Recorded {
        rec(
            &format!("group/{gen}"),
            Event::GroupCreated(GroupCreated {
                gen,
                group_id: group_id.into(),
            }),
        )
    }
    fn loaded(gen: u32, seq: u32, group_id: &str, registered: u32) -> Recorded {
        rec(
            &format!("loaded/{gen}/{seq}"),
            Event::ChunkLoaded(ChunkLoaded {
                gen,
                seq,
                group_id: group_id.into(),
                registered,
                duplicates: 0,
                failed: Vec::new(),
                given_up: None,
            }),
        )
    }
    fn closed(gen: u32) -> Recorded {
        rec(
            &format!("close/{gen}"),
            Event::GenerationClosed(GenerationClosed {
                gen,
                reason: "final".into(),
                chunks: 0,
                recipients: 0,
            }),
        )
    }
    fn sent(gen: u32, group_id: &str) -> Recorded {
        rec(
            &format!("send/{gen}"),
            Event::SendTriggered(SendTriggered {
                gen,
                group_id: group_id.into(),
                outcome: "sent".into(),
            }),
        )
    }

    /// A whole generation, in the order the pipeline writes it.
    fn good() -> Vec<Recorded> {
        vec![
            assigned(0, 0, 3),
            assigned(0, 1, 2),
            created(0, "G1"),
            loaded(0, 0, "G1", 3),
            loaded(0, 1, "G1", 2),
            closed(0),
            sent(0, "G1"),
        ]
    }

    /// The failed checks' invariants, after every check of the log.
    fn failing(events: &[Recorded], cap: u64, reported: bool, last: Option<u32>) -> Vec<u8> {
        let mut t = Tally::of(events);
        if reported {
            t.reports = 1;
        }
        let mut c = Checks::default();
        for (g, st) in &t.gens {
            generation_checks(&mut c, *g, st, cap, t.reported(), t.cancelled);
        }
        batch_checks(&mut c, &t, last, usize::from(reported), 0, true);
        c.0.iter().filter(|c| !c.ok).map(|c| c.invariant).collect()
    }

    #[test]
    fn an_event_after_the_report_breaks_invariant_7() {
        let mut e = good();
        e.push(rec(
            "report",
            Event::BatchReported(crate::events::BatchReported {
                outcome: "completed".into(),
                generations: 1,
                chunks: 2,
                recipients: 5,
                registered: 5,
                sent_success: 5,
                ..Default::default()
            }),
        ));
        // Its delivery, and a deletion, may follow it.
        e.push(rec(
            "delivered",
            Event::ReportDelivered(crate::events::ReportDelivered {
                status: 200,
                report: None,
            }),
        ));
        assert_eq!(failing(&e, 5, true, Some(1)), Vec::<u8>::new());
        // A chunk parked (work asked of the provider) after it may not.
        e.push(rec(
            "park/2",
            Event::ChunkParked(crate::events::ChunkParked { seq: 2, gen: 1 }),
        ));
        assert_eq!(failing(&e, 5, true, Some(1)), vec![7]);
    }

    #[test]
    fn a_clean_generation_passes() {
        assert_eq!(failing(&good(), 5, true, Some(1)), Vec::<u8>::new());
    }

    #[test]
    fn a_second_group_breaks_invariant_1() {
        let mut e = good();
        e.insert(3, created(0, "G2"));
        assert_eq!(failing(&e, 5, true, Some(1)), vec![1]);
        // Discarding the kept group is as bad.
        let mut e = good();
        e.push(rec(
            "discard/0/G1",
            Event::GroupDiscarded(GroupDiscarded {
                gen: 0,
                group_id: "G1".into(),
                kept: "G1".into(),
            }),
        ));
        assert_eq!(failing(&e, 5, true, Some(1)), vec![1]);
    }

    #[test]
    fn a_send_before_every_load_breaks_invariant_2() {
        let mut e = good();
        let send = e.pop().unwrap();
        e.insert(4, send);
        assert_eq!(failing(&e, 5, true, Some(1)), vec![2]);
        // Two sends.
        let mut e = good();
        e.push(sent(0, "G1"));
        assert_eq!(failing(&e, 5, true, Some(1)), vec![2]);
        // Reported, never sent.
        let mut e = good();
        e.pop();
        assert_eq!(failing(&e, 5, true, Some(1)), vec![2]);
    }

    #[test]
    fn a_load_into_another_group_breaks_invariant_3() {
        let mut e = good();
        e[4] = loaded(0, 1, "G9", 2);
        assert_eq!(failing(&e, 5, true, Some(1)), vec![3]);
    }

    #[test]
    fn a_chunk_of_copies_only_names_no_group() {
        let mut e = good();
        e.insert(2, assigned(0, 2, 0));
        e.insert(5, loaded(0, 2, "", 0));
        assert_eq!(failing(&e, 5, true, Some(2)), Vec::<u8>::new());
        // A chunk that registered someone must name the kept group.
        let mut e = good();
        e[4] = loaded(0, 1, "", 2);
        assert_eq!(failing(&e, 5, true, Some(1)), vec![3]);
    }

    #[test]
    fn a_missing_seq_or_recipient_breaks_invariant_5() {
        assert_eq!(failing(&good(), 5, true, Some(2)), vec![5]);
        let mut e = good();
        e[4] = loaded(0, 1, "G1", 1);
        assert_eq!(failing(&e, 5, true, Some(1)), vec![5]);
    }

    #[test]
    fn a_report_that_hides_a_refused_chunk_breaks_invariant_7() {
        let report = |outcome: &str, rejected: u64| {
            rec(
                "report",
                Event::BatchReported(crate::events::BatchReported {
                    outcome: outcome.into(),
                    generations: 1,
                    chunks: 2,
                    recipients: 5,
                    registered: 5,
                    failed: 0,
                    sent_success: 5,
                    sent_failed: 0,
                    duplicates: 0,
                    rejected,
                    missing: 0,
                    ..Default::default()
                }),
            )
        };
        let refused = rec(
            "reject/2/d",
            Event::InputRejected(crate::events::InputRejected {
                seq: Some(2),
                reason: "beyond the last seq 1".into(),
                hole: false,
                ..Default::default()
            }),
        );
        let mut e = good();
        e.push(report("completed", 0));
        assert_eq!(failing(&e, 5, true, Some(1)), Vec::<u8>::new());
        e.push(refused.clone());
        // `failing` counts no dead letter: the refusal's own check fails too;
        // and a refusal recorded after the report is an event after the end.
        assert_eq!(failing(&e, 5, true, Some(1)), vec![7, 7, 7, 5]);
        let mut e = good();
        e.extend([refused, report("partial", 1)]);
        assert_eq!(failing(&e, 5, true, Some(1)), vec![5]);
    }

    #[test]
    fn a_generation_over_the_cap_breaks_invariant_6() {
        assert_eq!(failing(&good(), 4, true, Some(1)), vec![6]);
    }

    #[test]
    fn the_provider_view_is_checked_against_our_events() {
        let t = Tally::of(&good());
        let st = &t.gens[&0];
        let group = |registered: u64, status: GroupStatus| {
            let mut g: crate::provider::Group = serde_json::from_value(serde_json::json!({
                "groupId": "G1", "status": "SENDING",
                "count": {"total": 5, "registeredSuccess": 5, "registeredFailed": 0,
                          "sentTotal": 0, "sentSuccess": 0, "sentFailed": 0, "sentPending": 0}
            }))
            .unwrap();
            g.count.registered_success = registered;
            g.status = status;
            g
        };
        let run = |view: ProviderView| {
            let mut c = Checks::default();
            provider_checks(&mut c, 0, st, &view, 5);
            c.0.iter()
                .filter(|c| !c.ok)
                .map(|c| c.invariant)
                .collect::<Vec<_>>()
        };
        let ok = ProviderView {
            kept: Ok(group(5, GroupStatus::Sending)),
            discarded_gone: vec![("G2".into(), true)],
        };
        assert_eq!(run(ok), Vec::<u8>::new());
        let miscounted = ProviderView {
            kept: Ok(group(4, GroupStatus::Sending)),
            discarded_gone: vec![],
        };
        assert_eq!(run(miscounted), vec![3]);
        let unsent = ProviderView {
            kept: Ok(group(5, GroupStatus::Pending)),
            discarded_gone: vec![("G2".into(), false)],
        };
        assert_eq!(run(unsent), vec![2, 1]);
    }
}
