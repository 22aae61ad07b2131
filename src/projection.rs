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
//! | `max`, `last` | highest seq accepted; the batch's last seq: flagged last (accepted or refused), or the highest seq received when a `last` flag contradicted it |
//! | `last_conflict` | why `last` is not the flagged seq: its flag contradicted a higher seq already received |
//! | `gen` | the newest generation |
//! | `g:<g>:n`, `g:<g>:c` | recipients and chunks assigned to generation g |
//! | `g:<g>:l` | chunks loaded into it |
//! | `g:<g>:closed` | `full`, `final`, `closed`, `cancelled` or `failed` |
//! | `g:<g>:failed` | the provider operation given up for good on generation g: `create` (its chunks are given up) or `send` (never claimed again) |
//! | `g:<g>:group` | its provider group |
//! | `g:<g>:reg`, `g:<g>:fail` | recipients registered / refused in it |
//! | `g:<g>:ready`, `g:<g>:sent`, `g:<g>:done`, `g:<g>:refused` | its send's progress (`done`: the provider's final status, or `empty`, `cancelled`, `unsent`, `unknown`) |
//! | `registered`, `failed`, `done`, `sent_success`, `sent_failed` | batch totals |
//! | `g:<g>:unsure` | recipients of given-up chunks: maybe registered, maybe not |
//! | `duplicates`, `x:<seq>` | copies of numbers already given to the batch; their positions in chunk `seq` |
//! | `r:<seq>`, `holes`, `rmax` | `1` while refused seq `seq` has no data (a hole; `0` once a corrected copy is assigned); how many; the highest |
//! | `fr:<code>` | recipients refused for that reason (a provider code, or `given_up`) |
//! | `closed`, `missing` | why the batch was closed; how many seqs it gave up on (their ranges are in its `batch_closed`) |
//! | `g:<g>:claimed`, `g:<g>:back` | the number of generation g's last send claim, and of the last one given back: claimed while `claimed > back` (a cancel leaves it alone) |
//! | `g:<g>:until` | the end of the lifetime its last claim was granted (ms): after a cancel, never renewed past it |
//! | `cancelled`, `stopped` | why the batch was cancelled; generations it stopped (done with status `cancelled`) |
//! | `unsent`, `unknown` | registered recipients never sent to (in generations a cancel stopped, or whose send was given up); registered recipients whose messages' fate is unknown (a poll or recall given up) |
//! | `report`, `delivered`, `rejected`, `stalls` | outcome and incidents |
//! | `g:<g>:dl` | `1` once generation g's delivery results are all in (or its delivery window ended) |
//! | `dl_delivered`, `dl_failed`, `dl_unknown`, `dl_gens`, `dlc:<code>` | delivery results of the generations delivered so far: delivered, failed at delivery, unknown, how many generations, failed at delivery by code |
//! | `dl_report`, `dl_report_delivered` | `1` once the delivery report is decided; the webhook's status once it accepted it |
//! | `origin` | the batch this one follows up (`<batch> (<filter>)`) |
//! | `alive` | ms of the last wait that showed the batch progressing (a poll of a group still sending, a limiter or durability wait): a heartbeat without an event, **not** derived from events ([`LIVE_ONLY`]) |
//! | `dlen`, `dstamp` | the length of the batch's number log and the stamp of its last frame (`accept.lua`, [`crate::protocol::numbers`]): bookkeeping of the dedupe key, **not** derived from events ([`LIVE_ONLY`]) |
//! | `after_end` | chunks that arrived after the batch had ended (reported, cancelled or closed), counted instead of dead-lettered (`note.lua`), **not** derived from events ([`LIVE_ONLY`]) |
//! | `creds_refused` | the provider's last refusal of the credentials on one of the batch's calls (`note.lua`), **not** derived from events ([`LIVE_ONLY`]) |
//!
//! The Rust side spells these names only in [`field`] (and the event keys it
//! looks up in [`event_key`]); handlers read them through [`Projection`]'s
//! typed accessors ([`Projection::group_of`], [`Projection::is_loaded`], ...).
//!
//! Every update is a set of a value fixed by the event, an increment, or a
//! maximum, and every event has a unique key: so the fold gives the same state
//! for any order and any duplication of the same events. One exception reads
//! the state: a hole (`r:<seq>`) is filled when its seq is assigned later,
//! which the scripts only ever record in that order.

use field::generation;
use std::collections::BTreeMap;
use std::ops::Bound;

