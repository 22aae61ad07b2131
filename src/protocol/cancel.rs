//! `cancel.lua`: cancel a batch. Every generation that is not done and whose
//! send is not claimed (claimed and not given back) is stopped (closed, done with status `cancelled`,
//! its group deleted by a `delete` work item); claimed ones are sent and
//! counted. The batch takes no more chunks and reports `cancelled` once
//! every generation is done. A batch never seen reports at once.
//! Idempotent: run again, it answers the same.

use super::settle::{stop_generation, tombstoned, try_report};
use super::{reply, tonumber, BatchPolicy, Db, Run};
use crate::events::{BatchCancelled, Event};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// `cancel.lua` for `reason`. Returns `cancelled, stopped, unsent, seen
/// 0|1`, `reported, outcome` or `forgotten`.
pub fn cancel(db: &mut Db, batch: &str, policy: &BatchPolicy, reason: &str) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let seen = r.get(field::SEQS).is_some()
        || r.get(field::HOLES).is_some()
        || r.get(field::REJECTED).is_some();
    let seen_flag = if seen { "1" } else { "0" };
    if r.get(field::CANCELLED).is_some() {
        let (stopped, unsent) = (r.get(field::STOPPED), r.get(field::UNSENT));
        return reply([
            "cancelled",
            stopped.as_deref().unwrap_or_default(),
            unsent.as_deref().unwrap_or_default(),
            seen_flag,
        ]);
    }
    if let Some(o) = r.get(field::REPORT) {
        return reply(["reported", &o]);
    }
    if tombstoned(&r, !seen) {
        return reply(["forgotten"]);
    }
    let (mut stopped, mut sending, mut stop, mut unsent) = (Vec::new(), Vec::new(), Vec::new(), 0);
    if let Some(top) = tonumber(r.get(field::GENERATION).as_deref()) {
        for g in 0..=top as u32 {
            let gk = |f: &str| field::gen(g, f);
            if r.get(&field::key(&event_key::done(g))).is_some() {
                continue;
            }
            if r.num(&gk(generation::CLAIMED)) > r.num(&gk(generation::GIVEN_BACK))
                || r.get(&field::key(&event_key::send(g))).is_some()
            {
                sending.push(g);
                continue;
            }
            stopped.push(g);
            stop.push((
                g,
                r.get(&gk(generation::CLOSED)).is_some(),
                r.get(&gk(generation::GROUP)),
                r.num(&gk(generation::CHUNKS)),
                r.num(&gk(generation::RECIPIENTS)),
            ));
            unsent += r.num(&gk(generation::REGISTERED));
        }
    }
    let n = stopped.len();
    r.emit(
        "cancelled",
        Event::BatchCancelled(BatchCancelled {
            reason: reason.into(),
            stopped,
            sending,
            unsent: unsent as u64,
        }),
        true,
    );
    r.put(field::CANCELLED, reason);
    for (g, closed, group, c, recipients) in stop.iter().cloned() {
        stop_generation(&mut r, g, closed, group, c, recipients);
    }
    r.flush();
    // HINCRBY, as the fold does (an increment creates the field; a claim
    // given back after the cancel stops its generation and counts it too).
    r.incr("stopped", n as i64);
    r.incr("unsent", unsent);
    if !stop.is_empty() {
        r.incr("done", stop.len() as i64);
        r.incr("sent_success", 0);
        r.incr("sent_failed", 0);
    }
    try_report(&mut r, policy);
    reply(["cancelled", &n.to_string(), &unsent.to_string(), seen_flag])
}
