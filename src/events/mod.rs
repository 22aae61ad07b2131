//! The facts groupcast records, and how they are encoded.
//!
//! Every event is one stream entry with four fields, its *envelope*:
//!
//! | field | meaning |
//! |---|---|
//! | `v` | envelope version (`1`) |
//! | `t` | event type, e.g. `chunk_assigned` |
//! | `k` | idempotency key, e.g. `loaded/0/17`; a key is appended once |
//! | `d` | the event's fields, a MessagePack map (rmp-serde, named fields) |
//!
//! Some events are decided inside a server-side script (which generation a
//! chunk joins, whether a generation is ready to send); those scripts encode
//! `d` with Redis' `cmsgpack`, which is why every event is a *map* with named
//! fields and never a positional array. `schemas/` documents each one.

pub mod chunk;
pub mod options;
pub mod seal;
pub mod work_item;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use thiserror::Error;

pub use chunk::{Chunk, ChunkError, Recipient, Template};

/// The envelope version this build writes and reads.
pub const ENVELOPE_VERSION: &str = "1";

/// The most bytes of hostile input quoted in an error message.
pub(crate) const QUOTE_MAX: usize = 64;

/// At most `max` bytes of `s` (cut on a character boundary), saying how long
/// it was: error messages and dead-letter reasons quote input, and input can
/// be megabytes long.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// Why an entry could not be read as an event.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// A required envelope field is missing.
    #[error("entry has no `{0}` field")]
    MissingField(&'static str),
    /// The envelope version is not one this build reads.
    #[error("unknown envelope version {0:?} (this build reads version {ENVELOPE_VERSION})")]
    UnknownVersion(String),
    /// The event type is not one this build knows.
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    /// The entry is larger than we accept.
    #[error("entry is {0} bytes, over the limit")]
    TooLarge(usize),
    /// The payload is not valid MessagePack for the type.
    #[error("malformed {kind} payload: {}", clip(&.source.to_string(), 8 * QUOTE_MAX))]
    Malformed {
        /// What was being decoded.
        kind: String,
        /// The decoder's complaint.
        source: rmp_serde::decode::Error,
    },
}

/// The deepest nesting a payload may have. Ours go four levels deep (a
/// chunk's recipients' variables); rmp-serde's own limit, 1024, takes more
/// than a 2 MiB thread stack (a tokio worker's) in a debug build, so one
/// malicious entry nested 1024 deep would abort the worker.
pub(crate) const MAX_PAYLOAD_DEPTH: usize = 32;

/// Decodes a named-field MessagePack payload.
pub fn decode_payload<T: DeserializeOwned>(kind: &str, bytes: &[u8]) -> Result<T, DecodeError> {
    let mut de = rmp_serde::Deserializer::from_read_ref(bytes);
    de.set_max_depth(MAX_PAYLOAD_DEPTH);
    T::deserialize(&mut de).map_err(|source| DecodeError::Malformed {
        kind: kind.to_string(),
        source,
    })
}

/// Encodes a payload as a named-field MessagePack map.
pub fn encode_payload<T: Serialize>(value: &T) -> Vec<u8> {
    // Encoding our own plain structs into a Vec cannot fail: there is no I/O
    // and every type has string keys.
    rmp_serde::to_vec_named(value).unwrap_or_default()
}

