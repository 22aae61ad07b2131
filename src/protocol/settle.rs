//! `settle.lua`: the layer shared by the scripts that can end a batch
//! (`accept`, `reject`, `close`, `cancel`, `claim_send`, `loaded`, `completed`): whether a batch
//! takes no more chunks, a generation made ready, the report decided once,
//! the current generation closed when the batch settles, a refused chunk
//! recorded (a hole or not), and the tombstone check.

use crate::projection::{
    event_key,
    field::{self, generation},
};
use std::collections::BTreeMap;

use super::{num, tonumber, work_item, BatchPolicy, Run};
use crate::events::{
    BatchReported, Event, GenerationClosed, GenerationReady, GroupCompleted, InputRejected,
};

/// `settled(closed, last, seqs, holes)`: whether the batch takes no more
/// chunks: closed, or every seq 0..last assigned (`seqs`) or a hole.
pub(crate) fn settled(closed: bool, last: Option<i64>, seqs: i64, holes: i64) -> bool {
    closed || last.is_some_and(|l| seqs + holes == l + 1)
}

/// `settled` over the state's own fields.
fn settled_now(r: &Run, holes: i64) -> bool {
    settled(
        r.get(field::CLOSED).is_some(),
        tonumber(r.get(field::LAST).as_deref()),
        r.num(field::SEQS),
        holes,
    )
}

/// `make_ready(gen, chunks, registered)`: the generation's ready event and,
/// with registered recipients, its one send work item; with none, it is
/// done at once (`group_completed` with status `empty`). Returns whether it
/// is done.
pub(crate) fn make_ready(r: &mut Run, gen: u32, chunks: u32, registered: i64) -> bool {
    r.emit(
        &event_key::ready(gen),
        Event::GenerationReady(GenerationReady { gen, chunks }),
        true,
    );
    r.put(field::gen(gen, generation::READY), 1);
    if registered > 0 {
        let item = work_item(&r.batch, gen, None, None);
        r.db.add_work("send", item, None);
        return false;
    }
    r.emit(
        &event_key::done(gen),
        Event::GroupCompleted(GroupCompleted {
            gen,
            group_id: String::new(),
            status: "empty".into(),
            sent_success: 0,
            sent_failed: 0,
            ..Default::default()
        }),
        true,
    );
    r.put(field::gen(gen, generation::DONE), "empty");
    // HINCRBY: written at once, as the fold does (an increment creates the field).
    r.incr("done", 1);
    r.incr("sent_success", 0);
    r.incr("sent_failed", 0);
    true
}

