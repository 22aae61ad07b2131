//! One batch's log: typed calls to the batch scripts, and reads of its state
//! and events.

use crate::events::options::SendWindow;
use crate::protocol::accept::{AcceptArgs, DedupeClaim};
pub use crate::protocol::claim_send::{ClaimArgs, ClaimMode};
use crate::protocol::numbers::View;
use redis::{AsyncCommands, Value};

use super::scripts::{Call, Declared, SCRIPTS};
use super::{RedisConn, Store, StoreError, StoreResult};
use crate::events::{ChunkLoaded, Event, Recorded};
use crate::keys::BatchKeys;
use crate::keys::Priority;
use crate::projection::{self, event_key, field, Projection, Update};

pub use crate::protocol::BatchPolicy;

use crate::protocol::numbers::RECORD;

/// How many times a chunk's accept reads on after `behind` before its
/// entry is left for later ([`StoreError::Behind`]).
const BEHIND_ROUNDS: u32 = 16;

/// A recipient number as `accept.lua`'s dedupe record, 5 bytes big-endian.
/// Up to 11 ASCII digits (every number the provider accepts: see
/// [`crate::phone`]) it is exact: the digits read as one integer after a
/// leading `1` (so that leading zeros count), below 2·10¹¹. Anything else
/// (the provider refuses it with `1062` anyway) is a 39-bit FNV-1a hash
/// placed above 2³⁹: it can never match a valid number, and two such strings
/// that collide only count the second as a duplicate instead of a failure.
pub(crate) fn dedupe_record(to: &str) -> [u8; RECORD] {
    let exact = !to.is_empty() && to.len() <= 11 && to.bytes().all(|b| b.is_ascii_digit());
    let v = match exact {
        true => to.bytes().fold(1u64, |v, d| v * 10 + u64::from(d - b'0')),
        false => {
            let h = to.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            (1 << 39) | (h & ((1 << 39) - 1))
        }
    };
    let b = v.to_be_bytes();
    let mut r = [0u8; RECORD];
    r.copy_from_slice(&b[8 - RECORD..]);
    r
}

/// The dedupe records of a chunk's numbers, in order (see [`dedupe_record`]).
pub fn dedupe_records<'a>(numbers: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    numbers.into_iter().flat_map(dedupe_record).collect()
}

/// What `accept.lua` made of a caller's claim on the batch's number log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The claim was on the log's end: the script decided.
    Took(Accepted),
    /// The log had moved on (nothing recorded): what the claim's view
    /// missed, read from its stamp on ([`View::extend`] takes it).
    Behind {
        /// The log from the view's length less a stamp, to its end.
        missed: Vec<u8>,
    },
}

/// A chunk waiting in its batch's line to be accepted
/// ([`BatchLog::accept_chunk`]), with where its answer goes.
pub(crate) struct Waiting {
    /// The chunk.
    chunk: WaitingChunk,
    /// The generation its caller last saw for the batch.
    hint: u32,
    /// Its answer (the caller may have gone: then nobody reads it).
    answer: tokio::sync::oneshot::Sender<StoreResult<Accepted>>,
}

/// [`AcceptArgs`], owned: it waits for another task to ask for it.
struct WaitingChunk {
    seq: u32,
    last: bool,
    records: Vec<u8>,
    digest: String,
    cap: u64,
    opts: String,
}

impl WaitingChunk {
    /// The chunk as `accept.lua`'s arguments.
    fn args(&self) -> AcceptArgs<'_> {
        AcceptArgs {
            seq: self.seq,
            last: self.last,
            records: &self.records,
            digest: &self.digest,
            cap: self.cap,
            opts: &self.opts,
        }
    }
}

/// `behind` carries the log's bytes the view missed (its third element):
/// taken out of `v` before the reply is read as text.
fn take_missed(v: &mut Value) -> StoreResult<Option<Vec<u8>>> {
    match v {
        Value::Array(items) if is_bulk(items.first(), "behind") && items.len() > 2 => {
            match items.remove(2) {
                Value::BulkString(b) => Ok(Some(b)),
                _ => Err(unexpected("accept", &["behind".to_string()])),
            }
        }
        _ => Ok(None),
    }
}

/// One chunk's answer from `accept.lua`, `r` (its text) and `missed` (what
/// a `behind` carries).
fn claimed(r: &[String], missed: Option<Vec<u8>>) -> StoreResult<Claimed> {
    let gen = |s: &str| s.parse::<u32>().map_err(|_| unexpected("accept", r));
    let dups = |s: &str| positions(s).ok_or_else(|| unexpected("accept", r));
    Ok(Claimed::Took(match r {
        [t, g, group, _, d] if t == "assigned" => Accepted::Assigned {
            gen: gen(g)?,
            group: opt(group),
            duplicates: dups(d)?,
        },
        [t, g, group, l, d] if t == "duplicate" => Accepted::Duplicate {
            gen: gen(g)?,
            group: opt(group),
            loaded: l == "1",
            duplicates: dups(d)?,
        },
        [t, why] if t == "conflict" => Accepted::Conflict(why.clone()),
        [t, why] if t == "rejected" => Accepted::Rejected(why.clone()),
        [t, why] if t == "refused" => Accepted::Refused(why.clone()),
        [t, _] if t == "behind" => {
            return Ok(Claimed::Behind {
                missed: missed.unwrap_or_default(),
            })
        }
        _ => return Err(unexpected("accept", r)),
    }))
}

/// Whether `v` is the bulk string `s`.
fn is_bulk(v: Option<&Value>, s: &str) -> bool {
    matches!(v, Some(Value::BulkString(b)) if b == s.as_bytes())
}

/// What `accept` decided for a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Newly assigned to `gen`; `group` is its group when it already has one.
    Assigned {
        /// The generation.
        gen: u32,
        /// Its group, if recorded.
        group: Option<String>,
        /// Positions of recipients whose number the batch already had: not
        /// to be sent.
        duplicates: Vec<u32>,
    },
    /// Seen before with the same content.
    Duplicate {
        /// The generation it was assigned to.
        gen: u32,
        /// Its group, if recorded.
        group: Option<String>,
        /// Whether its loaded event exists.
        loaded: bool,
        /// As for [`Accepted::Assigned`].
        duplicates: Vec<u32>,
    },
    /// Seen before with other content (recorded as `input_rejected`).
    Conflict(String),
    /// Refused against the batch's state (beyond the last seq, ...;
    /// recorded as `input_rejected`).
    Rejected(String),
    /// The batch has ended (reported, closed, or settled without this seq):
    /// nothing recorded; the chunk goes to the dead letters.
    Refused(String),
}

/// What `reject` did with a chunk refused before acceptance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// Recorded as `input_rejected` (once).
    Recorded,
    /// The batch has ended: nothing recorded.
    Refused(String),
}

/// What `close` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// Closed (now or before): `missing` seqs were given up on.
    Closed {
        /// Seqs that never arrived.
        missing: u64,
    },
    /// The batch had already reported: nothing to close.
    AlreadyReported(String),
    /// No chunk of the batch was ever recorded (or its events expired).
    Unknown,
}

