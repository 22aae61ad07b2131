//! Where everything lives in Redis.
//!
//! Every key of one batch carries the same Redis Cluster hash tag, the batch's
//! *shard* (`{s<k>}`), so that every server-side script touches one slot. The
//! work streams, dead letters and delayed retries are per shard too: a worker
//! reads every shard, and a script that moves an entry from a batch's state to
//! its shard's work stream never crosses a slot.
//!
//! All keys start with a configurable prefix so that two deployments can share
//! a server.

use thiserror::Error;

/// A batch's priority: which lane its work goes through (its options'
/// `priority`).
pub use crate::events::options::Priority;

/// Longest accepted batch id, in bytes.
pub const MAX_BATCH_ID_LEN: usize = 128;

/// Why a batch id was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BatchIdError {
    /// The id is empty.
    #[error("batch id is empty")]
    Empty,
    /// The id is longer than [`MAX_BATCH_ID_LEN`].
    #[error("batch id is {0} bytes long; at most {MAX_BATCH_ID_LEN} are allowed")]
    TooLong(usize),
    /// The id has a character outside `[A-Za-z0-9._-]`.
    #[error(
        "batch id has the character {0:?}; only letters, digits, '.', '_' and '-' are allowed"
    )]
    BadChar(char),
}

/// Checks a batch id. Only `[A-Za-z0-9._-]` is allowed, so that an id can
/// never open or close a hash tag (`{`, `}`), add a key separator (`:`), or
/// smuggle in whitespace or glob characters.
pub fn validate_batch_id(id: &str) -> Result<(), BatchIdError> {
    if id.is_empty() {
        return Err(BatchIdError::Empty);
    }
    if id.len() > MAX_BATCH_ID_LEN {
        return Err(BatchIdError::TooLong(id.len()));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(BatchIdError::BadChar(c));
    }
    Ok(())
}

/// The shard of a batch: FNV-1a (32-bit) of the batch id's bytes, modulo the
/// shard count. Documented in `schemas/README.md` so that producers in other
/// languages compute the same shard.
pub fn shard_of(batch: &str, shards: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in batch.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % shards.max(1)
}

/// Builds key names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    prefix: String,
    shards: u32,
}

/// The consumer group that reads the ingest streams.
pub const LOADERS_GROUP: &str = "loaders";
/// The consumer group that reads the work streams.
pub const OPERATORS_GROUP: &str = "operators";