use crate::events::{Event, Recorded};
use crate::seq_ranges::{missing_ranges, Missing};

/// The generations of a batch not done yet (see [`Projection::unfinished`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unfinished {
    /// Chunks still being loaded into them (or their group created).
    pub loading: Vec<u32>,
    /// Ready: their send is waiting or under way.
    pub sending: Vec<u32>,
    /// Sent: the provider has not finished them yet.
    pub polling: Vec<u32>,
    /// Their send was given up under its claim: the provider is asked
    /// whether it went out.
    pub recalling: Vec<u32>,
}

impl Unfinished {
    /// Whether every generation is done.
    pub fn is_empty(&self) -> bool {
        self.loading.is_empty()
            && self.sending.is_empty()
            && self.polling.is_empty()
            && self.recalling.is_empty()
    }

    /// One line: what remains, by kind (empty when nothing does).
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            (&self.loading, "loading"),
            (&self.sending, "ready to send (or sending)"),
            (&self.polling, "sent, awaiting the provider's result"),
            (
                &self.recalling,
                "send given up, asking the provider whether it went out",
            ),
        ]
        .into_iter()
        .filter(|(gens, _)| !gens.is_empty())
        .map(|(gens, what)| format!("{} {what} {gens:?}", gens.len()))
        .collect();
        parts.join("; ")
    }
}

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

/// The state hash's field names (the table above), spelt here only.
pub mod field {
    use std::fmt::Display;

    /// The heartbeat: ms of the last event (stalls excluded).
    pub const HEARTBEAT: &str = "hb";
    /// Ms of the last wait that showed the batch progressing (not an event;
    /// see [`LIVE_ONLY`](super::LIVE_ONLY)).
    pub const ALIVE: &str = "alive";
    /// The length of the batch's number log, in bytes (not an event; see
    /// [`LIVE_ONLY`](super::LIVE_ONLY)).
    pub const NUMBERS_LEN: &str = "dlen";
    /// The stamp of the number log's last frame (not an event; see
    /// [`LIVE_ONLY`](super::LIVE_ONLY)).
    pub const NUMBERS_STAMP: &str = "dstamp";
    /// Chunks that arrived after the batch had ended (reported, cancelled
    /// or closed): counted here instead of dead-lettered one by one (not an
    /// event; see [`LIVE_ONLY`](super::LIVE_ONLY)).
    pub const AFTER_END: &str = "after_end";
    /// The provider's last refusal of the credentials on one of the batch's
    /// calls (not an event; see [`LIVE_ONLY`](super::LIVE_ONLY)).
    pub const CREDS_REFUSED: &str = "creds_refused";
    /// ms of the first chunk's acceptance.
    pub const FIRST_ACCEPTED: &str = "t0";
    /// The batch's report outcome, once decided.
    pub const REPORT: &str = "report";
    /// Recipients registered, over every generation.
    pub const REGISTERED: &str = "registered";
    /// Recipients refused, over every generation.
    pub const FAILED: &str = "failed";

    /// Every field of a batch's state hash: the names above, and the
    /// templates of those that carry a value (`<...>`). The scripts' Lua is
    /// checked against it (`store::scripts` tests): a field the Lua touches
    /// that is not here fails a test.
    pub const VOCABULARY: &[&str] = &[
        HEARTBEAT,
        ALIVE,
        NUMBERS_LEN,
        NUMBERS_STAMP,
        AFTER_END,
        CREDS_REFUSED,
        FIRST_ACCEPTED,
        REPORT,
        REGISTERED,
        FAILED,
        DUPLICATES,
        REJECTED,
        MISSING,
        LAST_CONFLICT,
        CLOSED,
        HOLES,
        OPTIONS,
        DL_DELIVERED,
        DL_FAILED,
        DL_UNKNOWN,
        DL_GENS,
        DL_REPORT,
        DL_REPORT_DELIVERED,
        ORIGIN,
        CANCELLED,
        STOPPED,
        UNSENT,
        UNKNOWN,
        LAST,
        MAX,
        REFUSED_MAX,
        SEQS,
        GENERATION,
        RECIPIENTS,
        GENERATIONS_DONE,
        SENT_SUCCESS,
        SENT_FAILED,
        REPORT_DELIVERED,
        STALLS,
        "k:<key>",
        "s:<seq>",
        "r:<seq>",
        "x:<seq>",
        "fr:<code>",
        "dlc:<code>",
    ];