/// What `seal` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sealing {
    /// The batch ends at this seq (sealed now, or it already was, by a seal
    /// or a chunk flagged `last`).
    Sealed(u32),
    /// Refused: it contradicts what the batch knows (another last seq, or
    /// a higher seq already received). Nothing changed.
    Conflict(String),
    /// Refused: the batch has ended (reported, cancelled or closed).
    Ended(String),
}

/// What `cancel` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelling {
    /// Cancelled (now or before): `stopped` generations will never be sent
    /// (their groups are deleted); generations whose send was claimed are
    /// sent and counted.
    Cancelled {
        /// Generations stopped.
        stopped: u32,
        /// Recipients registered in them (never sent).
        unsent: u64,
        /// Whether any chunk of the batch was recorded before the cancel:
        /// `false` for a batch never seen, which is remembered as cancelled
        /// (it reports at once) so that its chunks are refused when they come.
        seen: bool,
    },
    /// The batch had reported before: nothing to stop.
    AlreadyReported(String),
    /// The batch reported and its events expired: only its tombstone is
    /// left, nothing to stop.
    Forgotten,
}

/// What `claim_send` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The send is claimed (now, or a claim in place renewed): go on and
    /// send, starting the provider call before `until_ms`.
    Claimed {
        /// The claim's entry id, which the send must see on disk first.
        id: String,
        /// The claim's number (its event key is
        /// [`claim_key`](crate::protocol::claim_send::claim_key)`(gen, n)`).
        n: u32,
        /// The claim's lifetime ends (Redis ms): the send must start before.
        until_ms: u64,
        /// The Redis clock when the script ran (ms).
        now_ms: u64,
        /// Whether a claim in place was renewed (else a new one was taken).
        renewed: bool,
    },
    /// A check found the schedule lets the send go (nothing claimed).
    Free,
    /// The batch's schedule holds the send until `at_ms` (Redis ms).
    Held {
        /// The release instant.
        at_ms: u64,
        /// `send_at` or `quiet_hours`.
        reason: String,
        /// The Redis clock when the script ran (ms).
        now_ms: u64,
        /// A claim in place was given back.
        given_back: bool,
    },
    /// The quiet window passed does not cover the Redis clock any more:
    /// compute it again.
    Stale,
    /// The batch was cancelled before any claim was in place, or a claim in
    /// place was given back in a cancelled batch (the generation stopped):
    /// never send (the reason).
    Cancelled(String),
    /// The generation was sent or is done: nothing to claim.
    Done,
}

/// What `loaded` recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loading {
    /// Appended; whether the generation became ready.
    Loaded {
        /// The generation is complete: its send was enqueued.
        ready: bool,
    },
    /// Appended before.
    Duplicate,
    /// The batch was cancelled: nothing recorded (its generation not sent
    /// is done).
    Cancelled,
}

/// What `park` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parked {
    /// Parked; a create-group work item exists.
    Parked,
    /// The group appeared meanwhile: load into it now.
    Group(String),
    /// The chunk is already loaded.
    AlreadyLoaded,
    /// The chunk is not assigned to this generation (its assignment was
    /// lost with Redis's unsynced writes): nothing parked; accept it again.
    Unassigned,
    /// The generation's group can never be created (its creation was given
    /// up, see [`BatchLog::fail_generation`]): nothing parked; record the
    /// chunk as given up.
    Failed,
    /// The batch was cancelled or reported: nothing parked, nothing asked
    /// of the provider; the chunk ends here.
    Ended,
}

/// What `record_group` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupRecord {
    /// Ours was recorded.
    Won,
    /// Another was recorded first: ours must be deleted.
    Lost {
        /// The group kept.
        kept: String,
    },
    /// The batch was cancelled: nothing recorded; ours must be deleted.
    Cancelled,
    /// The generation's creation was given up meanwhile: nothing recorded;
    /// ours must be deleted.
    Failed,
}

/// What giving up a generation's creation came to (see
/// [`BatchLog::fail_generation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GenerationFailure {
    /// Recorded: the generation is closed and these many parked chunks were
    /// released to be recorded as given up.
    Failed {
        /// Parked chunks released.
        released: u32,
    },
    /// It was recorded before.
    AlreadyFailed,
    /// A group was recorded meanwhile (a racer's create): nothing given up.
    HasGroup(String),
    /// The batch was reported or cancelled: nothing recorded (its parked
    /// chunks are dropped).
    Ended,
}

/// What recording a send came to (see [`BatchLog::record_sent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendRecord {
    /// Recorded now; its first poll scheduled.
    Recorded,
    /// Recorded before.
    Duplicate,
    /// The generation is done (its send record lost with Redis's unsynced
    /// writes while its poll went on): nothing recorded, no poll.
    Done,
}

/// What giving up a generation's send, poll or recall came to (see
/// [`BatchLog::give_up_send`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendGiveUp {
    /// Done `unsent`: nothing went out; these many registered recipients
    /// were never sent to.
    Unsent(u64),
    /// The send may have gone out (its claim was in place): a `recall` work
    /// item asks the provider.
    Recalling,
    /// Done `unknown`: these many registered recipients' fate is unknown.
    Unknown(u64),
    /// The send was recorded: nothing given up (its poll goes on).
    Sent,
    /// The generation was done: nothing recorded.
    Done,
    /// What the item rested on is not recorded (lost with Redis's unsynced
    /// writes): nothing given up; the generation gets its own items again.
    Stale,
}

/// Whether an append happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Appended {
    /// Appended as this entry id.
    New(String),
    /// The key was appended before, as this entry id.
    Duplicate(String),
}

/// How [`BatchLog::rebuild`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuilt {
    /// The state was replaced by the fold of every event, with no event
    /// appended in between; `retries`: how many times events appended while
    /// it read made it fold them in and try again.
    Replaced {
        /// Fields of the rebuilt state.
        fields: usize,
        /// Tries lost to concurrent appends.
        retries: u32,
    },
    /// Some events do not decode (entry id, why): nothing was written.
    Undecodable(Vec<(String, String)>),
    /// Events kept being appended through every try: nothing was written.
    Busy {
        /// Tries made.
        tries: u32,
    },
}

/// What the watchdog's stalled append did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Stalled {
    /// Appended as this entry id.
    Appended(String),
    /// This stall was recorded before, as this entry id.
    Duplicate(String),
    /// The batch has its report: it is not stalled.
    Reported,
    /// The heartbeat moved on: the batch woke up.
    Fresh,
}

/// What recording a finished group decided (see `completed.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Recorded; other groups of the batch are still to finish.
    Completed,
    /// Recorded, and it was the last one: the batch's report was decided.
    Reported,
    /// Recorded before.
    Duplicate,
    /// Not recorded: the generation's send is not on record (Redis lost it
    /// with its unsynced writes while the poll went on). The send item,
    /// redelivered, records it and a poll of its own.
    NotSent,
}