macro_rules! events {
    ($( $(#[$doc:meta])* $variant:ident($ty:ident) = $tag:literal, )*) => {
        /// Every event of a batch's log.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Event {
            $( $(#[$doc])* $variant($ty), )*
        }

        impl Event {
            /// The `t` field of the envelope.
            pub fn type_name(&self) -> &'static str {
                match self { $( Event::$variant(_) => $tag, )* }
            }

            /// Every type name, for documentation and schema tests.
            pub const TYPE_NAMES: &'static [&'static str] = &[$($tag),*];

            /// Encodes the `d` field.
            pub fn encode_data(&self) -> Vec<u8> {
                match self { $( Event::$variant(e) => encode_payload(e), )* }
            }

            /// Decodes an event from its type name and `d` field.
            pub fn decode(type_name: &str, data: &[u8]) -> Result<Event, DecodeError> {
                match type_name {
                    $( $tag => Ok(Event::$variant(decode_payload(type_name, data)?)), )*
                    other => Err(DecodeError::UnknownType(clip(other, QUOTE_MAX))),
                }
            }
        }
    };
}

events! {
    /// A chunk was accepted and assigned to a generation, in one step.
    ChunkAssigned(ChunkAssigned) = "chunk_assigned",
    /// A generation takes no more chunks (it is full, or it is the last one).
    GenerationClosed(GenerationClosed) = "generation_closed",
    /// A chunk waits for its generation's group; its payload is kept aside.
    ChunkParked(ChunkParked) = "chunk_parked",
    /// A create-group work item was enqueued for a generation.
    GroupRequested(GroupRequested) = "group_requested",
    /// A generation's provider group was recorded (the one kept).
    GroupCreated(GroupCreated) = "group_created",
    /// The parked chunks of a generation were released to the work stream.
    ChunksReleased(ChunksReleased) = "chunks_released",
    /// A group that lost the creation race, or the group of a generation a
    /// cancel stopped, was deleted at the provider.
    GroupDiscarded(GroupDiscarded) = "group_discarded",
    /// Every message of a chunk was accepted by the provider.
    ChunkLoaded(ChunkLoaded) = "chunk_loaded",
    /// A generation is complete and its send work item was enqueued.
    GenerationReady(GenerationReady) = "generation_ready",
    /// A ready generation's send is held until an instant (`send_at`,
    /// quiet hours).
    SendScheduled(SendScheduled) = "send_scheduled",
    /// A generation's group was sent (or found already sent).
    SendTriggered(SendTriggered) = "send_triggered",
    /// A send was refused because the provider disagreed with our counts.
    SendRefused(SendRefused) = "send_refused",
    /// A sent group finished at the provider.
    GroupCompleted(GroupCompleted) = "group_completed",
    /// The batch's report was decided (once).
    BatchReported(BatchReported) = "batch_reported",
    /// The report was accepted by the webhook.
    ReportDelivered(ReportDelivered) = "report_delivered",
    /// An input of this batch was rejected and dead-lettered.
    InputRejected(InputRejected) = "input_rejected",
    /// The watchdog found the batch quiet before its report.
    BatchStalled(BatchStalled) = "batch_stalled",
    /// An operator (or `--give-up-after`) stopped waiting for missing seqs.
    BatchClosed(BatchClosed) = "batch_closed",
    /// The producer declared the batch's last seq after its chunks (a
    /// seal), instead of flagging a chunk `last`.
    BatchSealed(BatchSealed) = "batch_sealed",
    /// A generation's send was claimed, before the provider was asked to
    /// send it: a cancel after this leaves the generation alone (unless the
    /// claim is given back).
    SendClaimed(SendClaimed) = "send_claimed",
    /// A claimed send's retry found the batch held by its schedule: the
    /// claim was given back (a cancel now stops the generation; one that
    /// came while the claim was in place stopped it here).
    ClaimGivenBack(ClaimGivenBack) = "claim_given_back",
    /// An operator cancelled the batch: generations whose send was not
    /// claimed are stopped (never sent), and it takes no more chunks.
    BatchCancelled(BatchCancelled) = "batch_cancelled",
    /// A provider operation on a generation was given up for good (refused,
    /// or failing past `--retry-for`): the generation ends without it.
    GenerationFailed(GenerationFailed) = "generation_failed",
    /// An operator purged or redrove a dead letter of this batch
    /// (`groupcast dlq purge|redrive`).
    DeadLetterHandled(DeadLetterHandled) = "dead_letter_handled",
    /// Every message of a sent generation's group has its delivery result,
    /// or the delivery window ended first (the rest are `unknown`).
    GenerationDelivered(GenerationDelivered) = "generation_delivered",
    /// Every sent generation of a reported batch is delivered: the batch's
    /// second report, with every recipient's outcome counted (once).
    BatchDelivered(BatchDelivered) = "batch_delivered",
    /// The batch is a follow-up of another batch's recipients (a fallback
    /// resend): which batch, and which of its outcomes it was cut from.
    BatchOrigin(BatchOrigin) = "batch_origin",
}

/// See [`Event::GenerationDelivered`]. Key `delivered/<gen>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationDelivered {
    /// The generation.
    pub gen: u32,
    /// Its group.
    pub group_id: String,
    /// Messages delivered (`4000`).
    pub delivered: u64,
    /// Messages whose delivery failed (a final code other than `4000`),
    /// registration failures not included (the report counts those).
    pub failed: u64,
    /// Messages still without a final result when the delivery window ended.
    pub unknown: u64,
    /// `failed`, by the provider's code.
    #[serde(default)]
    pub failed_by_code: std::collections::BTreeMap<String, u64>,
    /// Whether the delivery window ended before every result came.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub window_ended: bool,
}

