//! A batch's derived state, defined once as a fold over its events.
//!
//! The live copy is the batch's state hash in Redis, kept by the scripts in
//! `streams/scripts/` in the same step as each append. [`Projection::fold`] is
//! the definition: `replay` rebuilds the hash from the event stream with it,
//! and `replay --verify` checks the live copy field by field.
//!
//! The hash is flat (`field -> string`):
//!
//! | field | meaning |
//! |---|---|
//! | `k:<key>` | idempotency key → id of the entry that appended it |
//! | `hb` | ms of the last event (stalls excluded): the heartbeat |
//! | `t0` | ms of the first chunk's acceptance |
//! | `s:<seq>` | `<gen>\|<count>\|<digest>`: the chunk's assignment |
//! | `seqs`, `recipients` | chunks and recipients accepted |
//! | `max`, `last` | highest seq accepted; the seq flagged last |
//! | `gen` | the newest generation |
//! | `g:<g>:n`, `g:<g>:c` | recipients and chunks assigned to generation g |
//! | `g:<g>:l` | chunks loaded into it |
//! | `g:<g>:closed` | `full` or `final` |
//! | `g:<g>:group` | its provider group |
//! | `g:<g>:reg`, `g:<g>:fail` | recipients registered / refused in it |
//! | `g:<g>:ready`, `g:<g>:sent`, `g:<g>:done`, `g:<g>:refused` | its send's progress |
//! | `registered`, `failed`, `done`, `sent_success`, `sent_failed` | batch totals |
//! | `report`, `delivered`, `rejected`, `stalls` | outcome and incidents |
//! | `alive` | ms of the last wait that showed the batch progressing (a poll of a group still sending, a limiter or durability wait): a heartbeat without an event, **not** derived from events ([`LIVE_ONLY`]) |
//!
//! Every update is a set of a value fixed by the event, an increment, or a
//! maximum, and every event has a unique key: so the fold gives the same state
//! for any order and any duplication of the same events.

use std::collections::BTreeMap;

use crate::events::{Event, Recorded};

/// One change to a field of the state hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// Set to a value.
    Set(String, String),
    /// Add to a number.
    Incr(String, i64),
    /// Raise a number to at least this.
    Max(String, u64),
}

fn g(gen: u32, field: &str) -> String {
    format!("g:{gen}:{field}")
}

/// The state changes an event makes (besides its `k:` key and `hb`).
pub fn updates(event: &Event) -> Vec<Update> {
    use Update::*;
    match event {
        Event::ChunkAssigned(e) => {
            let mut u = vec![
                Set(
                    format!("s:{}", e.seq),
                    format!("{}|{}|{}", e.gen, e.count, e.digest),
                ),
                Incr(g(e.gen, "n"), i64::from(e.count)),
                Incr(g(e.gen, "c"), 1),
                Max("gen".into(), u64::from(e.gen)),
                Incr("seqs".into(), 1),
                Incr("recipients".into(), i64::from(e.count)),
                Max("max".into(), u64::from(e.seq)),
            ];
            if e.last {
                u.push(Set("last".into(), e.seq.to_string()));
            }
            u
        }
        Event::GenerationClosed(e) => vec![Set(g(e.gen, "closed"), e.reason.clone())],
        Event::GroupCreated(e) => vec![Set(g(e.gen, "group"), e.group_id.clone())],
        Event::ChunkLoaded(e) => {
            let failed = e.failed.len() as i64;
            vec![
                Incr(g(e.gen, "l"), 1),
                Incr(g(e.gen, "reg"), i64::from(e.registered)),
                Incr(g(e.gen, "fail"), failed),
                Incr("registered".into(), i64::from(e.registered)),
                Incr("failed".into(), failed),
            ]
        }
        Event::GenerationReady(e) => vec![Set(g(e.gen, "ready"), "1".into())],
        Event::SendTriggered(e) => vec![Set(g(e.gen, "sent"), e.outcome.clone())],
        Event::SendRefused(e) => vec![Set(g(e.gen, "refused"), e.reason.clone())],
        Event::GroupCompleted(e) => vec![
            Set(g(e.gen, "done"), e.status.clone()),
            Incr("done".into(), 1),
            Incr("sent_success".into(), e.sent_success as i64),
            Incr("sent_failed".into(), e.sent_failed as i64),
        ],
        Event::BatchReported(e) => vec![Set("report".into(), e.outcome.clone())],
        Event::ReportDelivered(e) => vec![Set("delivered".into(), e.status.to_string())],
        Event::InputRejected(_) => vec![Incr("rejected".into(), 1)],
        Event::BatchStalled(_) => vec![Incr("stalls".into(), 1)],
        Event::ChunkParked(_)
        | Event::GroupRequested(_)
        | Event::ChunksReleased(_)
        | Event::GroupDiscarded(_) => vec![],
    }
}