/// `try_report()`: decides the batch's report if it takes no more chunks
/// and every generation is done, once. Returns whether it was decided now.
pub(crate) fn try_report(r: &mut Run, policy: &BatchPolicy) -> bool {
    r.flush();
    let cancelled = r.get(field::CANCELLED).is_some();
    if r.get(&field::key(event_key::REPORT)).is_some()
        || !(cancelled || settled_now(r, r.num(field::HOLES)))
    {
        return false;
    }
    let gens = tonumber(r.get(field::GENERATION).as_deref()).map_or(0, |g| g + 1);
    if r.num(field::GENERATIONS_DONE) != gens {
        return false;
    }
    let (registered, failed) = (r.num(field::REGISTERED), r.num(field::FAILED));
    let (rejected, missing) = (r.num(field::REJECTED), r.num(field::MISSING));
    let (unsent, unknown) = (r.num(field::UNSENT), r.num(field::UNKNOWN));
    let outcome = if cancelled {
        "cancelled"
    } else if registered == unsent {
        // Nobody registered, or nothing registered went out (sends given up).
        "failed"
    } else if failed == 0
        && rejected == 0
        && missing == 0
        && unsent == 0
        && unknown == 0
        && tonumber(r.get(field::LAST).as_deref()).is_some()
    {
        // A batch closed before its last seq was known may have lost chunks
        // that no count shows: not `completed`.
        "completed"
    } else {
        "partial"
    };
    let mut failed_by_reason = BTreeMap::new();
    if failed > 0 {
        // `fr:<code>`: failed recipients by reason.
        for (f, v) in r.db.batch(&r.batch).map(|b| &b.state).into_iter().flatten() {
            if let Some(code) = f.strip_prefix("fr:") {
                failed_by_reason.insert(code.to_string(), num(Some(v)) as u64);
            }
        }
    }
    let report = BatchReported {
        outcome: outcome.into(),
        generations: gens as u32,
        chunks: r.num(field::SEQS) as u32,
        recipients: r.num(field::RECIPIENTS) as u64,
        registered: registered as u64,
        failed: failed as u64,
        sent_success: r.num(field::SENT_SUCCESS) as u64,
        sent_failed: r.num(field::SENT_FAILED) as u64,
        duplicates: r.num(field::DUPLICATES) as u64,
        rejected: rejected as u64,
        missing: missing as u64,
        failed_by_reason,
        stopped: if cancelled {
            r.num(field::STOPPED) as u32
        } else {
            0
        },
        unsent: unsent as u64,
        unknown: unknown as u64,
        last_conflict: r.get(field::LAST_CONFLICT),
        origin: r.get(field::ORIGIN),
    };
    r.emit("report", Event::BatchReported(report.clone()), true);
    r.put(field::REPORT, outcome);
    r.flush();
    let batch = r.batch.clone();
    r.db.active.remove(&batch);
    let id = r.db.next_id();
    r.db.reports
        .push((id, batch.clone(), Event::BatchReported(report)));
    if policy.deliver {
        r.db.add_work("report", work_item(&batch, 0, None, None), None);
    }
    if policy.track && nothing_left_to_track(r, gens) {
        // No tracked generation is left to decide the delivery report: a
        // `track` item without a group does.
        r.db.add_work("track", work_item(&batch, 0, None, None), None);
    }
    if !policy.retention.is_zero() {
        r.b().expiring = true;
    }
    // The numbers seen are no longer needed (DEL); the batch id is
    // remembered (ZADD of the tombstone).
    if let Some(b) = r.db.batches.get_mut(&batch) {
        b.numbers.clear();
    }
    r.db.reported.insert(batch);
    true
}

/// `nothing_left_to_track(gens)`: every generation the provider finished
/// (COMPLETE or FAILED) has its delivery results counted (`g:<g>:dl`).
fn nothing_left_to_track(r: &mut Run, gens: i64) -> bool {
    (0..gens).all(|g| {
        let done = r.get(&field::gen(g, generation::DONE));
        !matches!(done.as_deref(), Some("COMPLETE" | "FAILED"))
            || r.get(&field::gen(g, generation::DELIVERED)).is_some()
    })
}

/// `settle(reason)`: the batch takes no more chunks: its current generation
/// (if any) is closed for `reason` and, all its chunks loaded, made ready;
/// then the report is decided if everything is done.
pub(crate) fn settle(r: &mut Run, policy: &BatchPolicy, reason: &str) {
    r.flush();
    if let Some(gen) = r.get(field::GENERATION) {
        close_generation(r, num(Some(&gen)) as u32, reason);
    }
    try_report(r, policy);
}

/// `close_generation(gen, reason)`: closes generation `gen` for `reason`
/// unless it is closed, and makes it ready when all its chunks are loaded.
pub(crate) fn close_generation(r: &mut Run, gen: u32, reason: &str) {
    r.flush();
    let gk = |f: &str| field::gen(gen, f);
    if r.get(&gk(generation::CLOSED)).is_some() {
        return;
    }
    let (c, l, n, reg) = (
        r.num(&gk(generation::CHUNKS)),
        r.num(&gk(generation::LOADED)),
        r.num(&gk(generation::RECIPIENTS)),
        r.num(&gk(generation::REGISTERED)),
    );
    r.emit(
        &event_key::close(gen),
        Event::GenerationClosed(GenerationClosed {
            gen,
            reason: reason.into(),
            chunks: c as u32,
            recipients: n as u32,
        }),
        true,
    );
    r.put(gk(generation::CLOSED), reason);
    if l == c {
        make_ready(r, gen, c as u32, reg);
    }
}