    /// The batch's last seq, once known (flagged or sealed).
    pub const LAST: &str = "last";
    /// The highest seq accepted.
    pub const MAX: &str = "max";
    /// The highest seq refused.
    pub const REFUSED_MAX: &str = "rmax";
    /// Seqs accepted.
    pub const SEQS: &str = "seqs";
    /// The generation being filled.
    pub const GENERATION: &str = "gen";
    /// Recipients accepted, over every generation.
    pub const RECIPIENTS: &str = "recipients";
    /// Generations done.
    pub const GENERATIONS_DONE: &str = "done";
    /// Messages the provider reported sent, over every generation.
    pub const SENT_SUCCESS: &str = "sent_success";
    /// Messages the provider reported failed, over every generation.
    pub const SENT_FAILED: &str = "sent_failed";
    /// The webhook's status when it accepted the report.
    pub const REPORT_DELIVERED: &str = "delivered";
    /// Stalls the watchdog recorded.
    pub const STALLS: &str = "stalls";

    /// `x:<seq>`: the positions in chunk `seq` of recipients the batch
    /// already had (`1,7`).
    pub fn duplicates_in(seq: impl Display) -> String {
        format!("x:{seq}")
    }

    /// The fields of one generation, `g:<gen>:<name>` (see [`gen`](super::field::gen)).
    pub mod generation {
        /// Recipients assigned to it.
        pub const RECIPIENTS: &str = "n";
        /// Chunks assigned to it.
        pub const CHUNKS: &str = "c";
        /// Chunks loaded into its group.
        pub const LOADED: &str = "l";
        /// Why it takes no more chunks (`full`, `last`, `cancelled`...).
        pub const CLOSED: &str = "closed";
        /// Its provider group.
        pub const GROUP: &str = "group";
        /// Recipients registered in its group.
        pub const REGISTERED: &str = "reg";
        /// Recipients refused by the provider.
        pub const REFUSED: &str = "fail";
        /// Recipients whose registration is unknown (a load given up).
        pub const UNSURE: &str = "unsure";
        /// How it finished (the group's status, `empty`, `cancelled`...).
        pub const DONE: &str = "done";
        /// The operation given up for good on it (`create` or `send`).
        pub const GIVEN_UP: &str = "failed";
        /// The number of its last send claim.
        pub const CLAIMED: &str = "claimed";
        /// The number of its last send claim given back.
        pub const GIVEN_BACK: &str = "back";
        /// The end of the lifetime its last claim was granted.
        pub const CLAIM_UNTIL: &str = "until";
        /// `1` once every chunk is loaded: its send is enqueued.
        pub const READY: &str = "ready";
        /// `1` once its delivery results are all in.
        pub const DELIVERED: &str = "dl";
        /// When its held send goes (Unix ms).
        pub const SCHEDULED_AT: &str = "at";
        /// Its send's outcome.
        pub const SENT: &str = "sent";
        /// Why the provider refused its send.
        pub const SEND_REFUSED: &str = "refused";

        /// Every one.
        pub const ALL: &[&str] = &[
            RECIPIENTS,
            CHUNKS,
            LOADED,
            CLOSED,
            GROUP,
            REGISTERED,
            REFUSED,
            UNSURE,
            DONE,
            GIVEN_UP,
            CLAIMED,
            GIVEN_BACK,
            CLAIM_UNTIL,
            READY,
            DELIVERED,
            SCHEDULED_AT,
            SENT,
            SEND_REFUSED,
        ];
    }

    /// `k:<key>`: the entry id of the event appended under idempotency `key`.
    pub fn key(event_key: &str) -> String {
        format!("k:{event_key}")
    }

    /// `s:<seq>`: the chunk's assignment, `<gen>|<count>|<digest>`.
    pub fn assignment(seq: impl Display) -> String {
        format!("s:{seq}")
    }

    /// `g:<gen>:<name>`: a field of generation `gen`.
    pub fn gen(gen: impl Display, name: &str) -> String {
        format!("g:{gen}:{name}")
    }

    /// `g:<gen>:group`: generation `gen`'s provider group.
    pub fn group(gen: impl Display) -> String {
        self::gen(gen, "group")
    }

    /// `g:<gen>:reg`: recipients registered in generation `gen`.
    pub fn registered_in(gen: impl Display) -> String {
        self::gen(gen, "reg")
    }

