//! `loaded.lua`: record that every message of a chunk was accepted by the
//! provider, and evaluate the generation's completion equation
//! (closed ∧ loaded = assigned ⇒ ready: one send work item).

use super::{reply, Db, Run};
use crate::events::{ChunkLoaded, Event};

/// `loaded.lua` for event `e`. Returns `loaded, ready 0|1` or `duplicate`.
pub fn loaded(db: &mut Db, batch: &str, e: &ChunkLoaded) -> Vec<String> {
    let mut r = Run::new(db, batch);
    let gen = e.gen;
    let gk = |f: &str| format!("g:{gen}:{f}");
    let key = format!("loaded/{gen}/{}", e.seq);
    if r.get(&format!("k:{key}")).is_some() {
        return reply(["duplicate"]);
    }
    let (reg, failed) = (i64::from(e.registered), e.failed.len() as i64);
    let (l0, c) = (r.num(&gk("l")), r.num(&gk("c")));
    let closed = r.get(&gk("closed")).is_some();
    let (greg, gfail) = (r.num(&gk("reg")), r.num(&gk("fail")));
    let (treg, tfail) = (r.num("registered"), r.num("failed"));
    let was_ready = r.get(&gk("ready")).is_some();
    r.emit(&key, Event::ChunkLoaded(e.clone()), true);
    let l = l0 + 1;
    r.put(gk("l"), l);
    r.put(gk("reg"), greg + reg);
    r.put(gk("fail"), gfail + failed);
    r.put("registered", treg + reg);
    r.put("failed", tfail + failed);
    let ready = closed && l == c && !was_ready;
    if ready {
        r.make_ready(gen, c as u32);
    }
    r.flush();
    reply(["loaded", if ready { "1" } else { "0" }])
}
