//! What each script and its callers agree on, declared once: its keys and
//! arguments in order, the tags its replies start with, the events it
//! appends (by idempotency key) and the work it enqueues next.
//!
//! The script's Lua reads its keys and arguments by these names: the loader
//! binds them (`local PARKED, WORK = KEYS[3], KEYS[4]` ...) in front of the
//! source, and the store passes them by name through [`super::Call`], which
//! refuses a call out of this order. `tests.rs` reads the Lua and fails
//! when it uses a name, a reply tag, an event, a work op or a state field
//! that is not declared here (or in [`crate::projection::field`]), or does
//! not use one that is.
//!
//! Read the table to follow a chunk (each script's `next`, with its
//! layout's: [`Declaration::next_steps`]): [`ACCEPT`] assigns it to a
//! generation; a chunk whose generation has no group yet goes to [`PARK`],
//! which enqueues the generation's `create`; [`RECORD_GROUP`] records the
//! group and `prelude.lua`'s `release` hands the parked chunks to the
//! loaders (`load`); [`LOADED`] counts one in, and `settle.lua` enqueues the
//! generation's `send` once its last one is; [`CLAIM_SEND`] and [`SENT`]
//! bracket the send, whose `poll` waits in the delayed set; [`COMPLETED`]
//! records the provider's verdict, and `settle.lua` enqueues the `report`
//! once every generation is done (and `track`, with delivery tracking).

use crate::events::work_item::Op;

/// The keys and leading arguments a script shares with others of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Its own keys and arguments only.
    Plain,
    /// A batch script: `prelude.lua` first (keys `state`, `events`, argument
    /// `batch`), with its helpers: `emit`, `put`, `flush`, `reply`, and
    /// `release`, which hands a generation's parked chunks to the loaders.
    Batch,
    /// A batch script that can end the batch: `prelude.lua` then
    /// `settle.lua`, whose keys and arguments come first.
    Settling,
}

/// What a script may do next, for the reader who follows a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Adds a work item of this op to the batch's work stream (`XADD ...
    /// 'op', '<op>'`).
    Enqueues(Op),
    /// Puts a work item of this op, made by the caller, into the delayed set.
    Delays(Op),
    /// Moves due work items from the delayed set back to their lanes, and
    /// one it cannot read as op [`UNREADABLE_OP`] (the consumer
    /// dead-letters it).
    Promotes,
}

/// The op of a delayed entry `promote.lua` could not read.
pub const UNREADABLE_OP: &str = "invalid";

/// One event a script appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appends {
    /// Its idempotency key, `<...>` standing for a value (`park/<seq>`).
    pub key: &'static str,
    /// Its event type ([`crate::events::Event::type_name`]).
    pub event: &'static str,
}

const fn appends(key: &'static str, event: &'static str) -> Appends {
    Appends { key, event }
}

/// A script's side of the boundary.
#[derive(Debug, Clone, Copy)]
pub struct Declaration {
    /// Its file in `streams/scripts/`, without `.lua`.
    pub name: &'static str,
    /// The keys and arguments it shares with others.
    pub layout: Layout,
    /// Its own keys, after the layout's, in order; a trailing `?` marks one
    /// the caller may leave out (it and those after it).
    pub keys: &'static [&'static str],
    /// What follows its named keys, when a call passes a variable number.
    pub more_keys: Option<&'static str>,
    /// Its own arguments, after the layout's, in order (`?` as for keys).
    pub args: &'static [&'static str],
    /// What follows its named arguments, when a call passes a variable
    /// number.
    pub more_args: Option<&'static str>,
    /// The tags its reply starts with (empty: it answers a number or a list
    /// without a tag).
    pub replies: &'static [&'static str],
    /// The events it appends itself (its layout's are the layout's).
    pub appends: &'static [Appends],
    /// What it enqueues itself.
    pub next: &'static [Next],
}

