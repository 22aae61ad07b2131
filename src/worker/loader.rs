//! The loader role: an ingest entry becomes an accepted, assigned chunk, then
//! either a parked one (its generation has no group yet) or a loaded one.

use tracing::Instrument;

use crate::events::chunk::ChunkRef;
use crate::events::{clip, Event, InputRejected, ENVELOPE_VERSION, QUOTE_MAX};
use crate::keys::validate_batch_id;
use crate::store::batch::{Accepted, Parked};
use crate::store::queue::Entry;
use crate::worker::ops::{load_chunk, Op, OpError, Outcome, WorkItem};
use crate::worker::{Ctx, Handled};

/// Handles one ingest entry of shard `shard`.
pub async fn handle(ctx: &Ctx, shard: u32, entry: &Entry) -> Result<Handled, OpError> {
    let dead = |reason: String| Ok(Handled::new(Outcome::Dead(reason)));
    match entry.get("v") {
        Some(v) if v == ENVELOPE_VERSION.as_bytes() => {}
        Some(v) => {
            return dead(format!(
                "unknown envelope version {:?} (this worker reads version {ENVELOPE_VERSION})",
                clip(&String::from_utf8_lossy(v), QUOTE_MAX)
            ))
        }
        None => return dead("entry has no `v` (envelope version) field".into()),
    }
    match entry.get("t") {
        Some(b"chunk") => {}
        other => {
            return dead(format!(
                "ingest entry type {:?} is not `chunk`",
                other.map(|t| clip(&String::from_utf8_lossy(t), QUOTE_MAX))
            ))
        }
    }
    let Some(data) = entry.get("d") else {
        return dead("entry has no `d` (payload) field".into());
    };
    // Read in place (no allocation per recipient) when the chunk has the
    // usual shape; otherwise decoded, or refused with the decoder's reason.
    let mut fallback = None;
    let chunk = match ChunkRef::decode_any(data, &mut fallback) {
        Ok(c) => c,
        Err(e) => return dead(format!("undecodable chunk: {e}")),
    };
    if let Err(e) = validate_batch_id(chunk.batch) {
        return dead(format!("invalid batch id: {e}"));
    }
    // A span, not a guard: a guard held across `.await` would mark whatever
    // else runs on this thread meanwhile as part of this chunk.
    let span = tracing::info_span!(
        "chunk",
        batch = %chunk.batch,
        seq = chunk.seq,
        gen = tracing::field::Empty
    );
    handle_chunk(ctx, shard, &chunk, data)
        .instrument(span)
        .await
}

/// Handles a decoded chunk (inside its span).
async fn handle_chunk(
    ctx: &Ctx,
    shard: u32,
    chunk: &ChunkRef<'_>,
    data: &[u8],
) -> Result<Handled, OpError> {
    let dead = |reason: String| Ok(Handled::new(Outcome::Dead(reason)));
    let owner = ctx.store.keys.shard_of(chunk.batch);
    if owner != shard {
        return dead(format!(
            "batch {} belongs to shard {owner} but was written to shard {shard}'s ingest stream",
            chunk.batch
        ));
    }
    let log = ctx.store.batch(chunk.batch);
    let digest = chunk.digest();
    let reject = |reason: String| {
        let log = log.clone();
        let key = format!("reject/{}/{}", chunk.seq, digest);
        let e = Event::InputRejected(InputRejected {
            seq: Some(chunk.seq),
            reason: reason.clone(),
        });
        async move {
            log.append(&key, &e).await?;
            metrics::counter!("groupcast_chunks_total", "outcome" => "rejected").increment(1);
            tracing::warn!(%reason, "chunk rejected");
            Ok::<_, OpError>(Handled::new(Outcome::Dead(reason)))
        }
    };
    if let Err(e) = chunk.validate() {
        return reject(e.to_string()).await;
    }
    let count = chunk.recipients.len() as u32;
    let accepted = log
        .accept_with_hint(
            chunk.seq,
            chunk.last,
            count,
            &digest,
            ctx.config.group_cap,
            ctx.gen_hint(chunk.batch),
        )
        .await?;
    let (gen, group) = match accepted {
        Accepted::Conflict(reason) | Accepted::Rejected(reason) => return reject(reason).await,
        Accepted::Duplicate { loaded: true, .. } => {
            metrics::counter!("groupcast_chunks_total", "outcome" => "duplicate").increment(1);
            return Ok(Handled::new(Outcome::Done));
        }
        Accepted::Assigned { gen, group } => {
            metrics::counter!("groupcast_chunks_total", "outcome" => "accepted").increment(1);
            (gen, group)
        }
        Accepted::Duplicate { gen, group, .. } => {
            metrics::counter!("groupcast_chunks_total", "outcome" => "duplicate").increment(1);
            (gen, group)
        }
    };
    tracing::Span::current().record("gen", gen);
    ctx.remember_gen(chunk.batch, gen);
    let group = match group {
        Some(g) => g,
        None => match log.park(chunk.seq, gen, data).await? {
            Parked::Parked => {
                metrics::counter!("groupcast_chunks_total", "outcome" => "parked").increment(1);
                return Ok(Handled::new(Outcome::Done));
            }
            Parked::AlreadyLoaded => return Ok(Handled::new(Outcome::Done)),
            Parked::Group(g) => g,
        },
    };
    let outcome = load_chunk::run_ref(ctx, &log, chunk, gen, &group).await?;
    // Should the add fail, the retry is a `load` work item carrying the chunk.
    let retry = WorkItem {
        batch: chunk.batch.to_string(),
        gen,
        seq: Some(chunk.seq),
        group_id: Some(group),
        attempt: 0,
        since: 0,
    };
    Ok(Handled {
        outcome,
        retry_as: Some((Op::Load, retry, Some(data.to_vec()))),
    })
}