/// See [`Event::BatchDelivered`]. Key `delivery_report`. Every accepted
/// recipient is counted in exactly one of `delivered`, `failed`, `unknown`,
/// `duplicates` and `not_sent`: they add up to `recipients`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchDelivered {
    /// Recipients accepted, copies of a number included.
    pub recipients: u64,
    /// Delivered.
    pub delivered: u64,
    /// Failed: refused at registration, or failed at delivery.
    pub failed: u64,
    /// Of `failed`: refused at registration.
    pub failed_at_registration: u64,
    /// Of `failed`: failed at delivery.
    pub failed_at_delivery: u64,
    /// Sent, without a result within the delivery window (or the group's
    /// outcome could not be learned).
    pub unknown: u64,
    /// Copies of a number the batch already had: never sent.
    pub duplicates: u64,
    /// Never sent: their chunk was given up, or their generation was
    /// stopped by a cancel or its send given up.
    pub not_sent: u64,
    /// `failed`, by the provider's code.
    #[serde(default)]
    pub failed_by_code: std::collections::BTreeMap<String, u64>,
    /// The batch this one follows up ([`BatchOrigin`]), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// See [`Event::BatchSealed`]. Key `seal`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSealed {
    /// The batch's last seq: it takes seqs 0..=last.
    pub last: u32,
}

/// See [`Event::BatchOrigin`]. Key `origin`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOrigin {
    /// The batch whose recipients this one follows up.
    pub batch: String,
    /// Which of them: the outcome (`failed`, `unknown`, ...) and codes
    /// filtered on, as `groupcast submit --follow-up` was given them.
    pub filter: String,
}

impl BatchOrigin {
    /// How reports name the origin: `<batch> (<filter>)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.batch, self.filter)
    }
}

/// See [`Event::DeadLetterHandled`]. Key `dlq/<action>/<dead letter id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterHandled {
    /// `purge` (deleted for good) or `redrive` (put back on its stream).
    pub action: String,
    /// The dead letter's entry id.
    pub entry: String,
    /// What it was: `chunk <seq>` or the work item's op and generation.
    pub what: String,
    /// Why it had been dead-lettered.
    pub reason: String,
    /// Who did it: the operator's login (`$USER`), as the command saw it.
    pub by: String,
}

/// See [`Event::GenerationFailed`]. Key `failed/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationFailed {
    /// The generation.
    pub gen: u32,
    /// The operation given up: `create` (its group could never be created:
    /// its chunks are given up, their recipients failed); `send` (the send
    /// was given up: never claimed again; with [`GenerationFailed::recall`],
    /// the provider is asked whether it went out, else it did not and the
    /// generation is done `unsent`); `poll` or `recall` (the group's outcome
    /// could not be learned: the generation is done `unknown`).
    pub op: String,
    /// Why: the provider's refusal, or the last failure before the retry
    /// budget ran out.
    pub reason: String,
    /// A send given up while its claim was in place (it may have gone out):
    /// a `recall` work item deletes the group at the provider, or finds it
    /// sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recall: bool,
}