const PLAIN: Declaration = Declaration {
    name: "",
    layout: Layout::Plain,
    keys: &[],
    more_keys: None,
    args: &[],
    more_args: None,
    replies: &[],
    appends: &[],
    next: &[],
};

/// `prelude.lua`: the part every batch script starts with.
pub const PRELUDE: Declaration = Declaration {
    name: "prelude",
    keys: &["state", "events"],
    args: &["batch"],
    appends: &[appends("release/<gen>", "chunks_released")],
    next: &[Next::Enqueues(Op::Load)],
    ..PLAIN
};

/// `settle.lua`: the part every script that can end a batch shares.
pub const SETTLE: Declaration = Declaration {
    name: "settle",
    keys: &["work", "active", "reports", "numbers", "reported"],
    args: &["policy"],
    appends: &[
        appends("close/<gen>", "generation_closed"),
        appends("ready/<gen>", "generation_ready"),
        appends("done/<gen>", "group_completed"),
        appends("report", "batch_reported"),
        appends("<key>", "input_rejected"),
    ],
    next: &[
        Next::Enqueues(Op::Send),
        Next::Enqueues(Op::Delete),
        Next::Enqueues(Op::Report),
        Next::Enqueues(Op::Track),
    ],
    ..PLAIN
};

/// `accept.lua`: accept a chunk (or several of one batch, in turn, while
/// each is assigned) and assign it to a generation, with the copies the
/// caller found in its view of the batch's number log (`protocol::numbers`),
/// if the log still ends where the view does.
pub const ACCEPT: Declaration = Declaration {
    name: "accept",
    layout: Layout::Settling,
    args: &[
        "seq",
        "last",
        "count",
        "digest",
        "cap",
        "hint",
        "seen",
        "stamp",
        "duplicates",
        "frame",
        "opts",
    ],
    more_args: Some(
        "for each further chunk of the batch: seq, last, count, digest, seen, stamp, duplicates, frame, opts",
    ),
    replies: &[
        "assigned",
        "duplicate",
        "conflict",
        "rejected",
        "refused",
        "behind",
    ],
    appends: &[
        appends("assign/<seq>", "chunk_assigned"),
        appends("create/<gen>", "group_requested"),
        appends("close/<gen>", "generation_closed"),
    ],
    next: &[Next::Enqueues(Op::Create)],
    ..PLAIN
};

/// `park.lua`: park a chunk whose generation has no group yet.
pub const PARK: Declaration = Declaration {
    name: "park",
    layout: Layout::Batch,
    keys: &["parked", "work"],
    args: &["seq", "gen", "payload"],
    replies: &["parked", "group", "loaded", "unassigned", "failed", "ended"],
    appends: &[
        appends("park/<seq>", "chunk_parked"),
        appends("create/<gen>", "group_requested"),
    ],
    next: &[Next::Enqueues(Op::Create)],
    ..PLAIN
};

/// `record_group.lua`: record a generation's group, first creator wins, and
/// release its parked chunks.
pub const RECORD_GROUP: Declaration = Declaration {
    name: "record_group",
    layout: Layout::Batch,
    keys: &["parked", "work"],
    args: &["gen", "group"],
    replies: &["won", "lost", "cancelled", "failed"],
    appends: &[appends("group/<gen>", "group_created")],
    ..PLAIN
};

/// `loaded.lua`: a chunk is at the provider; the generation's last one
/// makes it ready to send.
pub const LOADED: Declaration = Declaration {
    name: "loaded",
    layout: Layout::Settling,
    args: &[
        "gen",
        "seq",
        "registered",
        "failed",
        "data",
        "failed_by_reason",
        "unsure",
    ],
    replies: &["loaded", "duplicate", "cancelled"],
    appends: &[appends("loaded/<gen>/<seq>", "chunk_loaded")],
    ..PLAIN
};

/// `reject.lua`: a chunk refused before it could be accepted.
pub const REJECT: Declaration = Declaration {
    name: "reject",
    layout: Layout::Settling,
    args: &["seq", "digest", "reason", "flagged_last"],
    replies: &["rejected", "refused"],
    ..PLAIN
};

