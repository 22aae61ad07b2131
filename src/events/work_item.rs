//! Work items: what a work stream entry asks a worker to do.
//!
//! A work stream entry has the fields `op` ([`Op`]), `d` (a MessagePack
//! [`WorkItem`]) and, for `load`, `c` (the chunk payload). The scripts
//! enqueue them, the store moves them between streams and the delayed set,
//! and the worker's ops carry them out, so the format lives here, below all
//! three (`schemas/work_item.schema.json` documents it).

use serde::{Deserialize, Serialize};

/// The operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Create a generation's group (the losing racer deletes its own).
    Create,
    /// Add a chunk's messages to its generation's group.
    Load,
    /// Send a complete generation's group, once.
    Send,
    /// Read a sent group until it finishes.
    Poll,
    /// Delete a group that lost the creation race, or one a cancel stopped.
    Delete,
    /// Ask the provider about a send given up while its claim was in place:
    /// delete its group so it can never go out, or learn that it went out.
    Recall,
    /// POST the batch's report to the webhook.
    Report,
    /// Read a finished group's delivery results until each message has one
    /// or the delivery window ends.
    Track,
    /// POST the batch's delivery report to the webhook.
    DeliveryReport,
}

impl Op {
    /// Every op.
    pub const ALL: [Op; 9] = [
        Op::Create,
        Op::Load,
        Op::Send,
        Op::Poll,
        Op::Delete,
        Op::Recall,
        Op::Report,
        Op::Track,
        Op::DeliveryReport,
    ];

    /// The `op` field.
    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Load => "load",
            Op::Send => "send",
            Op::Poll => "poll",
            Op::Delete => "delete",
            Op::Recall => "recall",
            Op::Report => "report",
            Op::Track => "track",
            Op::DeliveryReport => "delivery_report",
        }
    }

    /// Parses the `op` field.
    pub fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "create" => Op::Create,
            "load" => Op::Load,
            "send" => Op::Send,
            "poll" => Op::Poll,
            "delete" => Op::Delete,
            "recall" => Op::Recall,
            "report" => Op::Report,
            "track" => Op::Track,
            "delivery_report" => Op::DeliveryReport,
            _ => return None,
        })
    }
}

/// The `d` field of a work entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItem {
    /// The batch.
    pub batch: String,
    /// The generation.
    pub gen: u32,
    /// The chunk, for `load`.
    #[serde(default)]
    pub seq: Option<u32>,
    /// The group, for `load` and `delete`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Attempts already spent.
    #[serde(default)]
    pub attempt: u32,
    /// When its retry budget started (ms since the epoch, by the clock of the
    /// Redis server holding its shard): its first failure, or the provider's
    /// last answer for a poll. 0 (absent) until it first fails. Carried in
    /// the item, so the budget survives worker restarts and moves between
    /// workers; `dlq redrive` sets it back to 0 (a fresh budget).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since: u64,
    /// For `poll`: how long it waited before this read of its group, in
    /// ms. The next read of a group still sending waits twice as long, up
    /// to `--poll-interval` ([`WorkerConfig::next_poll`]). 0 (absent) for
    /// the other ops.
    ///
    /// [`WorkerConfig::next_poll`]: crate::worker::WorkerConfig::next_poll
    #[serde(default, skip_serializing_if = "is_zero")]
    pub poll_delay_ms: u64,
    /// For `track`: the page of the group's message list from which not
    /// every message had its final result yet (the provider's `startKey`;
    /// absent: the first page). The pages before it are final and counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl WorkItem {
    /// A dead-lettered work entry's fields (`op`, `d`, `c`, ...) with a fresh
    /// retry budget, for `dlq redrive`: attempts and budget start over, as if
    /// the item had never failed. Fields of anything that is not a readable
    /// work item (an ingest entry) come back unchanged.
    pub(crate) fn fresh_budget(mut fields: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
        if !fields.iter().any(|(k, _)| k == "op") {
            return fields;
        }
        for (k, v) in fields.iter_mut() {
            if k != "d" {
                continue;
            }
            if let Ok(mut item) = super::decode_payload::<WorkItem>("work item", v) {
                item.attempt = 0;
                item.since = 0;
                *v = super::encode_payload(&item);
            }
        }
        fields
    }
}
