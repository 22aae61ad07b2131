//! Read-only queries for operators (`status`, `audit`, the board): the
//! health of every shard's streams, the batches waiting in the ingest stream
//! that no worker has read yet, the batches in flight and reported, and the
//! dead letters with their redrive.

use std::collections::BTreeMap;

use redis::Value;

use super::info::GroupInfo;
use super::queue::{parse_entries, Entry};
use super::{Store, StoreError, StoreResult};
use crate::events::chunk::ChunkRef;
use crate::keys::Priority;
use crate::keys::{LOADERS_GROUP, OPERATORS_GROUP};

/// One stream (or the delayed-retries set) of one shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamHealth {
    /// The key.
    pub key: String,
    /// The shard.
    pub shard: u32,
    /// `ingest`, `work`, `dead letters`, `reports` or `delayed retries`.
    pub what: &'static str,
    /// Entries (members, for the delayed retries).
    pub length: u64,
    /// The consumer group that reads it, if any.
    pub group: Option<&'static str>,
    /// Whether that group exists (a worker started once on this shard).
    pub group_exists: bool,
    /// Consumers in the group (0: no worker reads the stream).
    pub consumers: Option<u64>,
    /// Entries delivered to the group and not acknowledged.
    pub pending: Option<u64>,
    /// Entries not delivered to the group yet.
    pub lag: Option<u64>,
}

/// A batch whose chunks wait in the ingest stream, unread by any worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedBatch {
    /// The batch.
    pub batch: String,
    /// Its shard.
    pub shard: u32,
    /// Chunks waiting.
    pub chunks: u64,
    /// Recipients in them.
    pub recipients: u64,
    /// The seq flagged last among them, if any.
    pub last_seq: Option<u32>,
    /// When the oldest of them was appended (ms since the epoch).
    pub since_ms: u64,
}

/// What waits unread in a shard's ingest stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Queued {
    /// The shard.
    pub shard: u32,
    /// Whether the loaders' consumer group exists (a worker started once).
    pub group_exists: bool,
    /// Consumers in it.
    pub consumers: u64,
    /// Waiting chunks, by batch.
    pub batches: Vec<QueuedBatch>,
    /// Waiting entries that are not readable chunks (they will be
    /// dead-lettered when read).
    pub unreadable: u64,
}

impl Queued {
    /// The waiting chunks of one batch, if any.
    pub fn of(&self, batch: &str) -> Option<&QueuedBatch> {
        self.batches.iter().find(|b| b.batch == batch)
    }

    /// Whether any worker reads the ingest stream.
    pub(crate) fn read_by_a_worker(&self) -> bool {
        self.group_exists && self.consumers > 0
    }

    /// A sentence for people: how many chunks wait and who reads them.
    pub fn describe(&self, batch: &QueuedBatch) -> String {
        let readers = if !self.group_exists {
            "no worker has ever read the ingest stream of this shard: start `groupcast worker`"
                .to_string()
        } else if self.consumers == 0 {
            "the loaders' consumer group has no consumer: no worker reads the ingest stream"
                .to_string()
        } else {
            format!(
                "{} consumer(s) read the ingest stream; these are behind the entries before them",
                self.consumers
            )
        };
        format!(
            "batch {}: queued, {} chunk(s) with {} recipients wait in the ingest stream of shard {}, unread ({readers})",
            batch.batch, batch.chunks, batch.recipients, batch.shard
        )
    }
}

/// A decided batch as its report entry names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReportedBatch {
    /// The batch.
    pub batch: String,
    /// Its shard.
    pub shard: u32,
    /// The report entry's id (its time).
    pub entry: String,
}

