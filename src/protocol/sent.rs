//! `sent.lua`: record that a generation's group was sent (the terminal marker
//! is the event's key `send/<gen>`), and schedule the first status poll.

use super::{reply, Db, Run};
use crate::events::{Event, SendTriggered};
use crate::projection::{
    event_key,
    field::{self, generation},
};

/// `sent.lua`; `poll_entry` is the delayed entry of the first poll. Returns
/// `recorded`, `duplicate`, or `done` (the generation is done, its send
/// record lost with Redis's unsynced writes: nothing recorded).
pub fn sent(
    db: &mut Db,
    batch: &str,
    gen: u32,
    group: &str,
    outcome: &str,
    poll_entry: &[u8],
) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if r.get(&field::key(&event_key::send(gen))).is_some() {
        return reply(["duplicate"]);
    }
    if r.get(&field::gen(gen, generation::DONE)).is_some() {
        return reply(["done"]);
    }
    r.emit(
        &event_key::send(gen),
        Event::SendTriggered(SendTriggered {
            gen,
            group_id: group.to_string(),
            outcome: outcome.to_string(),
        }),
        true,
    );
    r.put(field::gen(gen, generation::SENT), outcome);
    r.db.delayed.insert(poll_entry.to_vec());
    r.flush();
    reply(["recorded"])
}