    /// `g:<gen>:unsure`: recipients of generation `gen` in chunks given up
    /// on, whose registration is unknown.
    pub fn unsure_in(gen: impl Display) -> String {
        self::gen(gen, "unsure")
    }

    /// `r:<seq>`: `1` while refused seq `seq` is a hole.
    pub fn hole(seq: impl Display) -> String {
        format!("r:{seq}")
    }

    /// `fr:<code>`: recipients refused for reason `code`.
    pub fn failed_for(code: &str) -> String {
        format!("fr:{code}")
    }

    /// Copies of numbers already given to the batch.
    pub const DUPLICATES: &str = "duplicates";
    /// Chunks refused.
    pub const REJECTED: &str = "rejected";
    /// Seqs given up on by `close`.
    pub const MISSING: &str = "missing";
    /// Why the batch's last seq is not the seq flagged last (its flag
    /// contradicted a higher seq already received).
    pub const LAST_CONFLICT: &str = "last_conflict";
    /// Why the batch was closed.
    pub const CLOSED: &str = "closed";
    /// How many holes.
    pub const HOLES: &str = "holes";
    /// The batch's options, canonical (set by its first accepted chunk).
    pub const OPTIONS: &str = "opts";

    /// Messages delivered, over the generations delivered so far.
    pub const DL_DELIVERED: &str = "dl_delivered";
    /// Messages failed at delivery, over the generations delivered so far.
    pub const DL_FAILED: &str = "dl_failed";
    /// Messages without a result at the end of the delivery window.
    pub const DL_UNKNOWN: &str = "dl_unknown";
    /// Generations whose delivery results are all in.
    pub const DL_GENS: &str = "dl_gens";
    /// `1` once the delivery report is decided.
    pub const DL_REPORT: &str = "dl_report";
    /// The webhook's status when it accepted the delivery report.
    pub const DL_REPORT_DELIVERED: &str = "dl_report_delivered";
    /// The batch this one follows up.
    pub const ORIGIN: &str = "origin";

    /// `dlc:<code>`: messages failed at delivery with the provider's `code`.
    pub fn delivery_failed_for(code: &str) -> String {
        format!("dlc:{code}")
    }

    /// `g:<gen>:dl`: generation `gen`'s delivery results are all in.
    pub fn delivered_in(gen: impl Display) -> String {
        self::gen(gen, "dl")
    }

    /// Why the batch was cancelled.
    pub const CANCELLED: &str = "cancelled";
    /// Generations the cancel stopped.
    pub const STOPPED: &str = "stopped";
    /// Registered recipients never sent to: in the generations a cancel
    /// stopped, or whose send was given up.
    pub const UNSENT: &str = "unsent";
    /// Registered recipients whose messages' fate is unknown (a poll or a
    /// recall given up).
    pub const UNKNOWN: &str = "unknown";

    /// `g:<gen>:claimed`: the number of generation `gen`'s last send claim.
    pub fn claimed(gen: impl Display) -> String {
        self::gen(gen, "claimed")
    }

    /// `g:<gen>:failed`: the operation given up for good on generation
    /// `gen` (`create` or `send`).
    pub fn failed_in(gen: impl Display) -> String {
        self::gen(gen, "failed")
    }

    /// `g:<gen>:back`: the number of generation `gen`'s last send claim
    /// given back (claimed while `claimed > back`).
    pub fn claim_back(gen: impl Display) -> String {
        self::gen(gen, "back")
    }

    /// `g:<gen>:until`: the end of the lifetime its last claim was granted.
    pub fn claim_until(gen: impl Display) -> String {
        self::gen(gen, "until")
    }
}

/// The idempotency keys of the events appended outside the batch scripts,
/// and of those whose presence a handler looks up (the scripts spell theirs).
pub mod event_key {
    use std::fmt::Display;

    /// `chunk_assigned` of `seq`.
    pub fn assign(seq: impl Display) -> String {
        format!("assign/{seq}")
    }

    /// `group_created` of generation `gen`.
    pub fn group(gen: impl Display) -> String {
        format!("group/{gen}")
    }

    /// `chunk_loaded` of `seq` into generation `gen`.
    pub fn loaded(gen: impl Display, seq: impl Display) -> String {
        format!("loaded/{gen}/{seq}")
    }

    /// `generation_ready` of generation `gen`.
    pub fn ready(gen: impl Display) -> String {
        format!("ready/{gen}")
    }

    /// `send_scheduled` of generation `gen` (its first hold).
    pub fn schedule(gen: impl Display) -> String {
        format!("schedule/{gen}")
    }