/// See [`Event::ChunkAssigned`]. Key `assign/<seq>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkAssigned {
    /// Chunk sequence number.
    pub seq: u32,
    /// The generation (provider group) it joins.
    pub gen: u32,
    /// Recipients of the chunk the batch had not been given before: the
    /// ones it sends to.
    pub count: u32,
    /// Whether the producer flagged it as the last chunk.
    pub last: bool,
    /// Digest of the chunk's content; a repeat with another digest is a conflict.
    pub digest: String,
    /// Positions (0-based, in the chunk) of recipients whose number the
    /// batch was already given, in this chunk or an earlier one: recorded,
    /// not sent (the first copy wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicates: Vec<u32>,
    /// The batch's options, canonical (`<send_at ms>|<priority>|<quiet
    /// hours>`): on the chunk that set them (the batch's first accepted),
    /// absent on the others, which had to agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opts: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// See [`Event::GenerationClosed`]. Key `close/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationClosed {
    /// The generation.
    pub gen: u32,
    /// `full` (the next chunk would pass the cap), `final` (every seq is
    /// assigned, or refused for good), `closed` (the batch was closed),
    /// `cancelled` (the batch was cancelled) or `failed` (its group could
    /// never be created: [`GenerationFailed`]).
    pub reason: String,
    /// Chunks assigned to it.
    pub chunks: u32,
    /// Recipients assigned to it.
    pub recipients: u32,
}

/// See [`Event::ChunkParked`]. Key `park/<seq>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkParked {
    /// Chunk sequence number.
    pub seq: u32,
    /// Its generation.
    pub gen: u32,
}

/// See [`Event::GroupRequested`]. Key `create/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRequested {
    /// The generation.
    pub gen: u32,
}

/// See [`Event::GroupCreated`]. Key `group/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCreated {
    /// The generation.
    pub gen: u32,
    /// The provider's group id.
    pub group_id: String,
}

/// See [`Event::ChunksReleased`]. Key `release/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunksReleased {
    /// The generation.
    pub gen: u32,
    /// How many parked chunks were released.
    pub chunks: u32,
}

/// See [`Event::GroupDiscarded`]. Key `discard/<group_id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupDiscarded {
    /// The generation it was created for.
    pub gen: u32,
    /// The deleted group.
    pub group_id: String,
    /// The group kept instead (the deleted group itself when a cancel
    /// stopped its generation; empty when the batch was cancelled before
    /// the generation had a group).
    pub kept: String,
}

/// A recipient the provider did not register.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrationFailure {
    /// The recipient's number.
    pub to: String,
    /// The provider's status code, e.g. `1062`.
    pub code: String,
}

/// See [`Event::ChunkLoaded`]. Key `loaded/<gen>/<seq>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLoaded {
    /// The generation.
    pub gen: u32,
    /// Chunk sequence number.
    pub seq: u32,
    /// The group it was added to.
    pub group_id: String,
    /// Recipients registered (`2000`, or `1026` on a retried add).
    pub registered: u32,
    /// Of those, how many came back `1026` (already in the group).
    pub duplicates: u32,
    /// Recipients the provider refused, with their codes.
    pub failed: Vec<RegistrationFailure>,
    /// Set when groupcast gave up loading the chunk (the add was refused
    /// for good, or failed for longer than `--retry-for`): why. Every
    /// recipient is then in `failed` (code `given_up`), and whether the
    /// provider registered some of them before it gave up is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given_up: Option<String>,
}

/// See [`Event::GenerationReady`]. Key `ready/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationReady {
    /// The generation.
    pub gen: u32,
    /// Chunks loaded into it.
    pub chunks: u32,
}

