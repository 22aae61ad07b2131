//! `record_group.lua`: record a generation's group unless another racer's was
//! recorded first, and release every chunk parked for it in the same step.

use super::{reply, work_item, Db, Run};
use crate::events::{ChunksReleased, Event, GroupCreated};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// `record_group.lua`. Returns `won, id` or `lost, kept id`; run again
/// with the group it recorded, `won, id` again, changing nothing. Or
/// `cancelled`: the batch was cancelled; nothing is recorded, the parked
/// chunks are dropped (DEL), and the caller deletes its group. Or
/// `failed`: the generation's creation was given up; nothing is recorded,
/// and the caller deletes its group.
pub fn record_group(db: &mut Db, batch: &str, gen: u32, group: &str) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if let Some(kept) = r.get(&field::gen(gen, generation::GROUP)) {
        if kept == group {
            return reply(["won", group]);
        }
        return reply(["lost", &kept]);
    }
    if r.get(field::CANCELLED).is_some() {
        if let Some(b) = r.db.batches.get_mut(batch) {
            b.parked.remove(&gen);
        }
        return reply(["cancelled"]);
    }
    if r.get(&field::gen(gen, generation::GIVEN_UP)).is_some() {
        return reply(["failed"]);
    }
    r.emit(
        &event_key::group(gen),
        Event::GroupCreated(GroupCreated {
            gen,
            group_id: group.to_string(),
        }),
        true,
    );
    r.put(field::gen(gen, generation::GROUP), group);
    release_parked(&mut r, gen, group);
    r.flush();
    reply(["won", group])
}

/// `release_parked(parked, work, gen, group)` of the prelude: every chunk
/// parked for `gen` becomes a load item into `group` (`""`: the generation
/// has none and never will), with `chunks_released`; the parked hash is
/// deleted. Returns how many were released.
pub(crate) fn release_parked(r: &mut Run, gen: u32, group: &str) -> usize {
    let batch = r.batch.clone();
    // HGETALL, then DEL, of the parked hash.
    let parked: Vec<(String, Vec<u8>)> =
        r.db.batches
            .get_mut(&batch)
            .and_then(|b| b.parked.remove(&gen))
            .unwrap_or_default();
    for (seq, payload) in &parked {
        let item = work_item(&batch, gen, seq.parse().ok(), Some(group));
        r.db.add_work("load", item, Some(payload.clone()));
    }
    if !parked.is_empty() {
        r.emit(
            &event_key::release(gen),
            Event::ChunksReleased(ChunksReleased {
                gen,
                chunks: parked.len() as u32,
            }),
            true,
        );
    }
    parked.len()
}