    /// `send_triggered` of generation `gen`.
    pub fn send(gen: impl Display) -> String {
        format!("send/{gen}")
    }

    /// `send_refused` of generation `gen`.
    pub fn refused(gen: impl Display) -> String {
        format!("refused/{gen}")
    }

    /// `group_completed` of generation `gen`.
    pub fn done(gen: impl Display) -> String {
        format!("done/{gen}")
    }

    /// `group_discarded` of the losing group `group_id`.
    pub fn discard(group_id: &str) -> String {
        format!("discard/{group_id}")
    }

    /// `send_claimed` of generation `gen`.
    pub fn claim(gen: impl Display) -> String {
        format!("claim/{gen}")
    }

    /// `send_claimed` of generation `gen`'s claim number `n` (the first is
    /// [`claim`]).
    pub fn claim_again(gen: impl Display, n: impl Display) -> String {
        format!("claim/{gen}/{n}")
    }

    /// `claim_given_back` of generation `gen`'s claim number `n`.
    pub fn back(gen: impl Display, n: impl Display) -> String {
        format!("back/{gen}/{n}")
    }

    /// `chunk_parked` of `seq`.
    pub fn park(seq: impl Display) -> String {
        format!("park/{seq}")
    }

    /// `group_requested` of generation `gen`.
    pub fn create(gen: impl Display) -> String {
        format!("create/{gen}")
    }

    /// `generation_closed` of generation `gen`.
    pub fn close(gen: impl Display) -> String {
        format!("close/{gen}")
    }

    /// `chunks_released` of generation `gen`.
    pub fn release(gen: impl Display) -> String {
        format!("release/{gen}")
    }

    /// `generation_failed` of generation `gen` (its create or its send).
    pub fn failed(gen: impl Display) -> String {
        format!("failed/{gen}")
    }

    /// `generation_failed` of generation `gen`'s `what` given up (`poll`,
    /// `recall`, `unsent`: its send is [`failed`]).
    pub fn failed_to(gen: impl Display, what: &str) -> String {
        format!("failed/{gen}/{what}")
    }

    /// `input_rejected` of chunk `seq` with content `digest`.
    pub fn reject(seq: impl Display, digest: &str) -> String {
        format!("reject/{seq}/{digest}")
    }

    /// `batch_closed`.
    pub const CLOSED: &str = "closed";

    /// `batch_sealed`.
    pub const SEAL: &str = "seal";

    /// `batch_reported`.
    pub const REPORT: &str = "report";

    /// `batch_cancelled`.
    pub const CANCELLED: &str = "cancelled";

    /// `batch_stalled` for the heartbeat `hb` found stale.
    pub fn stalled(hb: &str) -> String {
        format!("stalled/{hb}")
    }

    /// `report_delivered`.
    pub const DELIVERED: &str = "delivered";

    /// `batch_delivered`, the delivery report.
    pub const DELIVERY_REPORT: &str = "delivery_report";

    /// `report_delivered` of the delivery report.
    pub const DELIVERY_REPORT_DELIVERED: &str = "delivery_report_delivered";

    /// `generation_delivered` of generation `gen`.
    pub fn gen_delivered(gen: impl Display) -> String {
        format!("delivered/{gen}")
    }

    /// `batch_origin`.
    pub const ORIGIN: &str = "origin";
}

fn g(gen: u32, name: &str) -> String {
    field::gen(gen, name)
}

