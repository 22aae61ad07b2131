//! Where everything lives in Redis.
//!
//! Every key of one batch carries the same Redis Cluster hash tag, its
//! *shard's* tag (`{s<k>}`, see [`shard_tag`]), so that every server-side
//! script touches one slot. The work streams, dead letters and delayed
//! retries are per shard too: a worker reads every shard, and a script that
//! moves an entry from a batch's state to its shard's work stream never
//! crosses a slot.
//!
//! The tags of `n` shards are chosen so that their slots spread evenly over
//! the slot range: shard `k`'s slot lies in the `k`-th of `n` equal slices.
//! A cluster made by `redis-cli --cluster create` gives each master an equal
//! contiguous slice, so `n` shards over `n` masters (or any multiple) put the
//! same number of shards on every master without moving a slot.
//!
//! All keys start with a configurable prefix so that two deployments can share
//! a server.

use std::sync::Arc;

/// A batch's priority: which lane its work goes through (its options'
/// `priority`).
pub use crate::events::options::Priority;

pub use crate::batch_id::{validate_batch_id, BatchIdError, MAX_BATCH_ID_LEN};

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

/// How many hash slots a Redis Cluster has.
pub const CLUSTER_SLOTS: u16 = 16384;

/// The largest shard count: each shard needs a slice of at least 15 slots
/// for its tag (and every worker opens six readers per shard).
pub(crate) const MAX_SHARDS: u32 = 1024;

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
pub(crate) fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

/// The table of [`crc16`] (polynomial 0x1021), one entry per byte value.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The cluster hash slot of a key: CRC16 (XMODEM) of the key, or of its hash
/// tag (the part between the first `{` and the next `}`, when not empty),
/// modulo 16384. The same as `CLUSTER KEYSLOT`.
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % CLUSTER_SLOTS
}

/// The slots shard `k` of `n` may hash to: `[ceil(k·16384/n),
/// floor((k+1)·16384/n))`, the `k`-th of `n` equal slices without the
/// slot that sits on a boundary. `redis-cli --cluster create` rounds its
/// masters' boundaries to the nearest slot, so leaving out the boundary
/// slot keeps every tag inside its master's slice however the boundary was
/// rounded. `n` is at least 1 and at most [`MAX_SHARDS`].
pub(crate) fn shard_slots(k: u32, n: u32) -> std::ops::Range<u16> {
    let n = u64::from(n.clamp(1, MAX_SHARDS));
    let k = u64::from(k).min(n - 1);
    let slots = u64::from(CLUSTER_SLOTS);
    let lo = (k * slots).div_ceil(n);
    let hi = (k + 1) * slots / n;
    // Both are at most 16384 (k < n): they fit.
    lo as u16..hi as u16
}

/// The hash tag (without braces) of shard `k` of `n`: `s<k>` when its slot
/// lies in [`shard_slots`]`(k, n)`, else the first `s<k>-<j>` (j = 1, 2, …)
/// whose slot does. With one shard the tag is `s0`. Documented in
/// `schemas/README.md` so that producers in other languages compute the same
/// tag.
pub fn shard_tag(k: u32, n: u32) -> String {
    let range = shard_slots(k, n);
    let plain = format!("s{k}");
    if range.contains(&(crc16(plain.as_bytes()) % CLUSTER_SLOTS)) {
        return plain;
    }
    // Each candidate's slot is close to uniform over 16384 slots and a
    // slice has at least 15 of them: the search ends after about
    // 16384 / 15 candidates at worst.
    (1u64..)
        .map(|j| format!("s{k}-{j}"))
        .find(|t| range.contains(&(crc16(t.as_bytes()) % CLUSTER_SLOTS)))
        .unwrap_or(plain)
}

/// The shard count a process asks for (`--shards`, `GROUPCAST_SHARDS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardCount {
    /// The count the deployment recorded in Redis (see
    /// [`Keyspace::shard_count`]); when none is recorded yet, one per master
    /// on a cluster and 1 on a single server, recorded for every process
    /// after it.
    #[default]
    Auto,
    /// This many shards (1 to [`MAX_SHARDS`]): recorded when the deployment
    /// has no count yet, refused when it recorded another.
    Fixed(u32),
}

impl std::str::FromStr for ShardCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(ShardCount::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=MAX_SHARDS).contains(&n) => Ok(ShardCount::Fixed(n)),
            _ => Err(format!(
                "{s:?} is not a shard count: give `auto` or a number from 1 to {MAX_SHARDS}"
            )),
        }
    }
}

impl std::fmt::Display for ShardCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardCount::Auto => f.write_str("auto"),
            ShardCount::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Builds key names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    prefix: String,
    /// The hash tag of each shard ([`shard_tag`]), computed once.
    tags: Arc<[String]>,
}

/// The consumer group that reads the ingest streams.
pub const LOADERS_GROUP: &str = "loaders";
/// The consumer group that reads the work streams.
pub const OPERATORS_GROUP: &str = "operators";