/// The log of one batch.
#[derive(Clone)]
pub struct BatchLog {
    pub(super) conn: RedisConn,
    witnesses: std::sync::Arc<super::durability::witness::Witnesses>,
    /// This process's views of the batches' number logs.
    numbers: std::sync::Arc<super::numbers::NumberViews<Waiting>>,
    pub(super) policy: BatchPolicy,
    /// The batch id.
    pub batch: String,
    /// Its keys.
    pub keys: BatchKeys,
}

/// The key and entry id of the last event a script appended, if any.
type LastEvent = Option<(String, String)>;

/// A script's reply, without its trailing elements: `ev=<types>`, whose
/// event types are counted in `groupcast_events_appended_total`, and, when an
/// event was appended, `w=<key>|<entry id>` of the last one (returned). A
/// reply that does not start with one of the script's declared tags is
/// refused here, so every decoder below matches declared tags only.
fn strings(script: &Declared, v: Value) -> StoreResult<(Vec<String>, LastEvent)> {
    let name = script.declaration.name;
    let mut r = redis::from_redis_value::<Vec<String>>(v.clone()).map_err(|_| {
        StoreError::UnexpectedReply {
            script: name,
            reply: format!("{v:?}"),
        }
    })?;
    let mut witness = None;
    if r.len() >= 2 && r[r.len() - 2].starts_with("ev=") {
        if let Some((key, id)) = r
            .last()
            .and_then(|l| l.strip_prefix("w="))
            .and_then(|w| w.rsplit_once('|'))
        {
            witness = Some((key.to_string(), id.to_string()));
            r.pop();
        }
    }
    if let Some(types) = r.last().and_then(|l| l.strip_prefix("ev=")) {
        for t in types.split(',').filter(|t| !t.is_empty()) {
            metrics::counter!("groupcast_events_appended_total", "type" => t.to_string())
                .increment(1);
        }
        r.pop();
    }
    let declared = script.declaration.replies;
    if !r
        .first()
        .is_some_and(|tag| declared.contains(&tag.as_str()))
    {
        return Err(unexpected(name, &r));
    }
    Ok((r, witness))
}

pub(super) fn unexpected(script: &'static str, reply: &[String]) -> StoreError {
    StoreError::UnexpectedReply {
        script,
        reply: reply.join(" "),
    }
}

fn opt(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// `accept.lua`'s duplicate positions, `1,7`.
fn positions(s: &str) -> Option<Vec<u32>> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().ok())
        .collect()
}

impl Store {
    /// The log of a batch (the id must have been validated), whose work
    /// items go to the normal lane.
    pub fn batch(&self, batch: &str) -> BatchLog {
        self.batch_in(batch, Priority::Normal)
    }

    /// The log of a batch whose work items go to `lane`'s work stream: the
    /// lane of the entry the caller is handling.
    pub(crate) fn batch_in(&self, batch: &str, lane: Priority) -> BatchLog {
        BatchLog {
            conn: self.conn.clone(),
            witnesses: self.witnesses.clone(),
            numbers: self.numbers.clone(),
            policy: self.policy,
            batch: batch.to_string(),
            keys: self.keys.batch_in(batch, lane),
        }
    }

    /// The named fields of each batch's state (as [`BatchLog::read`]) and
    /// whether it has a tombstone (as [`Store::is_tombstoned`]), in one
    /// pipelined round trip per shard (a shard's keys share a hash tag):
    /// what `submit` checks of every batch before it appends to any.
    pub(crate) async fn read_batches(
        &self,
        batches: &[String],
        names: &[String],
    ) -> StoreResult<Vec<(Projection, bool)>> {
        let mut out = vec![(Projection::default(), false); batches.len()];
        let mut by_shard: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
        for (i, b) in batches.iter().enumerate() {
            by_shard.entry(self.keys.shard_of(b)).or_default().push(i);
        }
        for (shard, indices) in by_shard {
            let reported = self.keys.reported(shard);
            let mut pipe = redis::pipe();
            for &i in &indices {
                pipe.cmd("HMGET")
                    .arg(&self.keys.batch(&batches[i]).state)
                    .arg(names);
                pipe.cmd("ZSCORE").arg(&reported).arg(&batches[i]);
            }
            let replies: Vec<Value> = pipe.query_async(&mut self.conn.clone()).await?;
            if replies.len() != 2 * indices.len() {
                return Err(StoreError::UnexpectedReply {
                    script: "HMGET and ZSCORE of each batch",
                    reply: format!("{} replies for {} batches", replies.len(), indices.len()),
                });
            }
            let unexpected = |v: &Value| StoreError::UnexpectedReply {
                script: "HMGET and ZSCORE of each batch",
                reply: format!("{v:?}"),
            };
            for (&i, pair) in indices.iter().zip(replies.chunks_exact(2)) {
                let (values, score) = (&pair[0], &pair[1]);
                let values: Vec<Option<String>> =
                    redis::from_redis_value(values.clone()).map_err(|_| unexpected(values))?;
                let score: Option<f64> =
                    redis::from_redis_value(score.clone()).map_err(|_| unexpected(score))?;
                let fields = names
                    .iter()
                    .zip(values)
                    .filter_map(|(n, v)| Some((n.clone(), v?)))
                    .collect();
                out[i] = (Projection { fields }, score.is_some());
            }
        }
        Ok(out)
    }

    /// The log of a batch in the lane its stored options name (see
    /// [`BatchLog::stored_lane`]): for callers that handle no entry of the
    /// batch (`close`, the watchdog).
    pub(crate) async fn batch_in_its_lane(&self, batch: &str) -> StoreResult<BatchLog> {
        let lane = self.batch(batch).stored_lane().await?;
        Ok(self.batch_in(batch, lane))
    }
}

impl BatchLog {
    /// The lane the batch's stored options name (the state's `opts` field,
    /// `<send at>|<priority>|…`); normal without one.
    pub(crate) async fn stored_lane(&self) -> StoreResult<Priority> {
        let opts: Option<String> = redis::cmd("HGET")
            .arg(&self.keys.state)
            .arg(field::OPTIONS)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(lane_of_opts(opts.as_deref()))
    }
}

/// The priority named by a batch's stored options (`opts`, whose second
/// `|`-separated part is the priority's name); normal when absent.
pub(crate) fn lane_of_opts(opts: Option<&str>) -> Priority {
    opts.and_then(|o| o.split('|').nth(1))
        .and_then(Priority::parse)
        .unwrap_or_default()
}

impl BatchLog {
    /// A script's own reply fields; the event it appended last, if any, is
    /// remembered to be read back later (see [`super::durability::witness`]).
    pub(super) fn reply(&self, script: &Declared, v: Value) -> StoreResult<Vec<String>> {
        let (r, witness) = strings(script, v)?;
        if let Some((key, id)) = witness {
            self.witnesses
                .record(&self.batch, &self.keys.state, &key, &id);
        }
        Ok(r)
    }

