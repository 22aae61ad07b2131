//! `fail_generation.lua`: record that a generation's group can never be
//! created, so that the generation and the batch still end: the generation
//! is closed (`failed`) and its parked chunks are released as load items
//! without a group, which record them as given up.

use super::record_group::release_parked;
use super::settle::{close_generation, try_report};
use super::{reply, BatchPolicy, Db, Run};
use crate::events::{Event, GenerationFailed};
use crate::projection::{
    event_key,
    field::{self, generation},
};

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
    let gk = |f: &str| field::gen(gen, f);
    if r.get(&field::key(&event_key::failed(gen))).is_some() {
        return reply(["duplicate"]);
    }
    if let Some(g) = r.get(&gk(generation::GROUP)) {
        return reply(["group", &g]);
    }
    if r.get(field::REPORT).is_some() || r.get(field::CANCELLED).is_some() {
        if let Some(b) = r.db.batches.get_mut(batch) {
            b.parked.remove(&gen);
        }
        return reply(["ended"]);
    }
    r.emit(
        &event_key::failed(gen),
        Event::GenerationFailed(GenerationFailed {
            gen,
            op: "create".into(),
            reason: reason.into(),
            recall: false,
        }),
        true,
    );
    r.put(gk(generation::GIVEN_UP), "create");
    let released = release_parked(&mut r, gen, "");
    close_generation(&mut r, gen, "failed");
    try_report(&mut r, policy);
    r.flush();
    reply(["failed", &released.to_string()])
}