/// The state changes an event makes (besides its `k:` key and `hb`).
pub fn updates(event: &Event) -> Vec<Update> {
    use Update::*;
    match event {
        Event::ChunkAssigned(e) => chunk_assigned(e),
        Event::GenerationClosed(e) => vec![Set(g(e.gen, generation::CLOSED), e.reason.clone())],
        Event::GroupCreated(e) => vec![Set(g(e.gen, generation::GROUP), e.group_id.clone())],
        Event::ChunkLoaded(e) => chunk_loaded(e),
        Event::GenerationReady(e) => vec![Set(g(e.gen, generation::READY), "1".into())],
        Event::SendScheduled(e) => {
            vec![Set(g(e.gen, generation::SCHEDULED_AT), e.at_ms.to_string())]
        }
        Event::SendTriggered(e) => vec![Set(g(e.gen, generation::SENT), e.outcome.clone())],
        Event::SendRefused(e) => vec![Set(g(e.gen, generation::SEND_REFUSED), e.reason.clone())],
        Event::BatchClosed(e) => vec![
            Set(field::CLOSED.into(), e.reason.clone()),
            Set(field::MISSING.into(), e.count().to_string()),
        ],
        Event::BatchSealed(e) => vec![Set(field::LAST.into(), e.last.to_string())],
        Event::GroupCompleted(e) => group_completed(e),
        Event::BatchReported(e) => vec![Set(field::REPORT.into(), e.outcome.clone())],
        Event::ReportDelivered(e) if e.report.is_some() => {
            vec![Set(field::DL_REPORT_DELIVERED.into(), e.status.to_string())]
        }
        Event::ReportDelivered(e) => {
            vec![Set(field::REPORT_DELIVERED.into(), e.status.to_string())]
        }
        Event::InputRejected(e) => input_rejected(e),
        Event::BatchStalled(_) => vec![Incr(field::STALLS.into(), 1)],
        Event::SendClaimed(e) => {
            let mut u = vec![Max(field::claimed(e.gen), u64::from(e.n.unwrap_or(1)))];
            if let Some(until) = e.until_ms {
                u.push(Max(field::claim_until(e.gen), until));
            }
            u
        }
        Event::ClaimGivenBack(e) => {
            let mut u = vec![Max(g(e.gen, generation::GIVEN_BACK), u64::from(e.n))];
            if e.stopped {
                u.push(Incr(field::STOPPED.into(), 1));
                u.push(Incr(field::UNSENT.into(), e.unsent as i64));
            }
            u
        }
        Event::BatchCancelled(e) => vec![
            Set(field::CANCELLED.into(), e.reason.clone()),
            Incr(field::STOPPED.into(), e.stopped.len() as i64),
            Incr(field::UNSENT.into(), e.unsent as i64),
        ],
        // A create or a send given up marks the generation (no create, no
        // claim any more); a poll or recall given up ends it (`done`).
        Event::GenerationFailed(e) if e.op == "create" || e.op == "send" => {
            vec![Set(field::failed_in(e.gen), e.op.clone())]
        }
        Event::GenerationFailed(_) => vec![],
        // An operator's act on a dead letter: in the log for `audit`,
        // nothing in the state.
        Event::DeadLetterHandled(_) => vec![],
        Event::GenerationDelivered(e) => generation_delivered(e),
        Event::BatchDelivered(_) => vec![Set(field::DL_REPORT.into(), "1".into())],
        Event::BatchOrigin(e) => vec![Set(field::ORIGIN.into(), e.describe())],
        Event::ChunkParked(_)
        | Event::GroupRequested(_)
        | Event::ChunksReleased(_)
        | Event::GroupDiscarded(_) => vec![],
    }
}

/// The updates of `chunk_assigned`: the chunk's assignment, its generation's
/// and the batch's counters, and what it says of the batch (its last seq,
/// its copies, its options).
fn chunk_assigned(e: &crate::events::ChunkAssigned) -> Vec<Update> {
    use Update::*;
    let mut u = vec![
        Set(
            field::assignment(e.seq),
            format!("{}|{}|{}", e.gen, e.count, e.digest),
        ),
        Incr(g(e.gen, generation::RECIPIENTS), i64::from(e.count)),
        Incr(g(e.gen, generation::CHUNKS), 1),
        Max(field::GENERATION.into(), u64::from(e.gen)),
        Incr(field::SEQS.into(), 1),
        Incr(field::RECIPIENTS.into(), i64::from(e.count)),
        Max(field::MAX.into(), u64::from(e.seq)),
    ];
    if e.last {
        u.push(Set(field::LAST.into(), e.seq.to_string()));
    }
    if !e.duplicates.is_empty() {
        let positions: Vec<String> = e.duplicates.iter().map(u32::to_string).collect();
        u.push(Set(format!("x:{}", e.seq), positions.join(",")));
        u.push(Incr(field::DUPLICATES.into(), e.duplicates.len() as i64));
    }
    if let Some(opts) = &e.opts {
        u.push(Set(field::OPTIONS.into(), opts.clone()));
    }
    u
}