impl Store {
    /// A consumer group of a stream; `None` when the stream or the group
    /// does not exist (no worker ever started on it).
    pub(crate) async fn group_if_any(
        &self,
        stream: &str,
        group: &str,
    ) -> StoreResult<Option<GroupInfo>> {
        match self.group_info(stream, group).await {
            Ok(info) => Ok(info),
            Err(StoreError::Redis(e)) if e.to_string().contains("no such key") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every stream of every shard with its length and its consumer group.
    pub async fn stream_health(&self) -> StoreResult<Vec<StreamHealth>> {
        let keys = &self.keys;
        let mut out = Vec::new();
        for shard in 0..keys.shards() {
            for (key, what, group) in [
                (keys.ingest(shard), "ingest", Some(LOADERS_GROUP)),
                (keys.work(shard), "work", Some(OPERATORS_GROUP)),
                (
                    keys.ingest_in(shard, Priority::Urgent),
                    "ingest (urgent)",
                    Some(LOADERS_GROUP),
                ),
                (
                    keys.work_in(shard, Priority::Urgent),
                    "work (urgent)",
                    Some(OPERATORS_GROUP),
                ),
                (
                    keys.ingest_in(shard, Priority::Bulk),
                    "ingest (bulk)",
                    Some(LOADERS_GROUP),
                ),
                (
                    keys.work_in(shard, Priority::Bulk),
                    "work (bulk)",
                    Some(OPERATORS_GROUP),
                ),
                (keys.dead_letters(shard), "dead letters", None),
                (keys.reports(shard), "reports", None),
            ] {
                let length = self.stream_len(&key).await?;
                let info = match group {
                    Some(g) => self.group_if_any(&key, g).await?,
                    None => None,
                };
                out.push(StreamHealth {
                    key,
                    shard,
                    what,
                    length,
                    group,
                    group_exists: info.is_some(),
                    consumers: info.as_ref().and_then(|i| i.consumers),
                    pending: info.as_ref().and_then(|i| i.pending),
                    lag: info.as_ref().and_then(|i| i.lag),
                });
            }
            out.push(StreamHealth {
                key: keys.delayed(shard),
                shard,
                what: "delayed retries",
                length: self.delayed_len(shard).await?,
                group: None,
                group_exists: false,
                consumers: None,
                pending: None,
                lag: None,
            });
        }
        Ok(out)
    }

    /// The chunks waiting in a shard's ingest streams (every lane's) that
    /// the loaders' group has not been delivered yet (every entry when the group does
    /// not exist), counted by batch. Read in pages; each chunk is read in
    /// place, without copying its recipients.
    pub async fn queued(&self, shard: u32) -> StoreResult<Queued> {
        let mut batches: BTreeMap<String, QueuedBatch> = BTreeMap::new();
        let mut unreadable = 0;
        // The normal lane's group speaks for the workers (they make every
        // lane's at once).
        let mut normal_info = None;
        for lane in Priority::ALL {
            let stream = self.keys.ingest_in(shard, lane);
            let info = self.group_if_any(&stream, LOADERS_GROUP).await?;
            let mut start = match info.as_ref().and_then(|i| i.last_delivered.as_deref()) {
                Some(id) => format!("({id}"),
                None => "-".to_string(),
            };
            if lane == Priority::Normal {
                normal_info = info;
            }
            loop {
                let v: Value = redis::cmd("XRANGE")
                    .arg(&stream)
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut self.conn.clone())
                    .await?;
                let page = parse_entries(&v);
                for e in &page {
                    match e.get("d").and_then(ChunkRef::decode) {
                        Some(c) => {
                            let b =
                                batches
                                    .entry(c.batch.to_string())
                                    .or_insert_with(|| QueuedBatch {
                                        batch: c.batch.to_string(),
                                        shard,
                                        since_ms: crate::events::entry_millis(&e.id),
                                        ..QueuedBatch::default()
                                    });
                            b.chunks += 1;
                            b.recipients += c.recipients.len() as u64;
                            if c.last {
                                b.last_seq = Some(c.seq);
                            }
                        }
                        None => unreadable += 1,
                    }
                }
                match page.last() {
                    Some(last) if page.len() == 500 => start = format!("({}", last.id),
                    _ => break,
                }
            }
        }
        let info = normal_info;
        Ok(Queued {
            shard,
            group_exists: info.is_some(),
            consumers: info.and_then(|i| i.consumers).unwrap_or(0),
            batches: batches.into_values().collect(),
            unreadable,
        })
    }

    /// [`Store::queued`] of every shard.
    pub(crate) async fn queued_all(&self) -> StoreResult<Vec<Queued>> {
        let mut out = Vec::new();
        for shard in 0..self.keys.shards() {
            out.push(self.queued(shard).await?);
        }
        Ok(out)
    }

    /// The newest `limit` report entries of a shard, newest first.
    pub(crate) async fn reported_batches(
        &self,
        shard: u32,
        limit: usize,
    ) -> StoreResult<Vec<ReportedBatch>> {
        let v: Value = redis::cmd("XREVRANGE")
            .arg(self.keys.reports(shard))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(parse_entries(&v)
            .into_iter()
            .filter_map(|e| {
                Some(ReportedBatch {
                    batch: e.text("batch")?,
                    shard,
                    entry: e.id,
                })
            })
            .collect())
    }

    /// Every dead letter of every shard, with its shard.
    pub async fn dead_letter_entries(&self) -> StoreResult<Vec<(u32, Entry)>> {
        let mut out = Vec::new();
        for shard in 0..self.keys.shards() {
            let letters = self.entries(&self.keys.dead_letters(shard)).await?;
            out.extend(letters.into_iter().map(|e| (shard, e)));
        }
        Ok(out)
    }

    /// Puts a dead letter back on the stream it came from and removes it
    /// from the dead letters, in one transaction (never both, never
    /// neither). Returns the stream, or `None` when the letter names none.
    pub async fn redrive_letter(&self, shard: u32, letter: &Entry) -> StoreResult<Option<String>> {
        let Some(source) = letter.text("source") else {
            return Ok(None);
        };
        // A redriven work item starts a fresh retry budget.
        let fields = crate::events::work_item::WorkItem::fresh_budget(
            letter
                .fields
                .iter()
                .filter_map(|(k, v)| k.strip_prefix("f:").map(|k| (k.to_string(), v.clone())))
                .collect(),
        );
        self.redrive(&self.keys.dead_letters(shard), &letter.id, &source, &fields)
            .await?;
        Ok(Some(source))
    }
}
