//! `append.lua`: append one event whose projection change is fixed in
//! advance (its [`crate::projection::updates`]).

use super::{Db, Run};
use crate::events::Event;
use crate::projection::field;
use crate::projection::{self, Update};

/// `append.lua` for `event` under `key`. Returns `appended, id` or
/// `duplicate, first id`.
pub fn append(db: &mut Db, batch: &str, key: &str, event: &Event) -> Vec<String> {
    let mut r = Run::new(db, batch);
    if let Some(first) = r.get(&field::key(key)) {
        return vec!["duplicate".into(), first];
    }
    let id = r.emit(key, event.clone(), projection::touches_heartbeat(event));
    for u in projection::updates(event) {
        match u {
            // HINCRBY writes at once (not through put).
            Update::Incr(f, by) => r.incr(&f, by),
            Update::Set(f, v) => r.put(f, v),
            Update::Max(f, v) => r.put(f, v),
        }
    }
    r.flush();
    vec!["appended".into(), super::entry_id(id)]
}
