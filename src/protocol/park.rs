//! `park.lua`: park a chunk whose generation has no group yet, and make sure
//! one create-group work item exists for that generation.

use super::{reply, work_item, Db, Run};
use crate::events::{ChunkParked, Event, GroupRequested};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// `park.lua`. Returns `parked`, `group, id` (load now), `loaded`,
/// `unassigned` (the chunk is not assigned to `gen`, its assignment lost
/// with Redis's unsynced writes: nothing parked, the caller accepts again),
/// `failed` (the generation's creation was given up: nothing parked, the
/// caller records the chunk as given up), or `ended` (the batch was
/// cancelled or reported: nothing parked, appended or enqueued).
pub fn park(db: &mut Db, batch: &str, seq: u32, gen: u32, payload: &[u8]) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let assigned = r.get(&field::assignment(seq));
    if assigned.as_deref().and_then(|s| s.split('|').next()) != Some(gen.to_string().as_str()) {
        return reply(["unassigned"]);
    }
    if r.get(field::CANCELLED).is_some() || r.get(field::REPORT).is_some() {
        return reply(["ended"]);
    }
    if let Some(g) = r.get(&field::gen(gen, generation::GROUP)) {
        return reply(["group", &g]);
    }
    if r.get(&field::key(&event_key::loaded(gen, seq))).is_some() {
        return reply(["loaded"]);
    }
    if r.get(&field::gen(gen, generation::GIVEN_UP)).is_some() {
        return reply(["failed"]);
    }
    let parked_before = r.get(&field::key(&event_key::park(seq))).is_some();
    let requested_before = r.get(&field::key(&event_key::create(gen))).is_some();
    let b = r.batch.clone();
    let hash =
        r.db.batches
            .entry(b)
            .or_default()
            .parked
            .entry(gen)
            .or_default();
    // HSET: a field already there keeps its place.
    match hash.iter_mut().find(|(s, _)| *s == seq.to_string()) {
        Some((_, p)) => *p = payload.to_vec(),
        None => hash.push((seq.to_string(), payload.to_vec())),
    }
    if !parked_before {
        r.emit(
            &event_key::park(seq),
            Event::ChunkParked(ChunkParked { seq, gen }),
            true,
        );
    }
    if !requested_before {
        r.emit(
            &event_key::create(gen),
            Event::GroupRequested(GroupRequested { gen }),
            true,
        );
        let item = work_item(batch, gen, None, None);
        r.db.add_work("create", item, None);
    }
    r.flush();
    reply(["parked"])
}
