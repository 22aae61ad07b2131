//! `close.lua`: close a batch, giving up on the seqs that never arrived;
//! the current generation is closed, so every generation with loaded
//! recipients is sent and the batch reports. Idempotent.

use super::settle::settle;
use super::{reply, tonumber, BatchPolicy, Db, Run};
use crate::events::{BatchClosed, Event};
use crate::projection::field;
use crate::seq_ranges::{missing_ranges, MISSING_RANGES_MAX};

/// `close.lua` for `reason`. Returns `closed, missing count`,
/// `reported, outcome` or `unknown`.
pub fn close(db: &mut Db, batch: &str, policy: &BatchPolicy, reason: &str) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if let Some(o) = r.get(field::REPORT) {
        return reply(["reported", &o]);
    }
    if r.get(field::CLOSED).is_some() {
        let missing = r.get(field::MISSING).unwrap_or_else(|| "0".into());
        return reply(["closed", &missing]);
    }
    if r.get(field::SEQS).is_none()
        && r.get(field::HOLES).is_none()
        && r.get(field::REJECTED).is_none()
    {
        return reply(["unknown"]);
    }
    // Up to the last seq or, it unknown, the highest seen (assigned or a hole).
    let top = tonumber(r.get(field::LAST).as_deref()).unwrap_or_else(|| {
        let max = tonumber(r.get(field::MAX).as_deref()).unwrap_or(-1);
        max.max(tonumber(r.get(field::REFUSED_MAX).as_deref()).unwrap_or(-1))
    });
    // The seqs present (`s:<seq>` or `r:<seq>` fields), from the field
    // names: the gaps between them, as ranges, never a loop up to `top`.
    let present: Vec<u32> =
        r.db.batch(&r.batch)
            .map(|b| {
                b.state
                    .keys()
                    .filter_map(|k| k.strip_prefix("s:").or_else(|| k.strip_prefix("r:")))
                    .filter(|s| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
                    .filter_map(|s| s.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
    let top = u32::try_from(top).ok();
    let m = missing_ranges(present, top, MISSING_RANGES_MAX);
    let n = m.count;
    r.emit(
        "closed",
        Event::BatchClosed(BatchClosed {
            reason: reason.into(),
            missing: Vec::new(),
            missing_count: m.count,
            missing_ranges: m.ranges,
            missing_ranges_total: m.ranges_total,
        }),
        true,
    );
    r.put(field::CLOSED, reason);
    r.put(field::MISSING, n);
    settle(&mut r, policy, "closed");
    r.flush();
    reply(["closed", &n.to_string()])
}
