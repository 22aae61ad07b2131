//! `close.lua`: close a batch, giving up on the seqs that never arrived;
//! the current generation is closed, so every generation with loaded
//! recipients is sent and the batch reports. Idempotent.

use super::settle::settle;
use super::{reply, tonumber, BatchPolicy, Db, Run};
use crate::events::{BatchClosed, Event};

/// `close.lua` for `reason`. Returns `closed, missing count`,
/// `reported, outcome` or `unknown`.
pub fn close(db: &mut Db, batch: &str, policy: &BatchPolicy, reason: &str) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if let Some(o) = r.get("report") {
        return reply(["reported", &o]);
    }
    if r.get("closed").is_some() {
        let missing = r.get("missing").unwrap_or_else(|| "0".into());
        return reply(["closed", &missing]);
    }
    if r.get("seqs").is_none() && r.get("holes").is_none() && r.get("rejected").is_none() {
        return reply(["unknown"]);
    }
    // Up to the last seq or, it unknown, the highest seen (assigned or a hole).
    let top = tonumber(r.get("last").as_deref()).unwrap_or_else(|| {
        let max = tonumber(r.get("max").as_deref()).unwrap_or(-1);
        max.max(tonumber(r.get("rmax").as_deref()).unwrap_or(-1))
    });
    let missing: Vec<u32> = (0..=top)
        .filter(|s| {
            r.get(&format!("s:{s}")).is_none() && r.get(&format!("r:{s}")).as_deref() != Some("1")
        })
        .map(|s| s as u32)
        .collect();
    let n = missing.len();
    r.emit(
        "closed",
        Event::BatchClosed(BatchClosed {
            reason: reason.into(),
            missing,
        }),
        true,
    );
    r.put("closed", reason);
    r.put("missing", n);
    settle(&mut r, policy, "closed");
    r.flush();
    reply(["closed", &n.to_string()])
}