impl Keyspace {
    /// A keyspace with the given prefix (default `gc`) and shard count,
    /// taken between 1 and [`MAX_SHARDS`].
    pub fn new(prefix: impl Into<String>, shards: u32) -> Self {
        let n = shards.clamp(1, MAX_SHARDS);
        Keyspace {
            prefix: prefix.into(),
            tags: (0..n).map(|k| shard_tag(k, n)).collect(),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many shards the keyspace has.
    pub fn shards(&self) -> u32 {
        // At most MAX_SHARDS tags: the length fits.
        self.tags.len() as u32
    }

    /// The shard a batch lives on.
    pub fn shard_of(&self, batch: &str) -> u32 {
        shard_of(batch, self.shards())
    }

    /// The hash tag of shard `shard` (without braces; see [`shard_tag`]).
    pub fn tag(&self, shard: u32) -> std::borrow::Cow<'_, str> {
        match self.tags.get(shard as usize) {
            Some(t) => std::borrow::Cow::Borrowed(t),
            // A shard number past the count (a caller's bug) gets a tag no
            // shard of this keyspace has, never another shard's, nor a panic.
            None => std::borrow::Cow::Owned(format!("s{shard}")),
        }
    }

    /// Where the deployment records its shard count (a plain string key,
    /// outside every shard; see `store::shards`).
    pub fn shard_count(&self) -> String {
        format!("{}:shards", self.prefix)
    }

    fn shard_key(&self, shard: u32, name: &str) -> String {
        format!("{}:{{{}}}:{}", self.prefix, self.tag(shard), name)
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
    /// acknowledged events Redis lost (see `store::durability::witness`).
    pub(crate) fn lost_writes(&self, shard: u32) -> String {
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
    pub(crate) fn batch_in(&self, batch: &str, lane: Priority) -> BatchKeys {
        let shard = self.shard_of(batch);
        let base = self.shard_key(shard, &format!("b:{batch}"));
        BatchKeys {
            shard,
            state: base.clone(),
            events: format!("{base}:events"),
            parked_prefix: format!("{base}:parked:"),
            numbers: format!("{base}:numbers"),
            results: format!("{base}:results"),
            delivery: format!("{base}:delivery"),
            front: format!("{base}:front"),
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
    /// The provider's request rate learned from its `429`s under
    /// `--rate-limit auto` (see `streams/scripts/learn_rate.lua`).
    pub fn learned_rate(&self) -> String {
        format!("{}:{{limiter}}:learned", self.prefix)
    }
    /// When a lane is next owed a slot of its guaranteed share of the
    /// limiter (see `streams/scripts/rate_limit.lua`), in the limiter's slot.
    pub fn limiter_share(&self, lane: Priority) -> String {
        format!("{}:{{limiter}}:share:{}", self.prefix, lane.name())
    }
    /// The key a `WAITAOF` round writes before it waits (see
    /// [`crate::store::durability::aof`]); expires a minute after the last round.
    pub(crate) fn fsync_marker(&self) -> String {
        format!("{}:{{fsync}}:marker", self.prefix)
    }

    /// How fast each server process's `WAITAOF` confirms (a hash: the
    /// server's `run_id` to milliseconds), so that only the first worker
    /// to start against a server measures it (see
    /// [`crate::store::Store::waitaof_confirmation_delay`]).
    pub(crate) fn fsync_measured(&self) -> String {
        format!("{}:{{fsync}}:measured", self.prefix)
    }

    /// The lock that lets one watchdog scan at a time.
    pub fn watchdog_lock(&self) -> String {
        format!("{}:{{watchdog}}:lock", self.prefix)
    }
    /// Every shard's stream of a kind, for readers that go over all shards.
    pub fn all(&self, f: impl Fn(&Self, u32) -> String) -> Vec<String> {
        (0..self.shards()).map(|s| f(self, s)).collect()
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
    /// The batch's number log: the numbers given to it so far, a frame per
    /// accepted chunk (batch-wide dedupe; see `protocol::numbers`), until
    /// its report.
    pub numbers: String,
    /// The recipients' outcomes other than delivered, one field per number
    /// (see `track_page.lua`), until `--results-retention` after the
    /// delivery report.
    pub results: String,
    /// Delivery tracking's counts, one field per page of a group's message
    /// list (`<gen>|<page>` → `<delivered>|<failed>|<unknown>|<code>=<n>,...`).
    pub delivery: String,
    /// What the HTTP front door (`groupcast serve`) keeps of the batch: its
    /// definition (template and options) and the digest of each seq it
    /// was given, so that a conflicting repeat is refused at once (see
    /// [`crate::store::front`]).
    pub front: String,
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
        let tag = format!("{{{}}}", ks.tag(k.shard));
        for key in [
            &k.state,
            &k.events,
            &k.parked(3),
            &k.work,
            &k.delayed,
            &k.active,
            &k.reports,
            &k.numbers,
            &k.results,
            &k.delivery,
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
        assert_eq!(ks.ingest_in(2, Priority::Normal), "gc:{s2-1}:ingest");
        assert_eq!(ks.work_in(2, Priority::Normal), "gc:{s2-1}:work");
        assert_eq!(ks.ingest_in(2, Priority::Urgent), "gc:{s2-1}:ingest:urgent");
        assert_eq!(ks.work_in(2, Priority::Bulk), "gc:{s2-1}:work:bulk");
        assert_eq!(ks.batch("x").work, ks.work(ks.shard_of("x")));
    }

    #[test]
    fn shard_hash_is_fnv1a() {
        // FNV-1a 32 of "a" is 0xe40c292c (published test vector).
        assert_eq!(shard_of("a", 0xffff_fff0), 0xe40c_292c);
        assert_eq!(shard_of("anything", 1), 0);
    }

    #[test]
    fn hash_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(
            hash_slot(b"foo{}{bar}"),
            crc16(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
        assert_eq!(hash_slot(b"gc:{s3}:b:x:events"), hash_slot(b"s3"));
        // The published check value of CRC16/XMODEM.
        assert_eq!(crc16(b"123456789"), 0x31c3);
    }

    #[test]
    fn every_shards_tag_hashes_into_its_own_slice() {
        let counts = (1..=64).chain([96, 100, 128, 255, 256, 500, 1000, MAX_SHARDS]);
        for n in counts {
            let ks = Keyspace::new("gc", n);
            assert_eq!(ks.shards(), n);
            let mut seen = std::collections::BTreeSet::new();
            let mut end = 0;
            for k in 0..n {
                let range = shard_slots(k, n);
                // The slices are in order, disjoint, and miss at most the
                // one boundary slot each.
                assert!(range.start >= end && range.start <= end + 1, "n={n} k={k}");
                assert!(range.len() >= 15, "n={n} k={k}: {range:?}");
                end = range.end;
                let tag = ks.tag(k);
                let slot = hash_slot(format!("gc:{{{tag}}}:work").as_bytes());
                assert!(range.contains(&slot), "n={n} k={k}: {tag} at {slot}");
                assert!(tag == format!("s{k}") || tag.starts_with(&format!("s{k}-")));
                assert!(seen.insert(tag.into_owned()), "n={n}: tag of {k} repeats");
            }
            assert!(end >= CLUSTER_SLOTS - 1, "n={n}: slices end at {end}");
        }
    }

    #[test]
    fn shard_counts_parse_auto_or_a_number_in_range() {
        assert_eq!("auto".parse(), Ok(ShardCount::Auto));
        assert_eq!(" AUTO ".parse(), Ok(ShardCount::Auto));
        assert_eq!("3".parse(), Ok(ShardCount::Fixed(3)));
        assert_eq!("1024".parse(), Ok(ShardCount::Fixed(MAX_SHARDS)));
        for bad in ["0", "1025", "-1", "three", ""] {
            let e = bad.parse::<ShardCount>().expect_err(bad);
            assert!(e.contains("from 1 to 1024"), "{e}");
        }
        assert_eq!(ShardCount::Fixed(6).to_string(), "6");
        assert_eq!(ShardCount::default().to_string(), "auto");
    }

    #[test]
    fn one_shard_keeps_the_tag_s0() {
        assert_eq!(shard_tag(0, 1), "s0");
        let ks = Keyspace::new("gc", 1);
        assert_eq!(ks.ingest(0), "gc:{s0}:ingest");
        assert_eq!(ks.batch("b1").state, "gc:{s0}:b:b1");
        // Out of range counts are clamped, and a shard past the count gets
        // no other shard's tag.
        assert_eq!(Keyspace::new("gc", 0).shards(), 1);
        assert_eq!(Keyspace::new("gc", MAX_SHARDS + 1).shards(), MAX_SHARDS);
        assert_eq!(Keyspace::new("gc", 2).work(5), "gc:{s5}:work");
    }

    /// The slot slices `redis-cli --cluster create` gives `masters` masters
    /// (redis-cli.c, `clusterManagerCommandCreate`, single-precision floats
    /// as there).
    fn redis_cli_slices(masters: u32) -> Vec<std::ops::RangeInclusive<u16>> {
        let per = 16384.0f32 / masters as f32;
        let (mut first, mut cursor) = (0i64, 0.0f32);
        let mut out = Vec::new();
        for i in 0..masters {
            let mut last = (cursor + per - 1.0).round() as i64;
            if last > 16384 || i == masters - 1 {
                last = 16383;
            }
            last = last.max(first);
            out.push(first as u16..=last as u16);
            first = last + 1;
            cursor += per;
        }
        out
    }

    #[test]
    fn shards_of_a_multiple_of_the_masters_fall_evenly_on_a_created_cluster() {
        for masters in 3..=32u32 {
            let slices = redis_cli_slices(masters);
            for per_master in [1, 2, 3] {
                let n = masters * per_master;
                let ks = Keyspace::new("gc", n);
                let mut on = vec![0u32; masters as usize];
                for k in 0..n {
                    let slot = hash_slot(ks.work(k).as_bytes());
                    let m = slices
                        .iter()
                        .position(|r| r.contains(&slot))
                        .expect("every slot has a master");
                    on[m] += 1;
                }
                assert!(
                    on.iter().all(|&c| c == per_master),
                    "{n} shards on {masters} masters: {on:?}"
                );
            }
        }
    }
}