/// State fields kept by the live copy only, not derived from events: the
/// `alive` heartbeat (stamped by waits that append no event). A rebuild keeps
/// them; a comparison with a replay ignores them.
pub const LIVE_ONLY: &[&str] = &["alive"];

/// Whether an event refreshes the batch's heartbeat.
pub fn touches_heartbeat(event: &Event) -> bool {
    !matches!(event, Event::BatchStalled(_))
}

/// A batch's state, as the flat field map of its state hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projection {
    /// Field → value.
    pub fields: BTreeMap<String, String>,
}

impl Projection {
    /// The definition of a batch's state: the fold of its events.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a Recorded>) -> Projection {
        let mut p = Projection::default();
        for r in events {
            p.apply(r);
        }
        p
    }

    /// Applies one recorded event; a key already applied is skipped.
    pub fn apply(&mut self, r: &Recorded) {
        let kf = format!("k:{}", r.key);
        if self.fields.contains_key(&kf) {
            return;
        }
        self.fields.insert(kf, r.id.clone());
        if touches_heartbeat(&r.event) {
            self.max("hb", r.millis());
        }
        if let Event::ChunkAssigned(_) = r.event {
            // When the batch's first chunk was accepted.
            let t0 = self.fields.get("t0").and_then(|v| v.parse::<u64>().ok());
            if t0.is_none_or(|t| r.millis() < t) {
                self.fields.insert("t0".into(), r.millis().to_string());
            }
        }
        for u in updates(&r.event) {
            match u {
                Update::Set(f, v) => {
                    self.fields.insert(f, v);
                }
                Update::Incr(f, by) => {
                    let n = self.int(&f) + by;
                    self.fields.insert(f, n.to_string());
                }
                Update::Max(f, v) => self.max(&f, v),
            }
        }
    }

    fn max(&mut self, field: &str, v: u64) {
        let cur = self.fields.get(field).and_then(|s| s.parse::<u64>().ok());
        if cur.is_none_or(|c| v > c) {
            self.fields.insert(field.to_string(), v.to_string());
        }
    }

    /// A numeric field (0 when absent).
    pub fn int(&self, field: &str) -> i64 {
        self.fields
            .get(field)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// A field.
    pub fn get(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }

    /// Generation `gen`'s field.
    pub fn gen_field(&self, gen: u32, field: &str) -> Option<&str> {
        self.get(&g(gen, field))
    }

    /// Generation `gen`'s numeric field.
    pub fn gen_int(&self, gen: u32, field: &str) -> i64 {
        self.int(&g(gen, field))
    }

    /// How many generations exist (0 before the first chunk).
    pub fn generations(&self) -> u32 {
        match self.get("gen").and_then(|v| v.parse::<u32>().ok()) {
            Some(g) => g + 1,
            None => 0,
        }
    }

    /// The seq flagged last, when known.
    pub fn last_seq(&self) -> Option<u32> {
        self.get("last").and_then(|v| v.parse().ok())
    }

    /// Whether every seq 0..=last is assigned.
    pub fn fully_assigned(&self) -> bool {
        self.last_seq()
            .is_some_and(|l| self.int("seqs") == i64::from(l) + 1)
    }

    /// The assignment of a seq: (gen, count, digest).
    pub fn assignment(&self, seq: u32) -> Option<(u32, u32, String)> {
        let v = self.get(&format!("s:{seq}"))?;
        let mut it = v.splitn(3, '|');
        let gen = it.next()?.parse().ok()?;
        let count = it.next()?.parse().ok()?;
        Some((gen, count, it.next()?.to_string()))
    }

    /// The differences between two projections, as readable lines. The
    /// [`LIVE_ONLY`] fields, which no event defines, are not compared.
    pub fn diff(&self, other: &Projection) -> Vec<String> {
        let mut out = Vec::new();
        for (k, v) in &self.fields {
            if LIVE_ONLY.contains(&k.as_str()) {
                continue;
            }
            match other.fields.get(k) {
                None => out.push(format!("{k}: {v:?} vs missing")),
                Some(w) if w != v => out.push(format!("{k}: {v:?} vs {w:?}")),
                _ => {}
            }
        }
        for (k, w) in &other.fields {
            if !self.fields.contains_key(k) && !LIVE_ONLY.contains(&k.as_str()) {
                out.push(format!("{k}: missing vs {w:?}"));
            }
        }
        out
    }
}