/// `close.lua`: stop waiting for seqs that never arrived.
pub const CLOSE: Declaration = Declaration {
    name: "close",
    layout: Layout::Settling,
    args: &["reason"],
    replies: &["closed", "reported", "unknown"],
    appends: &[appends("closed", "batch_closed")],
    ..PLAIN
};

/// `seal.lua`: the producer names the batch's last seq.
pub const SEAL: Declaration = Declaration {
    name: "seal",
    layout: Layout::Settling,
    args: &["last"],
    replies: &["sealed", "conflict", "ended"],
    appends: &[appends("seal", "batch_sealed")],
    ..PLAIN
};

/// `cancel.lua`: stop a batch.
pub const CANCEL: Declaration = Declaration {
    name: "cancel",
    layout: Layout::Settling,
    args: &["reason"],
    replies: &["cancelled", "forgotten", "reported"],
    appends: &[appends("cancelled", "batch_cancelled")],
    ..PLAIN
};

/// `claim_send.lua`: claim (or renew, or check) the right to send a
/// generation, within its schedule.
pub const CLAIM_SEND: Declaration = Declaration {
    name: "claim_send",
    layout: Layout::Settling,
    args: &["gen", "mode", "lifetime", "send_at", "quiet"],
    replies: &["claimed", "free", "held", "stale", "cancelled", "done"],
    appends: &[
        appends("claim/<gen>/<n>", "send_claimed"),
        appends("back/<gen>/<n>", "claim_given_back"),
        appends("schedule/<gen>", "send_scheduled"),
    ],
    ..PLAIN
};

/// `sent.lua`: a generation's send went out; its poll waits in the delayed
/// set.
pub const SENT: Declaration = Declaration {
    name: "sent",
    layout: Layout::Batch,
    keys: &["delayed"],
    args: &["gen", "group", "outcome", "poll_delay", "poll_entry"],
    replies: &["recorded", "duplicate", "done"],
    appends: &[appends("send/<gen>", "send_triggered")],
    next: &[Next::Delays(Op::Poll)],
    ..PLAIN
};

/// `completed.lua`: the provider finished a generation's group.
pub const COMPLETED: Declaration = Declaration {
    name: "completed",
    layout: Layout::Settling,
    args: &["gen", "group", "status", "sent_success", "sent_failed"],
    replies: &["completed", "duplicate", "reported", "not_sent"],
    appends: &[appends("done/<gen>", "group_completed")],
    next: &[Next::Enqueues(Op::Track)],
    ..PLAIN
};

/// `append.lua`: one event whose projection change the caller fixed.
pub const APPEND: Declaration = Declaration {
    name: "append",
    layout: Layout::Batch,
    args: &["key", "type", "data", "touch"],
    more_args: Some("triples (op `set` or `incr`, field, value)"),
    replies: &["appended", "duplicate"],
    appends: &[appends("<key>", "<type>")],
    ..PLAIN
};

/// `stalled.lua`, then `append.lua`: the watchdog's `batch_stalled`, only
/// while the batch is still quiet.
pub const STALLED: Declaration = Declaration {
    name: "stalled",
    replies: &["reported", "fresh", "appended", "duplicate"],
    ..APPEND
};

/// `dead_letter.lua`: move an entry to the dead letters and acknowledge it.
pub const DEAD_LETTER: Declaration = Declaration {
    name: "dead_letter",
    keys: &["dead_letters", "source", "state?"],
    args: &["group", "entry", "event_key?", "event_id?"],
    more_args: Some("field/value pairs of the dead letter"),
    ..PLAIN
};

/// `retry_later.lua`: an entry comes back after a delay.
pub const RETRY_LATER: Declaration = Declaration {
    name: "retry_later",
    keys: &["delayed", "source", "state?"],
    args: &[
        "group",
        "entry",
        "delay",
        "delayed_entry",
        "alive?",
        "load_seq?",
        "load_gen?",
        "load_group?",
    ],
    next: &[Next::Delays(Op::Load)],
    ..PLAIN
};

