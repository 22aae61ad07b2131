//! The batch protocol's decisions as pure functions: one function per script
//! of `streams/scripts/`, mirroring it line for line over an explicit state
//! ([`Db`]: the keys those scripts touch, as plain Rust values).
//!
//! The scripts stay the atomic executors; these functions are their
//! specification in Rust. `tests/model.rs` explores every interleaving of
//! workers, crashes, lost writes and provider answers with them, and checks
//! that the real scripts on a real `redis-server` make the same decisions
//! (same replies, same state hash, same stream entries) over long random
//! sequences: a script changed without its mirror here fails that test.
//!
//! What is modelled exactly: every field a script reads or writes, every
//! event it appends (type, key, content), every work item it enqueues, the
//! parked hashes, the number log (its frames; stamps are random, so the
//! test compares the records), the
//! active set, the reports stream, the delayed set and the tombstones
//! (entries, not scores) and the expiry a report sets. Entry ids are
//! counters (`<n>-0`, one clock for every stream) rather than server times:
//! only their order is ever compared.

pub mod accept;
pub mod append;
pub mod cancel;
pub mod claim_send;
pub mod close;
pub mod completed;
pub mod fail_generation;
pub mod give_up_send;
pub mod loaded;
pub mod numbers;
pub mod park;
pub mod record_group;
pub mod reject;
pub mod seal;
pub mod sent;
pub mod settle;

use crate::projection::field;
use std::collections::{BTreeMap, BTreeSet};

use crate::events::work_item::WorkItem;
use crate::events::{Event, Recorded};

/// How a batch ends, for the scripts that can end one (`settle.lua`): how
/// long its events live after the report, and whether the report is queued
/// for the webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// How long a reported batch's events and state are kept.
    pub retention: std::time::Duration,
    /// Whether a decided report gets a `report` work item (a webhook is
    /// configured).
    pub deliver: bool,
    /// Whether a group the provider finished gets a `track` work item that
    /// reads its messages' delivery results (`completed.lua`).
    pub track: bool,
}

impl BatchPolicy {
    /// Default of [`BatchPolicy::retention`]: 7 days.
    pub const RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

    /// The policy of an operator's command that can end a batch (`close`,
    /// `cancel`, the board's): it does not know the workers' flags, so the
    /// report is queued for delivery and the delivery report's decision
    /// for tracking; a worker without a webhook, or with tracking off,
    /// acknowledges the item.
    pub fn for_operator(retention: std::time::Duration) -> BatchPolicy {
        BatchPolicy {
            retention,
            deliver: true,
            track: true,
        }
    }

    /// The scripts' policy argument:
    /// `<retention s>|<deliver 0|1>|<track 0|1>`.
    pub(crate) fn script_arg(&self) -> String {
        format!(
            "{}|{}|{}",
            self.retention.as_secs(),
            u8::from(self.deliver),
            u8::from(self.track)
        )
    }
}

impl Default for BatchPolicy {
    fn default() -> Self {
        BatchPolicy {
            retention: Self::RETENTION,
            deliver: false,
            track: false,
        }
    }
}

pub use accept::accept;
pub use append::append;
pub use cancel::cancel;
pub use claim_send::claim_send;
pub use close::close;
pub use completed::completed;
pub use fail_generation::fail_generation;
pub use give_up_send::{give_up_send, GivenUp};
pub use loaded::loaded;
pub use park::park;
pub use record_group::record_group;
pub use reject::reject;
pub use seal::seal;
pub use sent::sent;

/// One entry of a work stream: `op`, `d` (a [`WorkItem`]) and, for a load,
/// `c` (the chunk payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkEntry {
    /// The entry id.
    pub id: u64,
    /// The `op` field.
    pub op: String,
    /// The `d` field, decoded.
    pub item: WorkItem,
    /// The `c` field.
    pub chunk: Option<Vec<u8>>,
}

/// The keys of one batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchDb {
    /// The state hash: projection fields and `k:<key>` idempotency keys.
    pub state: BTreeMap<String, String>,
    /// The event stream.
    pub events: Vec<Recorded>,
    /// The parked hashes, by generation: (seq, chunk payload) in insertion
    /// order, which is the order Redis answers HGETALL of a small hash in.
    pub parked: BTreeMap<u32, Vec<(String, Vec<u8>)>>,
    /// The number log (`accept.lua`, [`numbers`]): a frame per accepted
    /// chunk.
    pub numbers: Vec<u8>,
    /// Whether the state and events carry a retention TTL.
    pub expiring: bool,
}