/// See [`Event::SendTriggered`]. Key `send/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendTriggered {
    /// The generation.
    pub gen: u32,
    /// The group sent.
    pub group_id: String,
    /// `sent` (our call was answered 200) or `already_sent` (409, or the group was no longer PENDING).
    pub outcome: String,
}

/// See [`Event::SendRefused`]. Key `refused/<gen>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendRefused {
    /// The generation.
    pub gen: u32,
    /// The group not sent.
    pub group_id: String,
    /// Why, e.g. the count mismatch.
    pub reason: String,
}

/// See [`Event::GroupCompleted`]. Key `done/<gen>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCompleted {
    /// The generation.
    pub gen: u32,
    /// The group.
    pub group_id: String,
    /// The provider's final status (`COMPLETE` or `FAILED`); or `empty`
    /// (nobody registered: never sent), `cancelled` (stopped by a cancel:
    /// never sent), `unsent` (its send given up before it went out: never
    /// sent, its group deleted) or `unknown` (given up without learning
    /// whether, or how, it went out).
    pub status: String,
    /// Messages the provider delivered.
    pub sent_success: u64,
    /// Messages the provider failed to deliver.
    pub sent_failed: u64,
    /// Status `unsent` or `unknown`: the registered recipients it held,
    /// counted as such in the report (never sent to; their messages' fate
    /// unknown). Absent (0) for the other statuses.
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub recipients: u64,
}

/// See [`Event::BatchReported`]. Key `report`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchReported {
    /// `completed` (every expected recipient registered, nothing refused or
    /// given up), `partial`, `failed` (nobody registered), or `cancelled`
    /// (an operator cancelled it: see [`BatchReported::stopped`]).
    pub outcome: String,
    /// Generations (provider groups) used.
    pub generations: u32,
    /// Chunks accepted.
    pub chunks: u32,
    /// Recipients accepted.
    pub recipients: u64,
    /// Recipients registered.
    pub registered: u64,
    /// Recipients refused at registration.
    pub failed: u64,
    /// Messages delivered, by the provider.
    pub sent_success: u64,
    /// Messages not delivered, by the provider.
    pub sent_failed: u64,
    /// Copies of a number already given to the batch: recorded, not sent.
    #[serde(default)]
    pub duplicates: u64,
    /// Chunks refused (invalid, conflicting, beyond the last seq, ...).
    #[serde(default)]
    pub rejected: u64,
    /// Seqs given up on by `close` (never arrived).
    #[serde(default)]
    pub missing: u64,
    /// `failed`, by reason (the provider's code, or `given_up`).
    #[serde(default)]
    pub failed_by_reason: std::collections::BTreeMap<String, u64>,
    /// A cancelled batch: generations stopped by the cancel (never sent).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub stopped: u32,
    /// Recipients registered in generations that were never sent: stopped
    /// by a cancel, or whose send was given up (their groups deleted
    /// unsent).
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub unsent: u64,
    /// Recipients registered in generations given up without learning
    /// whether, or how, their messages went out (a poll or a recall given
    /// up): neither counted sent nor failed.
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub unknown: u64,
    /// A chunk flagged `last` below a seq that had already arrived: the
    /// batch ended at the highest seq received instead, and this says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_conflict: Option<String>,
    /// The batch this one follows up ([`BatchOrigin::describe`]), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

fn is_zero32(v: &u32) -> bool {
    *v == 0
}

fn is_zero64(v: &u64) -> bool {
    *v == 0
}

/// See [`Event::SendClaimed`]. Key `claim/<gen>` for the generation's
/// first claim, `claim/<gen>/<n>` for claim `n` after `n - 1` were given back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendClaimed {
    /// The generation.
    pub gen: u32,
    /// The claim's number, from 1 (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// The end of the lifetime it was granted (Unix ms, the shard's clock):
    /// once the batch is cancelled, the claim is never renewed past it
    /// (absent in events written before it was recorded: no bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
}

