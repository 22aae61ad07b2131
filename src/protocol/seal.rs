//! `seal.lua`: declare a batch's last seq after the fact (a streaming
//! producer learns where its batch ends only after its last chunk). As a
//! chunk flagged `last` would, without a chunk; refused, changing nothing,
//! when it contradicts what the batch knows or the batch has ended.
//! Idempotent: sealing again with the same last seq answers the same.

use super::settle::{settle, settled, tombstoned};
use super::{reply, tonumber, BatchPolicy, Db, Run};
use crate::events::{BatchSealed, Event};
use crate::projection::field;

/// `seal.lua` for last seq `last`. Returns `sealed, last`,
/// `conflict, reason` or `ended, reason`.
pub fn seal(db: &mut Db, batch: &str, policy: &BatchPolicy, last: u32) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let known = tonumber(r.get(field::LAST).as_deref());
    let last_s = last.to_string();
    if known == Some(i64::from(last)) {
        return reply(["sealed", &last_s]);
    }
    let ended = |what: &str| reply(["ended", &format!("batch {batch} was {what}")]);
    if let Some(o) = r.get(field::REPORT) {
        return ended(&format!("already reported ({o})"));
    }
    if let Some(why) = r.get(field::CANCELLED) {
        return ended(&format!("cancelled ({why})"));
    }
    if let Some(why) = r.get(field::CLOSED) {
        return ended(&format!("closed ({why})"));
    }
    let seen = r.get(field::SEQS).is_some()
        || r.get(field::HOLES).is_some()
        || r.get(field::REJECTED).is_some();
    if tombstoned(&r, !seen) {
        return ended("already reported (its events have expired)");
    }
    if let Some(k) = known {
        return reply([
            "conflict",
            &format!("batch {batch} already ends at seq {k}, not {last}"),
        ]);
    }
    let above = tonumber(r.get(field::MAX).as_deref())
        .unwrap_or(-1)
        .max(tonumber(r.get(field::REFUSED_MAX).as_deref()).unwrap_or(-1));
    if above > i64::from(last) {
        return reply([
            "conflict",
            &format!(
                "seq {above} of batch {batch} was already received, beyond the last seq {last}"
            ),
        ]);
    }
    r.emit("seal", Event::BatchSealed(BatchSealed { last }), true);
    r.put(field::LAST, last);
    if settled(
        false,
        Some(i64::from(last)),
        r.num(field::SEQS),
        r.num(field::HOLES),
    ) {
        settle(&mut r, policy, "final");
    }
    r.flush();
    reply(["sealed", &last_s])
}