    /// A call of a batch script with `prelude.lua`'s keys and argument
    /// given: the batch's state, its events, its id.
    pub(super) fn batch_call(&self, script: &'static Declared) -> Call {
        let mut call = script.call();
        call.key("state", &self.keys.state)
            .key("events", &self.keys.events)
            .arg("batch", &self.batch);
        call
    }

    /// The keys and leading arguments of a script that can end the batch
    /// (`settle.lua`'s layout).
    fn settling(&self, script: &'static Declared) -> Call {
        let k = &self.keys;
        let mut call = self.batch_call(script);
        call.key("work", &k.work)
            .key("active", &k.active)
            .key("reports", &k.reports)
            .key("numbers", &k.numbers)
            .key("reported", &k.reported)
            .arg("policy", self.policy.script_arg());
        call
    }

    /// Accepts chunk `seq` of `count` recipients, each a number of its own
    /// that no other chunk of these calls shares: for callers that hold no
    /// recipient numbers (tests, tools). See [`accept_with_hint`](Self::accept_with_hint).
    #[doc(hidden)]
    pub async fn accept(
        &self,
        seq: u32,
        last: bool,
        count: u32,
        digest: &str,
        cap: u64,
    ) -> StoreResult<Accepted> {
        let base = 100_000_000_000u64 + u64::from(seq % 100_000) * 1_000_000;
        let records: Vec<u8> = (0..u64::from(count))
            .flat_map(|k| (base + k % 1_000_000).to_be_bytes()[8 - RECORD..].to_vec())
            .collect();
        self.accept_with_hint(seq, last, &records, digest, cap, 0)
            .await
    }

    /// Accepts chunk `seq` and assigns it to a generation (see `accept.lua`):
    /// `records` are its recipients' numbers ([`dedupe_records`]), in order;
    /// those the batch already had come back as duplicates. `hint`: the
    /// generation the caller last saw for the batch, whose counters are read
    /// in the same round of reads (one command less when it is right).
    pub async fn accept_with_hint(
        &self,
        seq: u32,
        last: bool,
        records: &[u8],
        digest: &str,
        cap: u64,
        hint: u32,
    ) -> StoreResult<Accepted> {
        let opts = SendWindow::default().canonical();
        let args = AcceptArgs {
            seq,
            last,
            records,
            digest,
            cap,
            opts: &opts,
        };
        self.accept_chunk(&args, hint).await
    }