/// The updates of `chunk_loaded`: its generation's and the batch's
/// registered and failed counts (by failure code).
fn chunk_loaded(e: &crate::events::ChunkLoaded) -> Vec<Update> {
    use Update::*;
    let failed = e.failed.len() as i64;
    let mut u = vec![
        Incr(g(e.gen, generation::LOADED), 1),
        Incr(g(e.gen, generation::REGISTERED), i64::from(e.registered)),
        Incr(g(e.gen, generation::REFUSED), failed),
        Incr(field::REGISTERED.into(), i64::from(e.registered)),
        Incr(field::FAILED.into(), failed),
    ];
    if e.given_up.is_some() && failed > 0 {
        u.push(Incr(field::unsure_in(e.gen), failed));
    }
    for f in &e.failed {
        u.push(Incr(field::failed_for(&f.code), 1));
    }
    u
}

/// The updates of `group_completed`: the generation done, and its
/// recipients counted as what became of them.
fn group_completed(e: &crate::events::GroupCompleted) -> Vec<Update> {
    use Update::*;
    let mut u = vec![
        Set(g(e.gen, generation::DONE), e.status.clone()),
        Incr(field::GENERATIONS_DONE.into(), 1),
        Incr(field::SENT_SUCCESS.into(), e.sent_success as i64),
        Incr(field::SENT_FAILED.into(), e.sent_failed as i64),
    ];
    // A send given up counts its registered recipients as what
    // became of them (the script's increment creates the field).
    match e.status.as_str() {
        "unsent" => u.push(Incr(field::UNSENT.into(), e.recipients as i64)),
        "unknown" => u.push(Incr(field::UNKNOWN.into(), e.recipients as i64)),
        _ => {}
    }
    u
}

/// The updates of `input_rejected`: the rejection counted, and what it
/// says of the batch's last seq and its holes.
fn input_rejected(e: &crate::events::InputRejected) -> Vec<Update> {
    use Update::*;
    let mut u = vec![Incr(field::REJECTED.into(), 1)];
    if let Some(last) = e.last {
        u.push(Set(field::LAST.into(), last.to_string()));
    }
    if let Some(why) = &e.last_conflict {
        u.push(Set(field::LAST_CONFLICT.into(), why.clone()));
    }
    if let (true, Some(seq)) = (e.hole, e.seq) {
        u.push(Set(field::hole(seq), "1".into()));
        u.push(Incr(field::HOLES.into(), 1));
        u.push(Max(field::REFUSED_MAX.into(), u64::from(seq)));
    }
    u
}

/// The updates of `generation_delivered`: the delivery results of a
/// generation, counted.
fn generation_delivered(e: &crate::events::GenerationDelivered) -> Vec<Update> {
    use Update::*;
    let mut u = vec![
        Set(field::delivered_in(e.gen), "1".into()),
        Incr(field::DL_DELIVERED.into(), e.delivered as i64),
        Incr(field::DL_FAILED.into(), e.failed as i64),
        Incr(field::DL_UNKNOWN.into(), e.unknown as i64),
        Incr(field::DL_GENS.into(), 1),
    ];
    for (code, n) in &e.failed_by_code {
        u.push(Incr(field::delivery_failed_for(code), *n as i64));
    }
    u
}

/// State fields kept by the live copy only, not derived from events: the
/// `alive` heartbeat (stamped by waits that append no event), `dlen` and
/// `dstamp` (the number log's own bookkeeping, kept in the state so that
/// `accept.lua`'s one read of the state finds it), and the notes of
/// `note.lua` (`after_end`, `creds_refused`). A rebuild keeps them
/// (`restore.lua`); a comparison with a replay ignores them.
pub const LIVE_ONLY: &[&str] = &[
    field::ALIVE,
    field::NUMBERS_LEN,
    field::NUMBERS_STAMP,
    field::AFTER_END,
    field::CREDS_REFUSED,
];

