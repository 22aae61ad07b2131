//! `claim_send.lua`: claim a generation's send before the provider is asked
//! to send it. The claim and [`super::cancel`] are linearized on the
//! batch's state: a cancel first refuses the claim (never sent); a claim
//! first is left alone by the cancel (sent and counted). The claim is kept,
//! so a worker that crashed after it claims again and sends.

use super::{entry_id, reply, Db, Run};
use crate::events::{Event, SendClaimed};

/// `claim_send.lua` for generation `gen`. Returns `claimed, entry id of the
/// claim` or `cancelled, reason`.
pub fn claim_send(db: &mut Db, batch: &str, gen: u32) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if let Some(id) = r.get(&format!("k:claim/{gen}")) {
        return reply(["claimed", &id]);
    }
    if let Some(reason) = r.get("cancelled") {
        return reply(["cancelled", &reason]);
    }
    let id = r.emit(
        &format!("claim/{gen}"),
        Event::SendClaimed(SendClaimed { gen }),
        true,
    );
    r.put(format!("g:{gen}:claimed"), 1);
    r.flush();
    reply(["claimed", &entry_id(id)])
}
