//! Producing chunks: cutting recipients into chunks and appending them to the
//! batch's shard's ingest stream, exactly as a producer in any language does
//! (see `schemas/README.md`).
//!
//! [`Producer`] appends with backpressure: it pauses while the shard's ingest
//! stream holds [`DEFAULT_MAX_UNREAD_CHUNKS`] chunks (or the bound it was
//! given) that no worker has read yet, so that Redis holds the work in
//! flight, not the whole input. [`append_chunks`] appends without waiting.
//!
//! Reading a recipients file is the producer's too, in the order a file
//! goes through it:
//!
//! - [`template`]: the template file.
//! - [`input`]: opening a recipients file: a pipe spooled to disk, its
//!   encoding detected or named, a file that is not UTF-8 transcoded.
//! - [`rows`]: its rows one at a time (CSV, JSONL, a Windows file's CRLF),
//!   each row's number and variables.
//! - [`problems`]: what is wrong with rows, listed and counted by kind.
//! - [`check`]: the first reading: every row and chunk checked, the
//!   repeated numbers found and their later rows dropped or refused.
//! - [`cut_file`]: the second reading: the rows kept, cut into encoded
//!   chunks as they are read ([`cut`] cuts recipients already in memory).
//!
//! They fail with an [`InputError`]; `groupcast submit` (and `serve`) turn
//! it into their own.

pub(crate) mod check;
pub(crate) mod cut_file;
#[cfg(test)]
pub(crate) mod fixtures;
pub(crate) mod input;
pub(crate) mod problems;
pub(crate) mod rows;
pub(crate) mod template;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::events::{Chunk, Recipient, Template, ENVELOPE_VERSION};
use crate::keys::Priority;
use crate::keys::LOADERS_GROUP;
use crate::store::{Store, StoreResult};

/// Why a recipients or template file was refused.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// What was given is wrong, and the message says what to do.
    #[error("{0}")]
    Usage(String),
    /// It could not be read through (a file that changed while it was
    /// read, a reader that stopped).
    #[error("{0}")]
    Failed(String),
}

/// A usage error: what was given is wrong, and the message says what to do.
fn usage(msg: String) -> InputError {
    InputError::Usage(msg)
}

/// The encoding of a recipients file (`--encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FileEncoding {
    /// UTF-8 when the whole file is valid UTF-8 (or UTF-16 with its byte
    /// order mark), else EUC-KR/CP949.
    Auto,
    /// UTF-8, with or without a byte order mark.
    #[value(name = "utf-8", alias = "utf8")]
    Utf8,
    /// EUC-KR with its Windows extension CP949 (what the WHATWG Encoding
    /// standard calls EUC-KR): all 11,172 Hangul syllables.
    #[value(name = "euc-kr", alias = "cp949")]
    EucKr,
}

/// What is done with a number that an earlier row has (`--duplicates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Duplicates {
    /// The later rows are dropped, counted and reported.
    Drop,
    /// The later rows are problems: nothing is appended.
    Fail,
}

/// How many chunks a [`Producer`] lets wait unread in a shard's ingest
/// stream before it pauses. Each producer counts for itself: with several
/// producers on one shard the stream holds up to this many per producer.
pub(crate) const DEFAULT_MAX_UNREAD_CHUNKS: u64 = 64;
/// The most chunks in one pipelined round trip.
pub(crate) const ROUND_CHUNKS: usize = 32;
/// The most payload bytes in one pipelined round trip (unless one chunk
/// alone is larger), so that large chunks do not make huge pipelines.
pub(crate) const ROUND_BYTES: usize = 4 * 1024 * 1024;
/// How long a waiting producer sleeps between looks at the stream: from the
/// first to the second value, doubling.
const WAIT_POLL: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(100));

/// Cuts recipients into chunks of `size` (the last one flagged).
pub fn cut(
    batch: &str,
    template: &Template,
    recipients: Vec<Recipient>,
    size: usize,
) -> Vec<Chunk> {
    let size = size.max(1);
    let n = recipients.len().div_ceil(size);
    let mut out = Vec::with_capacity(n);
    let mut it = recipients.into_iter().peekable();
    let mut seq = 0u32;
    while it.peek().is_some() {
        let part: Vec<Recipient> = it.by_ref().take(size).collect();
        out.push(Chunk {
            batch: batch.to_string(),
            seq,
            last: seq as usize + 1 == n,
            template: template.clone(),
            options: Default::default(),
            recipients: part,
        });
        seq += 1;
    }
    out
}

