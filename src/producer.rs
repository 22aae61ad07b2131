//! Producing chunks: cutting recipients into chunks and appending them to the
//! batch's shard's ingest stream, exactly as a producer in any language does
//! (see `schemas/README.md`).

use crate::events::{Chunk, Recipient, Template, ENVELOPE_VERSION};
use crate::store::{Store, StoreResult};

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
            recipients: part,
        });
        seq += 1;
    }
    out
}

/// The fields of an ingest entry for a chunk.
pub fn ingest_fields(chunk: &Chunk) -> [(&'static str, Vec<u8>); 3] {
    [
        ("v", ENVELOPE_VERSION.as_bytes().to_vec()),
        ("t", b"chunk".to_vec()),
        ("d", chunk.encode()),
    ]
}

/// Appends chunks (of any batches) to their ingest streams, pipelined per
/// stream. Returns the entry ids.
pub async fn append_chunks(store: &Store, chunks: &[Chunk]) -> StoreResult<Vec<String>> {
    let mut ids = Vec::with_capacity(chunks.len());
    for group in
        chunks.chunk_by(|a, b| store.keys.shard_of(&a.batch) == store.keys.shard_of(&b.batch))
    {
        let stream = store.keys.ingest(store.keys.shard_of(&group[0].batch));
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