/// `promote.lua`: due delayed entries back to their lanes' work streams.
pub const PROMOTE: Declaration = Declaration {
    name: "promote",
    keys: &["delayed", "normal", "urgent", "bulk"],
    args: &["most"],
    next: &[Next::Promotes],
    ..PLAIN
};

/// `rate_limit.lua`: reserve provider requests from the shared limiter.
pub const RATE_LIMIT: Declaration = Declaration {
    name: "rate_limit",
    keys: &["limiter", "owed?"],
    args: &[
        "rate",
        "burst",
        "cost",
        "max_wait?",
        "horizon?",
        "share?",
        "ahead?",
        "window?",
    ],
    ..PLAIN
};

/// `learn_rate.lua`: lower the learned rate after the provider's `429`.
pub const LEARN_RATE: Declaration = Declaration {
    name: "learn_rate",
    keys: &["learned"],
    args: &["first_rate", "lowest_rate", "keep", "period"],
    ..PLAIN
};

/// `lease.lua`: take or renew the watchdog scanner's lease.
pub const LEASE: Declaration = Declaration {
    name: "lease",
    keys: &["lease"],
    args: &["holder", "ttl"],
    ..PLAIN
};

/// `release.lua`: give the scanner's lease up.
pub const RELEASE: Declaration = Declaration {
    name: "release",
    keys: &["lease"],
    args: &["holder"],
    ..PLAIN
};

/// `renew_lease.lua`: keep a pending entry one's own.
pub const RENEW_LEASE: Declaration = Declaration {
    name: "renew_lease",
    keys: &["stream"],
    args: &["group", "consumer", "entry"],
    ..PLAIN
};

/// `restore.lua`: replace a batch's state with one rebuilt from its events.
pub const RESTORE: Declaration = Declaration {
    name: "restore",
    keys: &["state", "events"],
    args: &["read_up_to"],
    more_args: Some("field/value pairs of the rebuilt state"),
    ..PLAIN
};

/// `ack_recorded.lua`: acknowledge entries whose events are still recorded.
pub const ACK_RECORDED: Declaration = Declaration {
    name: "ack_recorded",
    keys: &["stream"],
    more_keys: Some("the state hashes of the batches named in the arguments"),
    args: &["group"],
    more_args: Some("per entry: its id, its state's index in KEYS, the event's key and entry id"),
    ..PLAIN
};

/// `fail_generation.lua`: a generation's group can never be created.
pub const FAIL_GENERATION: Declaration = Declaration {
    name: "fail_generation",
    layout: Layout::Settling,
    keys: &["parked"],
    args: &["gen", "reason"],
    replies: &["failed", "duplicate", "ended", "group"],
    appends: &[appends("failed/<gen>", "generation_failed")],
    ..PLAIN
};

/// `give_up_send.lua`: a generation's send, poll or recall given up.
pub const GIVE_UP_SEND: Declaration = Declaration {
    name: "give_up_send",
    layout: Layout::Settling,
    args: &["gen", "what", "reason", "group"],
    replies: &["unsent", "recalling", "unknown", "sent", "done", "stale"],
    appends: &[
        appends("failed/<gen>", "generation_failed"),
        appends("failed/<gen>/<what>", "generation_failed"),
        appends("done/<gen>", "group_completed"),
    ],
    next: &[Next::Enqueues(Op::Delete), Next::Enqueues(Op::Recall)],
    ..PLAIN
};

/// `note.lua`: a fact about a batch on its state, without an event.
pub const NOTE: Declaration = Declaration {
    name: "note",
    keys: &["state"],
    args: &["mode", "field", "value?"],
    ..PLAIN
};