/// The keys of one shard that the batch scripts touch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Db {
    /// Batches by id.
    pub batches: BTreeMap<String, BatchDb>,
    /// The work stream.
    pub work: Vec<WorkEntry>,
    /// The delayed-retry set's members (sent.lua's first poll).
    pub delayed: BTreeSet<Vec<u8>>,
    /// Batches in flight.
    pub active: BTreeSet<String>,
    /// The reports stream: (entry id, batch, report).
    pub reports: Vec<(u64, String, Event)>,
    /// The tombstones' members: batches reported (`settle.lua`).
    pub reported: BTreeSet<String>,
    /// The last entry id handed out.
    pub clock: u64,
    /// Whether events are not kept (only their keys and ids): the model
    /// checker's choice, since no decision reads the stream itself.
    pub skip_events: bool,
    /// The key and entry id of the last event a script appended (what the
    /// prelude answers as `w=<key>|<id>`): the worker acknowledges the entry
    /// it was handling only while that event is still recorded under that
    /// id. Reset by whoever reads it.
    pub last_event: Option<(String, String)>,
}

impl Db {
    /// The next entry id (XADD `*`).
    pub fn next_id(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Appends a work entry (an XADD to the work stream).
    pub fn add_work(&mut self, op: &str, item: WorkItem, chunk: Option<Vec<u8>>) {
        let id = self.next_id();
        self.work.push(WorkEntry {
            id,
            op: op.to_string(),
            item,
            chunk,
        });
    }

    /// A batch's keys (empty when it has none).
    pub fn batch(&self, batch: &str) -> Option<&BatchDb> {
        self.batches.get(batch)
    }

    /// A field of a batch's state hash.
    pub fn field(&self, batch: &str, field: &str) -> Option<&str> {
        self.batches
            .get(batch)
            .and_then(|b| b.state.get(field))
            .map(String::as_str)
    }
}

/// An entry id as Redis spells it.
pub fn entry_id(n: u64) -> String {
    format!("{n}-0")
}

/// One run of a batch script: the prelude's `emit`, `put` and `flush`.
/// Updates are collected and written at [`Run::flush`], as the prelude does,
/// so that reads inside a script never see its own writes.
pub(crate) struct Run<'a> {
    pub db: &'a mut Db,
    pub batch: String,
    updates: Vec<(String, String)>,
}

impl<'a> Run<'a> {
    pub(crate) fn new(db: &'a mut Db, batch: &str) -> Self {
        Run {
            db,
            batch: batch.to_string(),
            updates: Vec::new(),
        }
    }

    pub(crate) fn b(&mut self) -> &mut BatchDb {
        self.db.batches.entry(self.batch.clone()).or_default()
    }

    /// HGET of the state hash.
    pub(crate) fn get(&self, field: &str) -> Option<String> {
        self.db.field(&self.batch, field).map(str::to_string)
    }

    /// `num(HGET ...)`.
    pub(crate) fn num(&self, field: &str) -> i64 {
        num(self.get(field).as_deref())
    }

    /// `put(field, value)`.
    pub(crate) fn put(&mut self, field: impl Into<String>, value: impl ToString) {
        self.updates.push((field.into(), value.to_string()));
    }

    /// HINCRBY: written at once, unlike [`Run::put`].
    pub(crate) fn incr(&mut self, field: &str, by: i64) {
        let v = self.num(field) + by;
        self.b().state.insert(field.to_string(), v.to_string());
    }

    /// `emit(key, type, data, touch)`: returns the entry id.
    pub(crate) fn emit(&mut self, key: &str, event: Event, touch: bool) -> u64 {
        let id = self.db.next_id();
        if !self.db.skip_events {
            self.b().events.push(Recorded {
                id: entry_id(id),
                key: key.to_string(),
                event,
            });
        }
        self.put(field::key(key), entry_id(id));
        self.db.last_event = Some((key.to_string(), entry_id(id)));
        if touch {
            self.put(field::HEARTBEAT, id);
        }
        id
    }

    /// `flush()`: one HSET of every update, in order.
    pub(crate) fn flush(&mut self) {
        let updates = std::mem::take(&mut self.updates);
        if updates.is_empty() {
            return;
        }
        let b = self.b();
        for (f, v) in updates {
            b.state.insert(f, v);
        }
    }
}

/// Lua's `num`: a number, 0 when absent or not one.
pub fn num(v: Option<&str>) -> i64 {
    v.and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Lua's `tonumber` of a field: `None` when absent or not a number.
pub(crate) fn tonumber(v: Option<&str>) -> Option<i64> {
    v.and_then(|s| s.parse().ok())
}

/// A fresh work item (attempt 0), as the scripts pack it.
pub fn work_item(batch: &str, gen: u32, seq: Option<u32>, group: Option<&str>) -> WorkItem {
    WorkItem {
        batch: batch.to_string(),
        gen,
        seq,
        group_id: group.map(str::to_string),
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
        cursor: None,
    }
}

/// Strings of a reply.
pub(crate) fn reply<const N: usize>(fields: [&str; N]) -> Vec<String> {
    fields.iter().map(|s| s.to_string()).collect()
}