/// See [`Event::ClaimGivenBack`]. Key `back/<gen>/<n>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimGivenBack {
    /// The generation.
    pub gen: u32,
    /// The number of the claim given back.
    pub n: u32,
    /// When the batch's schedule lets the send go (Unix ms, the shard's
    /// clock); for `expired`, when the claim ended.
    pub at_ms: u64,
    /// `send_at` or `quiet_hours`; `expired`: the batch was cancelled and
    /// the claim's lifetime ended before its send started.
    pub reason: String,
    /// The batch was cancelled while the claim was in place: the
    /// generation is stopped (done with status `cancelled`), as the cancel
    /// would have stopped it without the claim.
    #[serde(default)]
    pub stopped: bool,
    /// Recipients registered in the generation, when it is stopped.
    #[serde(default)]
    pub unsent: u64,
}

/// See [`Event::BatchCancelled`]. Key `cancelled`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCancelled {
    /// Why (the operator's `--reason`).
    pub reason: String,
    /// Generations stopped: not done and their send not claimed. Each is
    /// done with status `cancelled` and its group deleted.
    #[serde(default)]
    pub stopped: Vec<u32>,
    /// Generations whose send was claimed and not yet done: they are sent
    /// and counted.
    #[serde(default)]
    pub sending: Vec<u32>,
    /// Recipients registered in the stopped generations.
    #[serde(default)]
    pub unsent: u64,
}

/// See [`Event::SendScheduled`]. Key `schedule/<gen>` (the first hold).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendScheduled {
    /// The generation.
    pub gen: u32,
    /// Its group.
    pub group_id: String,
    /// When it will be sent (Unix ms, the shard's clock).
    pub at_ms: u64,
    /// Why it waits: `send_at`, or `quiet_hours` (the send would fall
    /// inside the batch's window: it goes at the window's end).
    pub reason: String,
}

/// See [`Event::BatchClosed`]. Key `closed`.
///
/// The seqs that never arrived are kept as ranges, at most
/// [`MISSING_RANGES_MAX`](crate::seq_ranges::MISSING_RANGES_MAX) of them
/// (the first), with the counts in all: a batch holding seq 4,000,000,000
/// closes with one range, not a list of four billion seqs. Events recorded
/// before ranges listed every missing seq in `missing`; they are still read
/// ([`BatchClosed::count`], [`BatchClosed::ranges`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchClosed {
    /// Why (the operator's `--reason`, or the quiet time).
    pub reason: String,
    /// The seqs that never arrived, one by one: events recorded before
    /// ranges only (`close.lua` no longer writes it).
    #[serde(default)]
    pub missing: Vec<u32>,
    /// How many seqs never arrived.
    #[serde(default)]
    pub missing_count: u64,
    /// The first ranges `[from, to]` (inclusive, ascending) of the seqs
    /// that never arrived.
    #[serde(default)]
    pub missing_ranges: Vec<[u32; 2]>,
    /// How many ranges there are in all (more than listed when cut).
    #[serde(default)]
    pub missing_ranges_total: u64,
}

impl BatchClosed {
    /// How many seqs never arrived (whichever form the event has).
    pub fn count(&self) -> u64 {
        self.missing_count.max(self.missing.len() as u64)
    }

    /// The seqs that never arrived, as ranges and counts (whichever form
    /// the event has; an old event's list is cut to the same limit).
    pub(crate) fn missing_seqs(&self) -> crate::seq_ranges::Missing {
        use crate::seq_ranges::{ranges_of, Missing, MISSING_RANGES_MAX};
        if self.missing.is_empty() {
            return Missing {
                count: self.missing_count,
                ranges: self.missing_ranges.clone(),
                ranges_total: self.missing_ranges_total,
            };
        }
        let mut ranges = ranges_of(&self.missing);
        let ranges_total = ranges.len() as u64;
        ranges.truncate(MISSING_RANGES_MAX);
        Missing {
            count: self.missing.len() as u64,
            ranges,
            ranges_total,
        }
    }
}