/// The fields of an ingest entry for a chunk.
pub fn ingest_fields(chunk: &Chunk) -> [(&'static str, Vec<u8>); 3] {
    entry(chunk.encode())
}

/// The fields of an ingest entry sealing batch `batch` at seq `last` (its
/// last; see [`crate::events::seal`]).
pub(crate) fn seal_fields(batch: &str, last: u32) -> [(&'static str, Vec<u8>); 3] {
    let seal = crate::events::seal::Seal {
        batch: batch.to_string(),
        last,
    };
    [
        ("v", ENVELOPE_VERSION.as_bytes().to_vec()),
        ("t", b"seal".to_vec()),
        ("d", seal.encode()),
    ]
}

/// Appends a seal of batch `batch` at seq `last` to its shard's ingest
/// stream: the batch takes seqs 0..=last, as if chunk `last` had been
/// flagged last. Returns the entry id.
pub async fn append_seal(store: &Store, batch: &str, last: u32) -> StoreResult<String> {
    let stream = store.keys.ingest(store.keys.shard_of(batch));
    let fields: Vec<(String, Vec<u8>)> = seal_fields(batch, last)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    store.append_entry(&stream, &fields).await
}

/// The priority lane a chunk goes through: its batch's priority.
pub(crate) fn lane_of(chunk: &Chunk) -> Priority {
    chunk.options.priority()
}

/// Appends chunks (of any batches) to their ingest streams (their shards'
/// and lanes'), pipelined per stream, without backpressure (a [`Producer`] waits for the workers).
/// Returns the entry ids.
pub async fn append_chunks(store: &Store, chunks: &[Chunk]) -> StoreResult<Vec<String>> {
    let mut ids = Vec::with_capacity(chunks.len());
    let stream_of = |c: &Chunk| {
        store
            .keys
            .ingest_in(store.keys.shard_of(&c.batch), lane_of(c))
    };
    for group in chunks.chunk_by(|a, b| stream_of(a) == stream_of(b)) {
        let stream = stream_of(&group[0]);
        for part in group.chunks(64) {
            let entries: Vec<_> = part.iter().map(ingest_fields).collect();
            ids.extend(store.append_entries(&stream, &entries).await?);
        }
    }
    Ok(ids)
}

/// Appends an arbitrary entry to a shard's ingest stream (for tests of bad
/// input, and for `dlq redrive`).
pub async fn append_raw(
    store: &Store,
    stream: &str,
    fields: &[(String, Vec<u8>)],
) -> StoreResult<String> {
    store.append_entry(stream, fields).await
}

/// A pause of a [`Producer`]: the stream it waits for and how long so far.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// The ingest stream.
    pub stream: String,
    /// The chunks unread in it at the last look.
    pub unread: u64,
    /// The bound the producer waits to get under.
    pub max_unread: u64,
    /// Since when this pause lasts.
    pub waited: Duration,
}

/// What a [`Producer`] calls at every look at the stream while it waits.
type OnWait = Box<dyn FnMut(&Waiting) + Send>;

/// Appends chunks to ingest streams in pipelined rounds, pausing while a
/// shard's ingest stream holds more than a bound of unread chunks, so that
/// Redis memory follows the work in flight and not the input size.
///
/// The unread count comes from Redis (the loaders' consumer group's `lag`,
/// see [`Store::unread`]). After one look the producer knows how many chunks
/// it may still append (the bound minus the unread ones: the workers only
/// ever lower the count) and looks again only when that credit is spent, so
/// the check costs one command per many chunks.
pub struct Producer {
    store: Store,
    /// 0: no bound.
    max_unread: u64,
    /// Per shard and lane: chunks that may still be appended before looking
    /// again.
    credit: HashMap<(u32, Priority), u64>,
    on_wait: Option<OnWait>,
    waited: Duration,
}

impl Producer {
    /// A producer with the default bound ([`DEFAULT_MAX_UNREAD_CHUNKS`]).
    pub fn new(store: Store) -> Producer {
        Producer {
            store,
            max_unread: DEFAULT_MAX_UNREAD_CHUNKS,
            credit: HashMap::new(),
            on_wait: None,
            waited: Duration::ZERO,
        }
    }

    /// Sets the bound on unread chunks per ingest stream; 0 appends without
    /// waiting.
    pub fn max_unread(mut self, chunks: u64) -> Producer {
        self.max_unread = chunks;
        self.credit.clear();
        self
    }

    /// Calls `f` at every look at the stream while paused (to tell a user
    /// that nothing reads the stream, for instance).
    pub fn on_wait(mut self, f: impl FnMut(&Waiting) + Send + 'static) -> Producer {
        self.on_wait = Some(Box::new(f));
        self
    }

    /// The time spent paused so far.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Appends chunks (of any batches) to their ingest streams (their
    /// shards' and lanes'), in order. Returns the entry ids.
    pub async fn append(&mut self, chunks: &[Chunk]) -> StoreResult<Vec<String>> {
        let mut ids = Vec::with_capacity(chunks.len());
        let keys = self.store.keys.clone();
        let at = |c: &Chunk| (keys.shard_of(&c.batch), lane_of(c));
        for group in chunks.chunk_by(|a, b| at(a) == at(b)) {
            let payloads = group.iter().map(Chunk::encode).collect();
            let (shard, lane) = at(&group[0]);
            ids.extend(self.append_encoded(shard, lane, payloads).await?);
        }
        Ok(ids)
    }

    /// Appends encoded chunks ([`Chunk::encode`], the `d` field) to shard
    /// `shard`'s ingest stream of `lane` (the batch's priority), in order.
    /// Returns the entry ids.
    pub async fn append_encoded(
        &mut self,
        shard: u32,
        lane: Priority,
        payloads: Vec<Vec<u8>>,
    ) -> StoreResult<Vec<String>> {
        let stream = self.store.keys.ingest_in(shard, lane);
        let mut ids = Vec::with_capacity(payloads.len());
        let mut rest = payloads.into_iter().peekable();
        while rest.peek().is_some() {
            let credit = self.credit((shard, lane), &stream, rest.len()).await?;
            let mut round = Vec::new();
            let mut bytes = 0;
            while let Some(p) = rest.next_if(|p| {
                round.is_empty()
                    || (round.len() < ROUND_CHUNKS.min(credit) && bytes + p.len() <= ROUND_BYTES)
            }) {
                bytes += p.len();
                round.push(entry(p));
            }
            if self.max_unread > 0 {
                let left = credit.saturating_sub(round.len());
                self.credit.insert((shard, lane), left as u64);
            }
            ids.extend(self.store.append_entries(&stream, &round).await?);
        }
        Ok(ids)
    }

    /// Waits until at least `want` chunks (or a quarter of the bound) may
    /// be appended to shard `shard`'s ingest stream of `lane`, and says how
    /// many may: a look at the stream only when the credit of the last one
    /// is spent. A caller that gathers a round while the look is under way
    /// then appends it whole.
    pub async fn ready(&mut self, shard: u32, lane: Priority, want: usize) -> StoreResult<usize> {
        let stream = self.store.keys.ingest_in(shard, lane);
        self.credit((shard, lane), &stream, want).await
    }

    /// How many chunks may be appended to `stream` now (at least 1): waits
    /// until the workers have read enough. `want` is how many there are to
    /// append; a small credit is worth a round only when it covers them, or a
    /// quarter of the bound (so that a producer just behind the workers
    /// appends in rounds, not chunk by chunk with a look between each).
    async fn credit(
        &mut self,
        at: (u32, Priority),
        stream: &str,
        want: usize,
    ) -> StoreResult<usize> {
        if self.max_unread == 0 {
            return Ok(usize::MAX);
        }
        if let Some(&c) = self.credit.get(&at) {
            if c > 0 {
                return Ok(usize::try_from(c).unwrap_or(usize::MAX));
            }
        }
        let enough = (want as u64).min((self.max_unread / 4).max(1));
        let started = Instant::now();
        let mut poll = WAIT_POLL.0;
        loop {
            let (unread, credit) = self.look(at, stream).await?;
            if credit >= enough {
                self.waited += started.elapsed();
                return Ok(usize::try_from(credit).unwrap_or(usize::MAX));
            }
            if let Some(f) = &mut self.on_wait {
                f(&Waiting {
                    stream: stream.to_string(),
                    unread,
                    max_unread: self.max_unread,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(WAIT_POLL.1);
        }
    }
}

/// Room under a [`Producer`]'s bound, from one look at the stream
/// ([`Producer::room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// This many chunks may be appended now.
    Free(u64),
    /// The stream holds the bound (or more) of unread chunks.
    Full {
        /// The chunks unread at the look.
        unread: u64,
    },
}

impl Producer {
    /// Whether shard `shard`'s ingest stream of `lane` has room under the
    /// bound, from one look and without waiting: for a server, which
    /// answers "later" instead of holding a request while the workers
    /// catch up. The next append spends the credit this look found.
    pub async fn room(&mut self, shard: u32, lane: Priority) -> StoreResult<Room> {
        if self.max_unread == 0 {
            return Ok(Room::Free(u64::MAX));
        }
        let stream = self.store.keys.ingest_in(shard, lane);
        let (unread, credit) = self.look((shard, lane), &stream).await?;
        Ok(if credit == 0 {
            Room::Full { unread }
        } else {
            Room::Free(credit)
        })
    }

    /// One look at `stream`: its unread chunks, and the credit they leave
    /// under the bound (recorded for the next append).
    async fn look(&mut self, at: (u32, Priority), stream: &str) -> StoreResult<(u64, u64)> {
        let unread = self.store.unread(stream, LOADERS_GROUP).await?;
        let credit = self.max_unread.saturating_sub(unread);
        self.credit.insert(at, credit);
        Ok((unread, credit))
    }
}

/// The fields of an ingest entry for an encoded chunk.
fn entry(payload: Vec<u8>) -> [(&'static str, Vec<u8>); 3] {
    [
        ("v", ENVELOPE_VERSION.as_bytes().to_vec()),
        ("t", b"chunk".to_vec()),
        ("d", payload),
    ]
}
