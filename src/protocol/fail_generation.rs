//! `fail_generation.lua`: record that a generation's group can never be
//! created, so that the generation and the batch still end: the generation
//! is closed (`failed`) and its parked chunks are released as load items
//! without a group, which record them as given up.

use super::settle::{make_ready, try_report};
use super::{reply, work_item, BatchPolicy, Db, Run};
use crate::events::{ChunksReleased, Event, GenerationClosed, GenerationFailed};

/// `fail_generation.lua` for generation `gen`, given up for `reason`.
/// Returns `failed, <released chunks>`, `duplicate`, `group, id` (a group
/// was recorded meanwhile: nothing given up) or `ended` (the batch was
/// reported or cancelled: its parked chunks are dropped, nothing recorded).
pub fn fail_generation(
    db: &mut Db,
    batch: &str,
    policy: &BatchPolicy,
    gen: u32,
    reason: &str,
) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gk = |f: &str| format!("g:{gen}:{f}");
    if r.get(&format!("k:failed/{gen}")).is_some() {
        return reply(["duplicate"]);
    }
    if let Some(g) = r.get(&gk("group")) {
        return reply(["group", &g]);
    }
    if r.get("report").is_some() || r.get("cancelled").is_some() {
        if let Some(b) = r.db.batches.get_mut(batch) {
            b.parked.remove(&gen);
        }
        return reply(["ended"]);
    }
    let closed = r.get(&gk("closed")).is_some();
    let (c, l, n, reg) = (
        r.num(&gk("c")),
        r.num(&gk("l")),
        r.num(&gk("n")),
        r.num(&gk("reg")),
    );
    r.emit(
        &format!("failed/{gen}"),
        Event::GenerationFailed(GenerationFailed {
            gen,
            op: "create".into(),
            reason: reason.into(),
        }),
        true,
    );
    r.put(gk("failed"), "create");
    // HGETALL, then DEL, of the parked hash.
    let parked: Vec<(String, Vec<u8>)> =
        r.db.batches
            .get_mut(batch)
            .and_then(|b| b.parked.remove(&gen))
            .unwrap_or_default();
    for (seq, payload) in &parked {
        let item = work_item(batch, gen, seq.parse().ok(), Some(""));
        r.db.add_work("load", item, Some(payload.clone()));
    }
    if !parked.is_empty() {
        r.emit(
            &format!("release/{gen}"),
            Event::ChunksReleased(ChunksReleased {
                gen,
                chunks: parked.len() as u32,
            }),
            true,
        );
    }
    if !closed {
        r.emit(
            &format!("close/{gen}"),
            Event::GenerationClosed(GenerationClosed {
                gen,
                reason: "failed".into(),
                chunks: c as u32,
                recipients: n as u32,
            }),
            true,
        );
        r.put(gk("closed"), "failed");
        if l == c && make_ready(&mut r, gen, c as u32, reg) {
            try_report(&mut r, policy);
        }
    }
    r.flush();
    reply(["failed", &(parked.len()).to_string()])
}