/// See [`Event::ReportDelivered`]. Key `delivered`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportDelivered {
    /// The webhook's HTTP status.
    pub status: u16,
    /// Which report: absent for the batch's report (key `delivered`),
    /// `delivery` for its delivery report (key `delivery_report_delivered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
}

/// See [`Event::InputRejected`]. Key `reject/<seq>/<digest>` (or `reject/<entry id>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct InputRejected {
    /// The rejected chunk's seq, when it could be read.
    pub seq: Option<u32>,
    /// Why.
    pub reason: String,
    /// Whether the refusal left its seq without data (not assigned, not
    /// beyond the last seq): the batch ends without it (see `settle.lua`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub hole: bool,
    /// The batch's last seq, when this refusal taught the batch its end: the
    /// chunk was flagged `last` and the batch did not know its end yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<u32>,
    /// Why [`InputRejected::last`] is not this chunk's seq: its `last` flag
    /// contradicted a higher seq that had already arrived, and the batch
    /// ends at that one (named in the report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_conflict: Option<String>,
}

/// See [`Event::BatchStalled`]. Key `stalled/<last heartbeat ms>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchStalled {
    /// The last heartbeat (ms since the epoch) before the batch went quiet.
    pub quiet_since_ms: u64,
    /// How long it had been quiet when found.
    pub quiet_for_ms: u64,
}

/// One decoded stream entry of a batch's event log.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// The stream entry id.
    pub id: String,
    /// The idempotency key.
    pub key: String,
    /// The event.
    pub event: Event,
}

impl Recorded {
    /// Decodes a stream entry (its field/value pairs).
    pub fn from_fields(id: &str, fields: &[(String, Vec<u8>)]) -> Result<Recorded, DecodeError> {
        let get = |name: &'static str| {
            fields
                .iter()
                .find(|(f, _)| f == name)
                .map(|(_, v)| v.as_slice())
                .ok_or(DecodeError::MissingField(name))
        };
        let v = get("v")?;
        if v != ENVELOPE_VERSION.as_bytes() {
            return Err(DecodeError::UnknownVersion(clip(
                &String::from_utf8_lossy(v),
                QUOTE_MAX,
            )));
        }
        let t = String::from_utf8_lossy(get("t")?).into_owned();
        let key = String::from_utf8_lossy(get("k")?).into_owned();
        let event = Event::decode(&t, get("d")?)?;
        Ok(Recorded {
            id: id.to_string(),
            key,
            event,
        })
    }

    /// Milliseconds part of the entry id (when it was appended).
    pub fn millis(&self) -> u64 {
        entry_millis(&self.id)
    }
}

/// The milliseconds part of a stream entry id.
pub fn entry_millis(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_the_envelope() {
        let e = Event::ChunkLoaded(ChunkLoaded {
            gen: 1,
            seq: 7,
            group_id: "G4V".into(),
            registered: 2,
            duplicates: 0,
            failed: vec![RegistrationFailure {
                to: "0101".into(),
                code: "1062".into(),
            }],
            given_up: None,
        });
        let fields = vec![
            ("v".to_string(), b"1".to_vec()),
            ("t".to_string(), e.type_name().as_bytes().to_vec()),
            ("k".to_string(), b"loaded/1/7".to_vec()),
            ("d".to_string(), e.encode_data()),
        ];
        let r = Recorded::from_fields("5-0", &fields).expect("decodes");
        assert_eq!(r.event, e);
        assert_eq!(r.millis(), 5);
    }

    #[test]
    fn unknown_versions_and_types_are_named() {
        let fields = vec![("v".to_string(), b"9".to_vec())];
        assert!(
            matches!(Recorded::from_fields("1-0", &fields), Err(DecodeError::UnknownVersion(v)) if v == "9")
        );
        assert!(matches!(
            Event::decode("nope", b""),
            Err(DecodeError::UnknownType(_))
        ));
        assert!(matches!(
            Event::decode("chunk_assigned", b"\xc1"),
            Err(DecodeError::Malformed { .. })
        ));
    }
}