/// Whether an event refreshes the batch's heartbeat.
pub fn touches_heartbeat(event: &Event) -> bool {
    !matches!(event, Event::BatchStalled(_) | Event::DeadLetterHandled(_))
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
        let kf = field::key(&r.key);
        if self.fields.contains_key(&kf) {
            return;
        }
        self.fields.insert(kf, r.id.clone());
        if touches_heartbeat(&r.event) {
            self.max(field::HEARTBEAT, r.millis());
        }
        if let Event::ChunkAssigned(e) = &r.event {
            // When the batch's first chunk was accepted.
            let t0 = self.first_accepted_ms();
            if t0.is_none_or(|t| r.millis() < t) {
                self.fields
                    .insert(field::FIRST_ACCEPTED.into(), r.millis().to_string());
            }
            // A corrected copy of a seq refused earlier fills its hole.
            if self.get(&field::hole(e.seq)) == Some("1") {
                self.fields.insert(field::hole(e.seq), "0".into());
                let holes = self.int(field::HOLES) - 1;
                self.fields.insert(field::HOLES.into(), holes.to_string());
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
        match self
            .get(field::GENERATION)
            .and_then(|v| v.parse::<u32>().ok())
        {
            Some(g) => g + 1,
            None => 0,
        }
    }

    /// The seq flagged last, when known.
    pub fn last_seq(&self) -> Option<u32> {
        self.get(field::LAST).and_then(|v| v.parse().ok())
    }

    /// The entry id of the event appended under idempotency key `key`, if
    /// it was.
    pub fn appended(&self, event_key: &str) -> Option<&str> {
        self.get(&field::key(event_key))
    }

    /// Generation `gen`'s provider group, once recorded.
    pub fn group_of(&self, gen: u32) -> Option<&str> {
        self.get(&field::group(gen))
    }

    /// The operation given up for good on generation `gen` (`create`: its
    /// group can never be created), if any.
    pub fn failed_in(&self, gen: u32) -> Option<&str> {
        self.get(&field::failed_in(gen))
    }

    /// Recipients registered in generation `gen` (0 when none or unknown).
    pub fn registered_in(&self, gen: u32) -> u64 {
        self.get(&field::registered_in(gen))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Recipients of generation `gen` in given-up chunks (maybe registered).
    pub fn unsure_in(&self, gen: u32) -> u64 {
        self.get(&field::unsure_in(gen))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// The seqs not (yet) received: from 0 to the last seq (or, the last
    /// unknown, to the highest seq received or refused), those neither
    /// assigned nor refused for good (a hole); as ranges, at most `max` of
    /// them listed. The work is proportional to the seqs that arrived
    /// (their `s:`/`r:` fields), never to the highest seq.
    pub fn missing_seqs(&self, max: usize) -> Missing {
        let highest = |f: &str| self.get(f).and_then(|v| v.parse::<u32>().ok());
        let top = self
            .last_seq()
            .or_else(|| highest(field::MAX).max(highest(field::REFUSED_MAX)));
        let seqs = |prefix: &'static str, next: &'static str| {
            self.fields
                .range::<str, _>((Bound::Included(prefix), Bound::Excluded(next)))
                .filter_map(move |(k, v)| {
                    let seq = k.strip_prefix(prefix)?.parse::<u32>().ok()?;
                    // `r:<seq>` is `0` once a corrected copy is assigned.
                    (prefix == "s:" || v == "1").then_some(seq)
                })
        };
        missing_ranges(seqs("s:", "s;").chain(seqs("r:", "r;")), top, max)
    }

    /// Whether chunk `seq` is recorded loaded into generation `gen`.
    pub fn is_loaded(&self, gen: u32, seq: u32) -> bool {
        self.appended(&event_key::loaded(gen, seq)).is_some()
    }

    /// The heartbeat, as stored (ms of the last event, stalls excluded).
    pub fn heartbeat(&self) -> Option<&str> {
        self.get(field::HEARTBEAT)
    }

    /// When the first chunk was accepted (ms since the epoch).
    pub fn first_accepted_ms(&self) -> Option<u64> {
        self.get(field::FIRST_ACCEPTED)?.parse().ok()
    }

    /// The report's outcome, once decided.
    pub fn report(&self) -> Option<&str> {
        self.get(field::REPORT)
    }

    /// The generations not done yet, by what they wait for: what a close or
    /// a cancel can truthfully say remains before the report.
    pub fn unfinished(&self) -> Unfinished {
        let mut u = Unfinished::default();
        for gen in 0..self.generations() {
            if self.gen_field(gen, generation::DONE).is_some() {
                continue;
            }
            let list = if self.failed_in(gen) == Some("send") {
                &mut u.recalling
            } else if self.gen_field(gen, generation::SENT).is_some() {
                &mut u.polling
            } else if self.gen_field(gen, generation::READY).is_some() {
                &mut u.sending
            } else {
                &mut u.loading
            };
            list.push(gen);
        }
        u
    }

    /// Why the batch was cancelled, if it was.
    pub fn cancelled(&self) -> Option<&str> {
        self.get(field::CANCELLED)
    }

    /// The assignment of a seq: (gen, count, digest).
    pub fn assignment(&self, seq: u32) -> Option<(u32, u32, String)> {
        let v = self.get(&field::assignment(seq))?;
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