impl Keyspace {
    /// A keyspace with the given prefix (default `gc`) and shard count (≥ 1).
    pub fn new(prefix: impl Into<String>, shards: u32) -> Self {
        Keyspace {
            prefix: prefix.into(),
            shards: shards.max(1),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many shards the keyspace has.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The shard a batch lives on.
    pub fn shard_of(&self, batch: &str) -> u32 {
        shard_of(batch, self.shards)
    }

    fn shard_key(&self, shard: u32, name: &str) -> String {
        format!("{}:{{s{}}}:{}", self.prefix, shard, name)
    }

    /// The ingest stream of a shard: where producers append chunks (the
    /// normal lane's; see [`ingest_in`](Self::ingest_in)).
    pub fn ingest(&self, shard: u32) -> String {
        self.shard_key(shard, "ingest")
    }
    /// The work stream of a shard: provider operations to run (the normal
    /// lane's; see [`work_in`](Self::work_in)).
    pub fn work(&self, shard: u32) -> String {
        self.shard_key(shard, "work")
    }
    /// The ingest stream of a shard's lane: the normal lane's is
    /// [`ingest`](Self::ingest) (`…:ingest`), the others' carry the
    /// priority's name (`…:ingest:urgent`, `…:ingest:bulk`).
    pub fn ingest_in(&self, shard: u32, lane: Priority) -> String {
        self.lane_key(shard, "ingest", lane)
    }
    /// The work stream of a shard's lane, named like
    /// [`ingest_in`](Self::ingest_in)'s.
    pub fn work_in(&self, shard: u32, lane: Priority) -> String {
        self.lane_key(shard, "work", lane)
    }
    fn lane_key(&self, shard: u32, name: &str, lane: Priority) -> String {
        match lane {
            Priority::Normal => self.shard_key(shard, name),
            _ => self.shard_key(shard, &format!("{name}:{}", lane.name())),
        }
    }
    /// The delayed retries of a shard: a sorted set scored by due time (ms).
    pub fn delayed(&self, shard: u32) -> String {
        self.shard_key(shard, "delayed")
    }
    /// The dead-letter stream of a shard.
    pub fn dead_letters(&self, shard: u32) -> String {
        self.shard_key(shard, "dlq")
    }
    /// The report stream of a shard: one entry per decided batch.
    pub fn reports(&self, shard: u32) -> String {
        self.shard_key(shard, "reports")
    }
    /// The lost-writes stream of a shard: one entry per batch whose
    /// acknowledged events Redis lost (see `store::witness`).
    pub fn lost_writes(&self, shard: u32) -> String {
        self.shard_key(shard, "lost")
    }
    /// The set of batches of a shard that have not reported yet.
    pub fn active(&self, shard: u32) -> String {
        self.shard_key(shard, "active")
    }
    /// The tombstones of a shard: a sorted set of reported (or closed)
    /// batch ids, scored by when they reported (ms). A batch id is kept
    /// after its events expire, for `--remember`, so that late copies of its
    /// chunks are refused instead of sent again.
    pub fn reported(&self, shard: u32) -> String {
        self.shard_key(shard, "reported")
    }

    /// The keys of one batch of the normal lane.
    pub fn batch(&self, batch: &str) -> BatchKeys {
        self.batch_in(batch, Priority::Normal)
    }

    /// The keys of one batch whose work goes through `lane`.
    pub fn batch_in(&self, batch: &str, lane: Priority) -> BatchKeys {
        let shard = self.shard_of(batch);
        let base = format!("{}:{{s{}}}:b:{}", self.prefix, shard, batch);
        BatchKeys {
            shard,
            state: base.clone(),
            events: format!("{base}:events"),
            parked_prefix: format!("{base}:parked:"),
            dedupe: format!("{base}:dedupe"),
            reported: self.reported(shard),
            work: self.work_in(shard, lane),
            lane,
            delayed: self.delayed(shard),
            active: self.active(shard),
            reports: self.reports(shard),
        }
    }

    /// The shared provider rate limiter's key (one slot of its own).
    pub fn limiter(&self) -> String {
        format!("{}:{{limiter}}:provider", self.prefix)
    }
    /// When a lane is next owed a slot of its guaranteed share of the
    /// limiter (see `streams/scripts/rate_limit.lua`), in the limiter's slot.
    pub fn limiter_share(&self, lane: Priority) -> String {
        format!("{}:{{limiter}}:share:{}", self.prefix, lane.name())
    }
    /// The key a `WAITAOF` round writes before it waits (see
    /// [`crate::store::aof`]); expires a minute after the last round.
    pub fn fsync_marker(&self) -> String {
        format!("{}:{{fsync}}:marker", self.prefix)
    }

    /// The lock that lets one watchdog scan at a time.
    pub fn watchdog_lock(&self) -> String {
        format!("{}:{{watchdog}}:lock", self.prefix)
    }
    /// Every shard's stream of a kind, for readers that go over all shards.
    pub fn all(&self, f: impl Fn(&Self, u32) -> String) -> Vec<String> {
        (0..self.shards).map(|s| f(self, s)).collect()
    }
}

/// The keys of one batch, all on the batch's shard slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchKeys {
    /// The shard number.
    pub shard: u32,
    /// The batch's state hash: the projection and the idempotency keys.
    pub state: String,
    /// The batch's event stream: its source of truth.
    pub events: String,
    /// Prefix of the per-generation hashes of parked chunk payloads.
    pub parked_prefix: String,
    /// The numbers given to the batch so far (batch-wide dedupe; see
    /// `accept.lua`), until its report.
    pub dedupe: String,
    /// The shard's tombstones (see [`Keyspace::reported`]).
    pub reported: String,
    /// The work stream of the shard's lane that the batch's work goes
    /// through.
    pub work: String,
    /// That lane.
    pub lane: Priority,
    /// The shard's delayed retries.
    pub delayed: String,
    /// The shard's set of active batches.
    pub active: String,
    /// The shard's report stream.
    pub reports: String,
}

impl BatchKeys {
    /// The hash of chunks parked while generation `gen` has no group.
    pub fn parked(&self, gen: u32) -> String {
        format!("{}{}", self.parked_prefix, gen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_ids_cannot_break_out_of_their_key() {
        assert!(validate_batch_id("camp-2026.11_29").is_ok());
        assert_eq!(validate_batch_id(""), Err(BatchIdError::Empty));
        assert_eq!(validate_batch_id("a}b"), Err(BatchIdError::BadChar('}')));
        assert_eq!(validate_batch_id("a:b"), Err(BatchIdError::BadChar(':')));
        assert_eq!(validate_batch_id("a b"), Err(BatchIdError::BadChar(' ')));
        assert!(matches!(
            validate_batch_id(&"x".repeat(129)),
            Err(BatchIdError::TooLong(129))
        ));
    }

    #[test]
    fn every_key_of_a_batch_shares_one_hash_tag() {
        let ks = Keyspace::new("gc", 16);
        let k = ks.batch("campaign-7");
        let tag = format!("{{s{}}}", k.shard);
        for key in [
            &k.state,
            &k.events,
            &k.parked(3),
            &k.work,
            &k.delayed,
            &k.active,
            &k.reports,
            &k.dedupe,
            &k.reported,
            &ks.batch_in("campaign-7", Priority::Urgent).work,
            &ks.ingest_in(k.shard, Priority::Bulk),
        ] {
            assert!(key.contains(&tag), "{key} lacks {tag}");
        }
    }

    #[test]
    fn the_normal_lane_keeps_the_plain_names() {
        let ks = Keyspace::new("gc", 4);
        assert_eq!(ks.ingest_in(2, Priority::Normal), "gc:{s2}:ingest");
        assert_eq!(ks.work_in(2, Priority::Normal), "gc:{s2}:work");
        assert_eq!(ks.ingest_in(2, Priority::Urgent), "gc:{s2}:ingest:urgent");
        assert_eq!(ks.work_in(2, Priority::Bulk), "gc:{s2}:work:bulk");
        assert_eq!(ks.batch("x").work, ks.work(ks.shard_of("x")));
    }

    #[test]
    fn shard_hash_is_fnv1a() {
        // FNV-1a 32 of "a" is 0xe40c292c (published test vector).
        assert_eq!(shard_of("a", 0xffff_fff0), 0xe40c_292c);
        assert_eq!(shard_of("anything", 1), 0);
    }
}