    /// [`accept_with_hint`](Self::accept_with_hint), with the chunk's batch
    /// options (canonical): a chunk whose options differ from the batch's is
    /// refused as a conflict.
    ///
    /// The copies are found in this process's view of the batch's number
    /// log ([`crate::protocol::numbers`]), read on to the log's end first;
    /// should another process append meanwhile (`accept.lua` answers
    /// `behind`), the view reads on and the chunk is asked again. Chunks of
    /// the batch that this process accepts at the same time wait in the
    /// view's line, and are asked together ([`accept_waiting`](Self::accept_waiting)).
    pub async fn accept_chunk(&self, a: &AcceptArgs<'_>, hint: u32) -> StoreResult<Accepted> {
        let shared = self.numbers.of(&self.keys.numbers);
        let (answer, answered) = tokio::sync::oneshot::channel();
        shared.wait(Waiting {
            chunk: WaitingChunk {
                seq: a.seq,
                last: a.last,
                records: a.records.to_vec(),
                digest: a.digest.to_string(),
                cap: a.cap,
                opts: a.opts.to_string(),
            },
            hint,
            answer,
        });
        let mut view = shared.view.lock().await;
        // Whoever held the view before took this chunk along if it came in
        // time (then its answer is already sent, and the line is empty).
        let waiting = shared.take_waiting();
        if !waiting.is_empty() {
            self.accept_waiting(&mut view, waiting).await;
        }
        drop(view);
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::AcceptAbandoned {
                batch: self.batch.clone(),
            })
        })
    }

    /// Accepts the chunks `waiting` for `view`, in their order, and sends
    /// each its answer: one read of the log, then one call of `accept.lua`
    /// for all of them, each claimed as if those before it were taken. The
    /// script asks them in turn while each is assigned; those it did not
    /// ask (after a repeat, a refusal) are asked in the next round, and so
    /// are those behind the log's end (another process appended), up to
    /// [`BEHIND_ROUNDS`] rounds behind.
    async fn accept_waiting(&self, view: &mut View, mut waiting: Vec<Waiting>) {
        let mut read = self.read_to_end(view).await;
        let mut behind_rounds = 0;
        loop {
            if let Err(e) = read {
                for w in waiting {
                    let _ = w.answer.send(Err(e.clone()));
                }
                return;
            }
            let records: Vec<&[u8]> = waiting.iter().map(|w| &w.chunk.records[..]).collect();
            let claims = DedupeClaim::chain(view, &records);
            let replies = self.accept_claimed_all(&waiting, &claims).await;
            let mut again = Vec::new();
            let (mut behind, mut missed_at_end) = (false, None);
            for ((w, claim), reply) in waiting.into_iter().zip(&claims).zip(replies) {
                match reply {
                    // Not asked: one before it was not assigned.
                    None => again.push(w),
                    Some(Ok(Claimed::Took(accepted))) => {
                        if matches!(accepted, Accepted::Assigned { .. }) {
                            view.appended(&claim.frame);
                        }
                        let _ = w.answer.send(Ok(accepted));
                    }
                    Some(Ok(Claimed::Behind { missed })) => {
                        metrics::counter!("groupcast_accept_behind_total").increment(1);
                        // What it missed reads the view on if its claim was
                        // the view's end.
                        if !behind && claim.seen == view.len() {
                            missed_at_end = Some(missed);
                        }
                        behind = true;
                        again.push(w);
                    }
                    Some(Err(e)) => {
                        let _ = w.answer.send(Err(e));
                    }
                }
            }
            if again.is_empty() {
                return;
            }
            waiting = again;
            // A round that was not behind answered its first chunk at
            // least, and left the view at the log's end: the next one needs
            // no read. Rounds behind are bounded.
            read = match (behind, missed_at_end) {
                (false, _) => Ok(()),
                (true, _) if behind_rounds + 1 >= BEHIND_ROUNDS => break,
                (true, Some(missed)) => self.read_on(view, &missed).await,
                (true, None) => self.read_to_end(view).await,
            };
            if behind {
                behind_rounds += 1;
            }
        }
        for w in waiting {
            let _ = w.answer.send(Err(StoreError::Behind {
                batch: self.batch.clone(),
                rounds: BEHIND_ROUNDS,
            }));
        }
    }

    /// Reads `view` on to the log's end (one `GETRANGE` from where it ends).
    async fn read_to_end(&self, view: &mut View) -> StoreResult<()> {
        let got: Vec<u8> = self
            .conn
            .clone()
            .getrange(&self.keys.numbers, view.read_from() as isize, -1)
            .await?;
        self.read_on(view, &got).await
    }

    /// Asks `accept.lua` for `waiting` with their claims, in order, in one
    /// call ([`accept_together`](Self::accept_together)). One answer a
    /// chunk; None for those the script did not ask.
    async fn accept_claimed_all(
        &self,
        waiting: &[Waiting],
        claims: &[DedupeClaim],
    ) -> Vec<Option<StoreResult<Claimed>>> {
        let hint = waiting.first().map_or(0, |w| w.hint);
        let chunks: Vec<_> = waiting
            .iter()
            .zip(claims)
            .map(|(w, claim)| (w.chunk.args(), claim))
            .collect();
        match self.accept_together(&chunks, hint).await {
            Ok(answers) => {
                let mut out: Vec<_> = answers.into_iter().map(|a| Some(Ok(a))).collect();
                out.resize_with(waiting.len(), || None);
                out
            }
            Err(e) => waiting.iter().map(|_| Some(Err(e.clone()))).collect(),
        }
    }

    /// One call of `accept.lua` for several chunks of the batch, each with
    /// its claim made as if those before it were appended
    /// ([`DedupeClaim::chain`]): the script asks them in turn while each is
    /// assigned, so the answers are those of the chunks it asked, in order
    /// (at least the first). The first chunk's `cap` is every chunk's.
    pub async fn accept_together(
        &self,
        chunks: &[(AcceptArgs<'_>, &DedupeClaim)],
        hint: u32,
    ) -> StoreResult<Vec<Claimed>> {
        let Some(((first, first_claim), further)) = chunks.split_first() else {
            return Ok(Vec::new());
        };
        let mut call = self.accept_call(first, first_claim, hint);
        for (a, claim) in further {
            call.more_arg(a.seq)
                .more_arg(if a.last { "1" } else { "0" })
                .more_arg(a.records.len() / RECORD)
                .more_arg(a.digest)
                .more_arg(claim.seen)
                .more_arg(&claim.stamp)
                .more_arg(claim.positions())
                .more_arg(&claim.frame)
                .more_arg(a.opts);
        }
        let v: Value = call.invoke(&mut self.conn.clone()).await?;
        let answers = self.accept_replies(v)?;
        if answers.len() > chunks.len() {
            return Err(unexpected(
                "accept",
                &[format!(
                    "{} answers for {} chunks",
                    answers.len(),
                    chunks.len()
                )],
            ));
        }
        Ok(answers)
    }

    /// One call of `accept.lua` with the caller's own `claim` on the batch's
    /// number log (what [`accept_chunk`](Self::accept_chunk) makes from this
    /// process's view).
    pub async fn accept_claimed(
        &self,
        a: &AcceptArgs<'_>,
        claim: &DedupeClaim,
        hint: u32,
    ) -> StoreResult<Claimed> {
        let v: Value = self
            .accept_call(a, claim, hint)
            .invoke(&mut self.conn.clone())
            .await?;
        self.accept_reply(v)
    }

    /// Reads the reply of `accept.lua` called with several chunks: the
    /// first chunk's answer, with each further one's as a list of its own.
    fn accept_replies(&self, v: Value) -> StoreResult<Vec<Claimed>> {
        let Value::Array(items) = v else {
            return Ok(vec![self.accept_reply(v)?]);
        };
        let (further, own): (Vec<Value>, Vec<Value>) = items
            .into_iter()
            .partition(|x| matches!(x, Value::Array(_)));
        let mut out = vec![self.accept_reply(Value::Array(own))?];
        for mut part in further {
            let missed = take_missed(&mut part)?;
            let r = <Vec<String> as redis::FromRedisValue>::from_redis_value_ref(&part)
                .map_err(|_| unexpected("accept", &[format!("{part:?}")]))?;
            out.push(claimed(&r, missed)?);
        }
        Ok(out)
    }

    /// The call of `accept.lua` for chunk `a` with `claim`.
    fn accept_call(&self, a: &AcceptArgs<'_>, claim: &DedupeClaim, hint: u32) -> Call {
        let mut call = self.settling(&SCRIPTS.accept);
        call.arg("seq", a.seq)
            .arg("last", if a.last { "1" } else { "0" })
            .arg("count", a.records.len() / RECORD)
            .arg("digest", a.digest)
            .arg("cap", a.cap)
            .arg("hint", hint)
            .arg("seen", claim.seen)
            .arg("stamp", &claim.stamp)
            .arg("duplicates", claim.positions())
            .arg("frame", &claim.frame)
            .arg("opts", a.opts);
        call
    }

    /// Extends `view` by `got`, the batch's number log read from
    /// [`View::read_from`] on; a log that no longer ends the view's way (it
    /// lost writes, or the batch ended) is read again from its start.
    async fn read_on(&self, view: &mut View, got: &[u8]) -> StoreResult<()> {
        let key = &self.keys.numbers;
        let malformed = |source| StoreError::NumberLog {
            batch: self.batch.clone(),
            key: key.clone(),
            source,
        };
        if view.extend(got).map_err(malformed)? {
            return Ok(());
        }
        *view = View::default();
        let all: Vec<u8> = self.conn.clone().getrange(key, 0, -1).await?;
        view.extend(&all).map_err(malformed)?;
        Ok(())
    }

    /// Reads `accept.lua`'s reply (for one chunk).
    fn accept_reply(&self, mut v: Value) -> StoreResult<Claimed> {
        let missed = take_missed(&mut v)?;
        let r = self.reply(&SCRIPTS.accept, v)?;
        claimed(&r, missed)
    }

    /// Records chunk `seq` (content `digest`) as refused before it could be
    /// accepted (see `reject.lua`): its seq becomes a hole the batch can end
    /// without. `flagged_last`: the chunk's `last` flag, which tells a batch
    /// that does not know its end yet where it ends.
    pub async fn reject(
        &self,
        seq: u32,
        digest: &str,
        reason: &str,
        flagged_last: bool,
    ) -> StoreResult<Rejection> {
        let v: Value = self
            .settling(&SCRIPTS.reject)
            .arg("seq", seq)
            .arg("digest", digest)
            .arg("reason", reason)
            .arg("flagged_last", if flagged_last { "1" } else { "0" })
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.reject, v)?;
        match r.as_slice() {
            [t] if t == "rejected" => Ok(Rejection::Recorded),
            [t, why] if t == "refused" => Ok(Rejection::Refused(why.clone())),
            _ => Err(unexpected("reject", &r)),
        }
    }

    /// Closes the batch: stops waiting for seqs that never arrived (see
    /// `close.lua`). Idempotent.
    pub async fn close(&self, reason: &str) -> StoreResult<Closing> {
        let v: Value = self
            .settling(&SCRIPTS.close)
            .arg("reason", reason)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.close, v)?;
        match r.as_slice() {
            [t, n] if t == "closed" => Ok(Closing::Closed {
                missing: n.parse().map_err(|_| unexpected("close", &r))?,
            }),
            [t, outcome] if t == "reported" => Ok(Closing::AlreadyReported(outcome.clone())),
            [t] if t == "unknown" => Ok(Closing::Unknown),
            _ => Err(unexpected("close", &r)),
        }
    }

    /// Seals the batch: declares its last seq after its chunks (see
    /// `seal.lua`). Idempotent.
    pub async fn seal(&self, last: u32) -> StoreResult<Sealing> {
        let v: Value = self
            .settling(&SCRIPTS.seal)
            .arg("last", last)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.seal, v)?;
        match r.as_slice() {
            [t, n] if t == "sealed" => Ok(Sealing::Sealed(
                n.parse().map_err(|_| unexpected("seal", &r))?,
            )),
            [t, why] if t == "conflict" => Ok(Sealing::Conflict(why.clone())),
            [t, why] if t == "ended" => Ok(Sealing::Ended(why.clone())),
            _ => Err(unexpected("seal", &r)),
        }
    }

    /// Cancels the batch (see `cancel.lua`): generations whose send was not
    /// claimed are stopped and their groups deleted; it takes no more
    /// chunks and reports `cancelled` once the claimed ones are done.
    /// Idempotent.
    pub async fn cancel(&self, reason: &str) -> StoreResult<Cancelling> {
        let v: Value = self
            .settling(&SCRIPTS.cancel)
            .arg("reason", reason)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.cancel, v)?;
        let n = |s: &str| s.parse::<u64>().map_err(|_| unexpected("cancel", &r));
        match r.as_slice() {
            [t, stopped, unsent, seen] if t == "cancelled" => Ok(Cancelling::Cancelled {
                stopped: n(stopped)? as u32,
                unsent: n(unsent)?,
                seen: seen == "1",
            }),
            [t, outcome] if t == "reported" => Ok(Cancelling::AlreadyReported(outcome.clone())),
            [t] if t == "forgotten" => Ok(Cancelling::Forgotten),
            _ => Err(unexpected("cancel", &r)),
        }
    }

    /// Claims generation `gen`'s send, or checks its schedule (see
    /// `claim_send.lua`), before the provider is asked to send it: refused
    /// when the batch was cancelled first; held (a claim in place given
    /// back) when its schedule holds it at the Redis clock.
    pub async fn claim_send(&self, a: &ClaimArgs) -> StoreResult<Claim> {
        let (send_at, quiet) = a.schedule.argv();
        let v: Value = self
            .settling(&SCRIPTS.claim_send)
            .arg("gen", a.gen)
            .arg("mode", a.mode.name())
            .arg("lifetime", a.lifetime_ms)
            .arg("send_at", send_at)
            .arg("quiet", quiet)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.claim_send, v)?;
        let n = |s: &str| s.parse::<u64>().map_err(|_| unexpected("claim_send", &r));
        match r.as_slice() {
            [t, id, until, now, k, how] if t == "claimed" => Ok(Claim::Claimed {
                id: id.clone(),
                n: n(k)? as u32,
                until_ms: n(until)?,
                now_ms: n(now)?,
                renewed: how == "renewed",
            }),
            [t, _] if t == "free" => Ok(Claim::Free),
            [t, at, reason, now, back] if t == "held" => Ok(Claim::Held {
                at_ms: n(at)?,
                reason: reason.clone(),
                now_ms: n(now)?,
                given_back: back == "1",
            }),
            [t, _] if t == "stale" => Ok(Claim::Stale),
            [t, why] if t == "cancelled" => Ok(Claim::Cancelled(why.clone())),
            [t] if t == "done" => Ok(Claim::Done),
            _ => Err(unexpected("claim_send", &r)),
        }
    }

    /// Parks a chunk until its generation has a group (see `park.lua`).
    pub async fn park(&self, seq: u32, gen: u32, payload: &[u8]) -> StoreResult<Parked> {
        let k = &self.keys;
        let v: Value = self
            .batch_call(&SCRIPTS.park)
            .key("parked", k.parked(gen))
            .key("work", &k.work)
            .arg("seq", seq)
            .arg("gen", gen)
            .arg("payload", payload)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.park, v)?;
        match r.as_slice() {
            [t] if t == "parked" => Ok(Parked::Parked),
            [t] if t == "loaded" => Ok(Parked::AlreadyLoaded),
            [t] if t == "unassigned" => Ok(Parked::Unassigned),
            [t] if t == "failed" => Ok(Parked::Failed),
            [t] if t == "ended" => Ok(Parked::Ended),
            [t, id] if t == "group" => Ok(Parked::Group(id.clone())),
            _ => Err(unexpected("park", &r)),
        }
    }

    /// Records generation `gen`'s group unless one was recorded first, and
    /// releases the parked chunks (see `record_group.lua`).
    pub async fn record_group(&self, gen: u32, group_id: &str) -> StoreResult<GroupRecord> {
        let k = &self.keys;
        let v: Value = self
            .batch_call(&SCRIPTS.record_group)
            .key("parked", k.parked(gen))
            .key("work", &k.work)
            .arg("gen", gen)
            .arg("group", group_id)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.record_group, v)?;
        match r.as_slice() {
            [t, _] if t == "won" => Ok(GroupRecord::Won),
            [t, kept] if t == "lost" => Ok(GroupRecord::Lost { kept: kept.clone() }),
            [t] if t == "cancelled" => Ok(GroupRecord::Cancelled),
            [t] if t == "failed" => Ok(GroupRecord::Failed),
            _ => Err(unexpected("record_group", &r)),
        }
    }

    /// Gives up generation `gen`'s creation for good (`reason`: the
    /// provider's refusal, or the last failure past the retry budget), so
    /// that the generation and the batch still end (see
    /// `fail_generation.lua`): it is closed, and its parked chunks are
    /// released to be recorded as given up. Idempotent.
    pub async fn fail_generation(&self, gen: u32, reason: &str) -> StoreResult<GenerationFailure> {
        let v: Value = self
            .settling(&SCRIPTS.fail_generation)
            .key("parked", self.keys.parked(gen))
            .arg("gen", gen)
            .arg("reason", reason)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.fail_generation, v)?;
        match r.as_slice() {
            [t, n] if t == "failed" => Ok(GenerationFailure::Failed {
                released: n.parse().map_err(|_| unexpected("fail_generation", &r))?,
            }),
            [t] if t == "duplicate" => Ok(GenerationFailure::AlreadyFailed),
            [t, id] if t == "group" => Ok(GenerationFailure::HasGroup(id.clone())),
            [t] if t == "ended" => Ok(GenerationFailure::Ended),
            _ => Err(unexpected("fail_generation", &r)),
        }
    }

    /// Records that generation `gen`'s send (or its poll, or its recall)
    /// was given up for `reason`, so that the generation and the batch
    /// still end (see `give_up_send.lua`); `group`: its group id, '' when
    /// unknown.
    pub async fn give_up_send(
        &self,
        gen: u32,
        what: crate::protocol::GivenUp,
        reason: &str,
        group: &str,
    ) -> StoreResult<SendGiveUp> {
        let v: Value = self
            .settling(&SCRIPTS.give_up_send)
            .arg("gen", gen)
            .arg("what", what.as_str())
            .arg("reason", reason)
            .arg("group", group)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.give_up_send, v)?;
        let count = |n: &String| n.parse().map_err(|_| unexpected("give_up_send", &r));
        match r.as_slice() {
            [t, n] if t == "unsent" => Ok(SendGiveUp::Unsent(count(n)?)),
            [t, n] if t == "unknown" => Ok(SendGiveUp::Unknown(count(n)?)),
            [t] if t == "recalling" => Ok(SendGiveUp::Recalling),
            [t] if t == "sent" => Ok(SendGiveUp::Sent),
            [t] if t == "done" => Ok(SendGiveUp::Done),
            [t] if t == "stale" => Ok(SendGiveUp::Stale),
            _ => Err(unexpected("give_up_send", &r)),
        }
    }

    /// Records a loaded chunk and evaluates completion (see `loaded.lua`).
    /// Returns `Some(ready)` when appended, `None` when nothing was (it
    /// already was, or the batch was cancelled): see [`record_loaded`](Self::record_loaded).
    pub async fn loaded(&self, e: &ChunkLoaded) -> StoreResult<Option<bool>> {
        Ok(match self.record_loaded(e).await? {
            Loading::Loaded { ready } => Some(ready),
            Loading::Duplicate | Loading::Cancelled => None,
        })
    }

    /// Records a loaded chunk and evaluates completion (see `loaded.lua`).
    pub async fn record_loaded(&self, e: &ChunkLoaded) -> StoreResult<Loading> {
        let data = Event::ChunkLoaded(e.clone()).encode_data();
        let mut by_reason = std::collections::BTreeMap::<&str, u64>::new();
        for f in &e.failed {
            *by_reason.entry(f.code.as_str()).or_default() += 1;
        }
        let reasons: Vec<String> = by_reason.iter().map(|(c, n)| format!("{c}={n}")).collect();
        let unsure = if e.given_up.is_some() {
            e.failed.len()
        } else {
            0
        };
        let v: Value = self
            .settling(&SCRIPTS.loaded)
            .arg("gen", e.gen)
            .arg("seq", e.seq)
            .arg("registered", e.registered)
            .arg("failed", e.failed.len())
            .arg("data", data)
            .arg("failed_by_reason", reasons.join(","))
            .arg("unsure", unsure)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.loaded, v)?;
        match r.as_slice() {
            [t, ready] if t == "loaded" => Ok(Loading::Loaded {
                ready: ready == "1",
            }),
            [t] if t == "duplicate" => Ok(Loading::Duplicate),
            [t] if t == "cancelled" => Ok(Loading::Cancelled),
            _ => Err(unexpected("loaded", &r)),
        }
    }

    /// Records a send and schedules its first poll (see `sent.lua`).
    /// Returns whether it was recorded now (see [`BatchLog::record_sent`]).
    pub async fn sent(
        &self,
        gen: u32,
        group_id: &str,
        outcome: &str,
        poll_delay_ms: u64,
        poll_entry: &[u8],
    ) -> StoreResult<bool> {
        Ok(self
            .record_sent(gen, group_id, outcome, poll_delay_ms, poll_entry)
            .await?
            == SendRecord::Recorded)
    }

    /// Records a send and schedules its first poll (see `sent.lua`).
    /// Returns whether it was newly recorded.
    pub async fn record_sent(
        &self,
        gen: u32,
        group_id: &str,
        outcome: &str,
        poll_delay_ms: u64,
        poll_entry: &[u8],
    ) -> StoreResult<SendRecord> {
        let k = &self.keys;
        let v: Value = self
            .batch_call(&SCRIPTS.sent)
            .key("delayed", &k.delayed)
            .arg("gen", gen)
            .arg("group", group_id)
            .arg("outcome", outcome)
            .arg("poll_delay", poll_delay_ms)
            .arg("poll_entry", poll_entry)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.sent, v)?;
        match r.as_slice() {
            [t] if t == "recorded" => Ok(SendRecord::Recorded),
            [t] if t == "duplicate" => Ok(SendRecord::Duplicate),
            [t] if t == "done" => Ok(SendRecord::Done),
            _ => Err(unexpected("sent", &r)),
        }
    }

    /// Records a finished group; decides the report when it is the last
    /// thing the batch waited for (see `completed.lua`).
    pub async fn completed(
        &self,
        gen: u32,
        group_id: &str,
        status: &str,
        sent_success: u64,
        sent_failed: u64,
    ) -> StoreResult<Completion> {
        let v: Value = self
            .settling(&SCRIPTS.completed)
            .arg("gen", gen)
            .arg("group", group_id)
            .arg("status", status)
            .arg("sent_success", sent_success)
            .arg("sent_failed", sent_failed)
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.completed, v)?;
        match r.as_slice() {
            [t] if t == "completed" => Ok(Completion::Completed),
            [t] if t == "reported" => Ok(Completion::Reported),
            [t] if t == "duplicate" => Ok(Completion::Duplicate),
            [t] if t == "not_sent" => Ok(Completion::NotSent),
            _ => Err(unexpected("completed", &r)),
        }
    }

    /// Appends an event whose state change is fixed in advance (see
    /// `append.lua`). The scripted events (assignment, loading, ...) go
    /// through their own calls above, which decide as they append.
    pub async fn append(&self, key: &str, event: &Event) -> StoreResult<Appended> {
        let v = self.append_with(&SCRIPTS.append, key, event).await?;
        let r = self.reply(&SCRIPTS.append, v)?;
        match r.as_slice() {
            [t, id] if t == "appended" => Ok(Appended::New(id.clone())),
            [t, id] if t == "duplicate" => Ok(Appended::Duplicate(id.clone())),
            _ => Err(unexpected("append", &r)),
        }
    }

    /// Appends the watchdog's `batch_stalled` for the heartbeat `hb` (the
    /// state's `hb` field as read), unless the batch reported or woke up
    /// meanwhile: the check and the append are one step (`stalled.lua`, then
    /// `append.lua`). Its key is `stalled/<hb>`: one event per stall.
    pub(crate) async fn append_stalled(&self, hb: &str, event: &Event) -> StoreResult<Stalled> {
        let key = projection::event_key::stalled(hb);
        let v = self.append_with(&SCRIPTS.stalled, &key, event).await?;
        // Not witnessed: a stall lost with a crash is found again by the
        // next scan.
        let (r, _) = strings(&SCRIPTS.stalled, v)?;
        match r.as_slice() {
            [t, id] if t == "appended" => Ok(Stalled::Appended(id.clone())),
            [t, id] if t == "duplicate" => Ok(Stalled::Duplicate(id.clone())),
            [t] if t == "reported" => Ok(Stalled::Reported),
            [t] if t == "fresh" => Ok(Stalled::Fresh),
            _ => Err(unexpected("stalled", &r)),
        }
    }

    /// Runs `append.lua` (or a guard followed by it) for `event` under `key`.
    async fn append_with(
        &self,
        script: &'static Declared,
        key: &str,
        event: &Event,
    ) -> StoreResult<Value> {
        let mut call = self.batch_call(script);
        call.arg("key", key)
            .arg("type", event.type_name())
            .arg("data", event.encode_data())
            .arg(
                "touch",
                if projection::touches_heartbeat(event) {
                    "1"
                } else {
                    "0"
                },
            );
        for u in projection::updates(event) {
            match u {
                Update::Set(f, v) => call.more_arg("set").more_arg(f).more_arg(v),
                Update::Incr(f, by) => call.more_arg("incr").more_arg(f).more_arg(by),
                // No generic event raises a maximum; only the scripts do.
                Update::Max(f, v) => call.more_arg("set").more_arg(f).more_arg(v),
            };
        }
        call.invoke(&mut self.conn.clone()).await
    }

    /// The live state hash.
    pub async fn state(&self) -> StoreResult<Projection> {
        let fields: std::collections::BTreeMap<String, String> =
            self.conn.clone().hgetall(&self.keys.state).await?;
        Ok(Projection { fields })
    }

    /// Some fields of the live state.
    pub async fn fields(&self, names: &[String]) -> StoreResult<Vec<Option<String>>> {
        Ok(redis::cmd("HMGET")
            .arg(&self.keys.state)
            .arg(names)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// The named fields of the live state (names from
    /// [`projection::field`]), in one read, as a projection holding those
    /// present: read them with its typed accessors
    /// ([`Projection::group_of`], [`Projection::is_loaded`], ...).
    pub async fn read(&self, names: &[String]) -> StoreResult<Projection> {
        let values = self.fields(names).await?;
        let fields = names
            .iter()
            .zip(values)
            .filter_map(|(n, v)| Some((n.clone(), v?)))
            .collect();
        Ok(Projection { fields })
    }

    /// The entry id of the event appended under idempotency key
    /// `event_key`, if it was (one read).
    pub async fn appended(&self, event_key: &str) -> StoreResult<Option<String>> {
        let p = self.read(&[field::key(event_key)]).await?;
        Ok(p.appended(event_key).map(str::to_string))
    }

    /// Whether chunk `seq` is recorded loaded into generation `gen` (one read).
    pub(crate) async fn is_loaded(&self, gen: u32, seq: u32) -> StoreResult<bool> {
        Ok(self.appended(&event_key::loaded(gen, seq)).await?.is_some())
    }

    /// Drops the chunks parked for generation `gen` (their recipient data):
    /// for a generation that will never have a group because the batch
    /// ended (cancelled or reported) before it was created.
    pub(crate) async fn drop_parked(&self, gen: u32) -> StoreResult<()> {
        let _: i64 = redis::cmd("DEL")
            .arg(self.keys.parked(gen))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The keys of this batch holding recipient data outside its events
    /// that exist now: the parked chunks of generations `0..gens` and the
    /// batch's number log (its dedupe). None once the batch has reported.
    pub(crate) async fn recipient_data_left(&self, gens: u32) -> StoreResult<Vec<String>> {
        let keys: Vec<String> = (0..gens)
            .map(|gen| self.keys.parked(gen))
            .chain([self.keys.numbers.clone()])
            .collect();
        // One round trip, however many generations.
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.exists(key);
        }
        let found: Vec<bool> = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(keys
            .into_iter()
            .zip(found)
            .filter(|(_, f)| *f)
            .map(|(k, _)| k)
            .collect())
    }

    /// Generation `gen`'s provider group, once recorded (one read).
    pub async fn group_of(&self, gen: u32) -> StoreResult<Option<String>> {
        let p = self.read(&[field::group(gen)]).await?;
        Ok(p.group_of(gen).map(str::to_string))
    }

    /// The clock of the master holding this batch's keys (ms since the
    /// epoch): the clock that stamped its entry ids.
    pub async fn server_time_ms(&self) -> StoreResult<u64> {
        super::time_ms_at(&self.conn, &self.keys.events).await
    }

    /// Every event, in order. Entries that do not decode are returned as errors
    /// in place (an audit shows them; replay refuses to guess).
    pub async fn events(&self) -> StoreResult<Vec<Result<Recorded, (String, String)>>> {
        self.events_from("-").await
    }

    /// The events from `start` (an `XRANGE` start: `-`, an id, or `(id` for
    /// those after it), in order, as [`events`](Self::events).
    async fn events_from(
        &self,
        start: &str,
    ) -> StoreResult<Vec<Result<Recorded, (String, String)>>> {
        let mut out = Vec::new();
        let mut start = start.to_string();
        loop {
            let v: Value = redis::cmd("XRANGE")
                .arg(&self.keys.events)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn.clone())
                .await?;
            let entries = super::queue::parse_entries(&v);
            let n = entries.len();
            for e in entries {
                start = format!("({}", e.id);
                out.push(
                    Recorded::from_fields(&e.id, &e.fields)
                        .map_err(|err| (e.id.clone(), err.to_string())),
                );
            }
            if n < 1000 {
                return Ok(out);
            }
        }
    }

    /// Rebuilds the state from the events alone.
    pub async fn replay(&self) -> StoreResult<Result<Projection, Vec<(String, String)>>> {
        let mut p = Projection::default();
        let mut bad = Vec::new();
        for r in self.events().await? {
            match r {
                Ok(r) => p.apply(&r),
                Err(e) => bad.push(e),
            }
        }
        Ok(if bad.is_empty() { Ok(p) } else { Err(bad) })
    }

    /// Replaces the live state with one rebuilt from the events, atomically
    /// with respect to running workers: the replacement (`restore.lua`) only
    /// happens if no event was appended since the last one folded; otherwise
    /// the new events are folded in and it tries again, up to `tries` times.
    /// The TTL and the `alive` heartbeat are kept.
    pub async fn rebuild(&self, tries: u32) -> StoreResult<Rebuilt> {
        let mut p = Projection::default();
        let mut last = String::new();
        for attempt in 0..tries.max(1) {
            let start = if last.is_empty() {
                "-".to_string()
            } else {
                format!("({last}")
            };
            let mut bad = Vec::new();
            for r in self.events_from(&start).await? {
                match r {
                    Ok(r) => {
                        last.clone_from(&r.id);
                        p.apply(&r);
                    }
                    Err(e) => {
                        last.clone_from(&e.0);
                        bad.push(e);
                    }
                }
            }
            if !bad.is_empty() {
                return Ok(Rebuilt::Undecodable(bad));
            }
            let mut call = SCRIPTS.restore.call();
            call.key("state", &self.keys.state)
                .key("events", &self.keys.events)
                .arg("read_up_to", &last);
            for (k, v) in &p.fields {
                call.more_arg(k).more_arg(v);
            }
            let replaced: i64 = call.invoke(&mut self.conn.clone()).await?;
            if replaced == 1 {
                return Ok(Rebuilt::Replaced {
                    fields: p.fields.len(),
                    retries: attempt,
                });
            }
        }
        Ok(Rebuilt::Busy { tries })
    }
}