/// `reject(seq, digest, reason, may_hole, flagged_last)`: records a refused
/// chunk (`input_rejected`, key `reject/<seq>/<digest>`) once; a hole when
/// `may_hole` and its seq has no data, is not beyond the last seq, and the
/// batch still takes chunks. The hole that completes 0..last settles it.
///
/// `flagged_last`: the chunk was flagged `last`. A batch that does not know
/// its end yet learns it from the flag, refused or not: at this seq, or at
/// the highest seq already received when that is higher (the flag
/// contradicts it: kept as `last_conflict`, named in the report).
pub(crate) fn reject(
    r: &mut Run,
    policy: &BatchPolicy,
    seq: u32,
    digest: &str,
    reason: &str,
    may_hole: bool,
    flagged_last: bool,
) {
    let key = event_key::reject(seq, digest);
    if r.get(&field::key(&key)).is_some() {
        return;
    }
    let is_hole = r.get(&field::hole(seq)).as_deref() == Some("1");
    let assigned = r.get(&field::assignment(seq)).is_some();
    let mut last = tonumber(r.get(field::LAST).as_deref());
    let holes0 = r.num(field::HOLES);
    let rmax = tonumber(r.get(field::REFUSED_MAX).as_deref());
    let max = tonumber(r.get(field::MAX).as_deref());
    let rejected = r.num(field::REJECTED);
    let closed = r.get(field::CLOSED).is_some();
    let learned = flagged_last && last.is_none() && !closed;
    let mut event = InputRejected {
        seq: Some(seq),
        reason: reason.into(),
        hole: false,
        last: None,
        last_conflict: None,
    };
    if learned {
        let above = max.unwrap_or(-1).max(rmax.unwrap_or(-1));
        let end = above.max(i64::from(seq));
        last = Some(end);
        event.last = Some(end as u32);
        r.put(field::LAST, end);
        if above > i64::from(seq) {
            let why = format!(
                "seq {seq} is flagged last, but seq {above} had already arrived: the batch ends at seq {above}"
            );
            r.put(field::LAST_CONFLICT, &why);
            event.last_conflict = Some(why);
        }
    }
    let seqs = r.num(field::SEQS);
    let hole = may_hole
        && !assigned
        && !is_hole
        && last.is_none_or(|l| i64::from(seq) <= l)
        && !settled(closed, last, seqs, holes0);
    event.hole = hole;
    r.emit(&key, Event::InputRejected(event), true);
    r.put(field::REJECTED, rejected + 1);
    let mut holes = holes0;
    if hole {
        // A batch of refused chunks only is watched too (SADD active).
        let batch = r.batch.clone();
        r.db.active.insert(batch);
        holes += 1;
        r.put(field::hole(seq), 1);
        r.put(field::HOLES, holes);
        if rmax.is_none_or(|m| i64::from(seq) > m) {
            r.put(field::REFUSED_MAX, seq);
        }
    }
    if (hole || learned) && settled(closed, last, seqs, holes) {
        settle(r, policy, "final");
    }
    r.flush();
}

/// `tombstoned(nothing_recorded)`: a batch with no state at all that is
/// remembered as reported.
pub(crate) fn tombstoned(r: &Run, nothing_recorded: bool) -> bool {
    nothing_recorded && r.db.reported.contains(&r.batch)
}

/// `stop_generation(g, closed, group, chunks, recipients)`: a generation of a
/// cancelled batch whose send is not claimed (or whose claim was given back)
/// is stopped: closed if it was not, done with status `cancelled`, its group
/// (if any) deleted by a `delete` work item. The caller flushes, then
/// counts it.
pub(crate) fn stop_generation(
    r: &mut Run,
    g: u32,
    closed: bool,
    group: Option<String>,
    chunks: i64,
    recipients: i64,
) {
    if !closed {
        r.emit(
            &event_key::close(g),
            Event::GenerationClosed(GenerationClosed {
                gen: g,
                reason: "cancelled".into(),
                chunks: chunks as u32,
                recipients: recipients as u32,
            }),
            true,
        );
        r.put(field::gen(g, generation::CLOSED), "cancelled");
    }
    r.emit(
        &event_key::done(g),
        Event::GroupCompleted(GroupCompleted {
            gen: g,
            group_id: group.clone().unwrap_or_default(),
            status: "cancelled".into(),
            sent_success: 0,
            sent_failed: 0,
            ..Default::default()
        }),
        true,
    );
    r.put(field::gen(g, generation::DONE), "cancelled");
    if let Some(group) = group {
        let item = work_item(&r.batch, g, None, Some(&group));
        r.db.add_work("delete", item, None);
    }
}
