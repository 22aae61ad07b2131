//! `loaded.lua`: record that a chunk is done at the provider (every message
//! accepted, or given up on with failures), and evaluate the generation's
//! completion equation (closed ∧ loaded = assigned ⇒ ready: one send work
//! item, or done at once when nobody in it was registered).

use crate::projection::{
    event_key,
    field::{self, generation},
};
use std::collections::BTreeMap;

use super::settle::{make_ready, try_report};
use super::{reply, BatchPolicy, Db, Run};
use crate::events::{ChunkLoaded, Event};

/// `loaded.lua` for event `e` (its failure reasons and unsure count derived
/// from it, as [`crate::store::batch::BatchLog::loaded`] passes them).
/// Returns `loaded, ready 0|1`, `duplicate` or `cancelled` (the batch was
/// cancelled: nothing recorded).
pub fn loaded(db: &mut Db, batch: &str, policy: &BatchPolicy, e: &ChunkLoaded) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gen = e.gen;
    let gk = |f: &str| field::gen(gen, f);
    let key = event_key::loaded(gen, e.seq);
    if r.get(&field::key(&key)).is_some() {
        return reply(["duplicate"]);
    }
    if r.get(field::CANCELLED).is_some() {
        return reply(["cancelled"]);
    }
    let (reg, failed) = (i64::from(e.registered), e.failed.len() as i64);
    let unsure = if e.given_up.is_some() { failed } else { 0 };
    let (l0, c) = (
        r.num(&gk(generation::LOADED)),
        r.num(&gk(generation::CHUNKS)),
    );
    let closed = r.get(&gk(generation::CLOSED)).is_some();
    let (greg0, gfail) = (
        r.num(&gk(generation::REGISTERED)),
        r.num(&gk(generation::REFUSED)),
    );
    let (treg, tfail) = (r.num(field::REGISTERED), r.num(field::FAILED));
    let was_ready = r.get(&gk(generation::READY)).is_some();
    let gunsure = r.num(&gk(generation::UNSURE));
    r.emit(&key, Event::ChunkLoaded(e.clone()), true);
    let (l, greg) = (l0 + 1, greg0 + reg);
    r.put(gk(generation::LOADED), l);
    r.put(gk(generation::REGISTERED), greg);
    r.put(gk(generation::REFUSED), gfail + failed);
    r.put(field::REGISTERED, treg + reg);
    r.put(field::FAILED, tfail + failed);
    if unsure > 0 {
        r.put(gk(generation::UNSURE), gunsure + unsure);
    }
    // HINCRBY per reason: written at once.
    let mut by_reason = BTreeMap::<&str, i64>::new();
    for f in &e.failed {
        *by_reason.entry(f.code.as_str()).or_default() += 1;
    }
    for (code, n) in by_reason {
        r.incr(&field::failed_for(code), n);
    }
    let ready = closed && l == c && !was_ready;
    if ready && make_ready(&mut r, gen, c as u32, greg) {
        try_report(&mut r, policy);
    }
    r.flush();
    reply(["loaded", if ready { "1" } else { "0" }])
}