/// `track_page.lua`: one page of a sent group's message list.
pub const TRACK_PAGE: Declaration = Declaration {
    name: "track_page",
    layout: Layout::Batch,
    keys: &["results", "delivery"],
    args: &["gen", "group", "page", "counts", "ttl", "reasons"],
    more_args: Some("`reasons` pairs (code, text), then pairs (number, outcome)"),
    replies: &["recorded", "delivered"],
    ..PLAIN
};

/// `delivered.lua`: a generation's delivery results are all in; the last
/// one decides the batch's delivery report.
pub const DELIVERED: Declaration = Declaration {
    name: "delivered",
    layout: Layout::Batch,
    keys: &["work", "reports", "results", "delivery"],
    args: &["gen", "group", "window_ended", "retention", "deliver"],
    replies: &["delivered", "duplicate"],
    appends: &[
        appends("delivered/<gen>", "generation_delivered"),
        appends("delivery_report", "batch_delivered"),
    ],
    next: &[Next::Enqueues(Op::DeliveryReport)],
    ..PLAIN
};

/// Every script, in the order a chunk meets them, then the queue's and the
/// coordination's.
pub const ALL: &[&Declaration] = &[
    &ACCEPT,
    &PARK,
    &RECORD_GROUP,
    &LOADED,
    &REJECT,
    &CLOSE,
    &SEAL,
    &CANCEL,
    &CLAIM_SEND,
    &SENT,
    &COMPLETED,
    &FAIL_GENERATION,
    &GIVE_UP_SEND,
    &TRACK_PAGE,
    &DELIVERED,
    &APPEND,
    &STALLED,
    &NOTE,
    &RESTORE,
    &ACK_RECORDED,
    &DEAD_LETTER,
    &RETRY_LATER,
    &PROMOTE,
    &RATE_LIMIT,
    &LEARN_RATE,
    &LEASE,
    &RELEASE,
    &RENEW_LEASE,
];

impl Declaration {
    /// Every key name in call order: the layout's, then its own (with any
    /// `?`).
    pub fn all_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.layout != Layout::Plain {
            keys.extend_from_slice(PRELUDE.keys);
        }
        if self.layout == Layout::Settling {
            keys.extend_from_slice(SETTLE.keys);
        }
        keys.extend_from_slice(self.keys);
        keys
    }

    /// Every argument name in call order (with any `?`).
    pub fn all_args(&self) -> Vec<&'static str> {
        let mut args = Vec::new();
        if self.layout != Layout::Plain {
            args.extend_from_slice(PRELUDE.args);
        }
        if self.layout == Layout::Settling {
            args.extend_from_slice(SETTLE.args);
        }
        args.extend_from_slice(self.args);
        args
    }

    /// What the script may do next, its layout's included.
    pub fn next_steps(&self) -> Vec<Next> {
        let mut next = self.next.to_vec();
        if self.layout != Layout::Plain {
            next.extend_from_slice(PRELUDE.next);
        }
        if self.layout == Layout::Settling {
            next.extend_from_slice(SETTLE.next);
        }
        next
    }

    /// The Lua that binds the keys and arguments to their names, in capitals
    /// (`local STATE, EVENTS = KEYS[1], KEYS[2]`), put in front of the
    /// script's source. An absent optional one is `nil`.
    pub fn bindings(&self) -> String {
        let mut lua = String::new();
        for (table, names) in [("KEYS", self.all_keys()), ("ARGV", self.all_args())] {
            for (i, name) in names.iter().enumerate() {
                lua.push_str(&format!("local {} = {table}[{}]\n", lua_name(name), i + 1));
            }
        }
        if self.more_args.is_some() {
            // Where the arguments after the named ones start.
            lua.push_str(&format!("local NAMED_ARGS = {}\n", self.all_args().len()));
        }
        lua
    }
}

/// A declared name as the Lua reads it: `dedupe_mobile?` → `DEDUPE_MOBILE`.
pub fn lua_name(name: &str) -> String {
    name.trim_end_matches('?').to_ascii_uppercase()
}
