//! The loader role: an ingest entry becomes an accepted, assigned chunk, then
//! either a parked one (its generation has no group yet) or a loaded one.

use tracing::Instrument;

use crate::events::chunk::ChunkRef;
use crate::events::seal::Seal;
use crate::events::{clip, ENVELOPE_VERSION, QUOTE_MAX};
use crate::keys::validate_batch_id;
use crate::keys::Priority;
use crate::projection::field;
use crate::protocol::accept::AcceptArgs;
use crate::store::batch::{dedupe_records, Accepted, BatchLog, Parked, Rejection, Sealing};
use crate::store::queue::Entry;
use crate::worker::group_wait::{self, Role};
use crate::worker::ops::load_chunk::{self, Load};
use crate::worker::ops::{Op, OpError, Outcome, WorkItem};
use crate::worker::{Ctx, Handled};

/// Handles one ingest entry of shard `shard`'s `lane`: the batch's work
/// items go to that lane's work stream.
pub(crate) async fn handle(
    ctx: &Ctx,
    shard: u32,
    lane: Priority,
    entry: &Entry,
) -> Result<Handled, OpError> {
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
        Some(b"seal") => return handle_seal(ctx, shard, entry).await,
        other => {
            return dead(format!(
                "ingest entry type {:?} is neither `chunk` nor `seal`",
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
    handle_chunk(ctx, shard, lane, &chunk, data)
        .instrument(span)
        .await
}

/// Handles a `seal` entry: the batch's last seq, declared after its chunks
/// (`seal.lua`). A seal that contradicts the batch, or comes after it
/// ended, changes nothing and is dead-lettered with the reason.
async fn handle_seal(ctx: &Ctx, shard: u32, entry: &Entry) -> Result<Handled, OpError> {
    let dead = |reason: String| Ok(Handled::new(Outcome::Dead(reason)));
    let Some(data) = entry.get("d") else {
        return dead("entry has no `d` (payload) field".into());
    };
    let seal = match Seal::decode(data) {
        Ok(s) => s,
        Err(e) => return dead(format!("undecodable seal: {e}")),
    };
    if let Err(e) = validate_batch_id(&seal.batch) {
        return dead(format!("invalid batch id: {e}"));
    }
    let owner = ctx.store.keys.shard_of(&seal.batch);
    if owner != shard {
        return dead(format!(
            "batch {} belongs to shard {owner} but its seal was written to shard {shard}'s ingest stream",
            seal.batch
        ));
    }
    // Its lane: the sends a seal makes ready go where the batch's go.
    let log = ctx.store.batch_in_its_lane(&seal.batch).await?;
    match log.seal(seal.last).await? {
        Sealing::Sealed(last) => {
            tracing::info!(batch = %seal.batch, last, "batch sealed");
            Ok(Handled::new(Outcome::Done))
        }
        Sealing::Conflict(why) | Sealing::Ended(why) => {
            tracing::warn!(batch = %seal.batch, reason = %why, "seal refused");
            dead(format!("seal refused: {why}"))
        }
    }
}

/// Handles a decoded chunk (inside its span).
async fn handle_chunk(
    ctx: &Ctx,
    shard: u32,
    lane: Priority,
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
    let log = ctx.store.batch_in(chunk.batch, lane);
    let digest = chunk.digest();
    if let Err(e) = chunk.validate() {
        // Recorded (its seq becomes a hole the batch can end without; its
        // `last` flag still tells the batch where it ends), then
        // dead-lettered with the reason.
        let reason = e.to_string();
        return match log.reject(chunk.seq, &digest, &reason, chunk.last).await? {
            Rejection::Recorded => {
                metrics::counter!("groupcast_chunks_total", "outcome" => "rejected").increment(1);
                tracing::warn!(%reason, "chunk rejected");
                dead(reason)
            }
            Rejection::Refused(why) => refused(ctx, chunk.batch, &why).await,
        };
    }
    // Valid (checked above), so this is their canonical form.
    let opts = chunk.options.canonical().unwrap_or_default();
    let records = dedupe_records(chunk.recipients.iter().map(|r| r.to));
    // Under `everysec`, Redis can lose the chunk's assignment after
    // `accept.lua` (a restart from disk). Parking or adding it then would
    // acknowledge a chunk the batch no longer counts, and the batch would
    // wait for it for good: it is accepted again instead
    // (docs/protocol.md, counterexamples).
    for round in 1..=ACCEPT_ROUNDS {
        match accept_and_load(ctx, &log, chunk, data, &records, &digest, &opts).await? {
            Some(handled) => return Ok(handled),
            None => tracing::warn!(
                round,
                "the chunk's assignment is gone (lost Redis writes?): accepting it again"
            ),
        }
    }
    Err(OpError::Unassigned(format!(
        "chunk {} of batch {} lost its assignment {ACCEPT_ROUNDS} times in a row",
        chunk.seq, chunk.batch
    )))
}

/// How many times a chunk is accepted again when its assignment turns out
/// lost, before its entry is left pending (and delivered again later).
const ACCEPT_ROUNDS: u32 = 3;

/// Accepts a valid chunk, then parks it or loads it into its group. None:
/// its assignment was lost meanwhile (nothing parked, nothing added).
async fn accept_and_load(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    data: &[u8],
    records: &[u8],
    digest: &str,
    opts: &str,
) -> Result<Option<Handled>, OpError> {
    let done = || Ok(Some(Handled::new(Outcome::Done)));
    let assigned = match accept(ctx, log, chunk, records, digest, opts).await? {
        Accepting::Assigned(a) => a,
        Accepting::Settled(handled) => return Ok(Some(handled)),
    };
    let Assignment {
        gen,
        group,
        duplicates,
        first,
    } = assigned;
    tracing::Span::current().record("gen", gen);
    ctx.remember_gen(chunk.batch, gen);
    // Numbers the batch already had are recorded (in the assignment), not
    // sent: what is parked or loaded is the chunk without them.
    // Borrowed as received on the usual path: no copy of the chunk.
    let without_copies;
    let (chunk, payload): (&ChunkRef<'_>, std::borrow::Cow<'_, [u8]>) = if duplicates.is_empty() {
        (chunk, data.into())
    } else {
        if first {
            // Counted at the chunk's first acceptance only (a repeat
            // delivery answers the same positions).
            metrics::counter!("groupcast_recipients_duplicate_total")
                .increment(duplicates.len() as u64);
        }
        record_duplicates(ctx, log, chunk, gen, &duplicates).await?;
        without_copies = chunk.without(&duplicates);
        let bytes = without_copies.to_chunk().encode();
        (&without_copies, bytes.into())
    };
    if chunk.recipients.is_empty() {
        // Every number was a copy: nothing to add, the chunk is done.
        load_chunk::record_nothing_to_load(log, chunk.seq, gen, group.as_deref()).await?;
        return done();
    }
    let group = match group {
        Some(g) => g,
        None => match wait_or_park(ctx, log, chunk, gen, &payload).await? {
            Grouped::Group(g) => g,
            Grouped::Done => return done(),
            Grouped::Unassigned => return Ok(None),
        },
    };
    let outcome = match load_chunk::run_ref(ctx, log, chunk, gen, &group).await? {
        Load::Handled(outcome) => outcome,
        Load::Stale => return Ok(None),
    };
    // Should the add fail, the retry is a `load` work item carrying the chunk.
    // A load that is done needs neither: the chunk is not copied for it.
    if matches!(outcome, Outcome::Done) {
        return done();
    }
    Ok(Some(retry_as_load(chunk, gen, group, payload, outcome)))
}

/// A chunk assigned to a generation, by this acceptance or an earlier one.
struct Assignment {
    gen: u32,
    /// The generation's group, if recorded.
    group: Option<String>,
    /// Positions of recipients whose number the batch already had.
    duplicates: Vec<u32>,
    /// Whether this acceptance assigned it (not a repeat delivery).
    first: bool,
}

/// What accepting a chunk came to.
enum Accepting {
    /// Assigned: it is parked or loaded next.
    Assigned(Assignment),
    /// Nothing more to do with it (rejected, refused, or loaded before).
    Settled(Handled),
}

/// Asks `accept.lua` to accept the chunk and counts the answer.
async fn accept(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    records: &[u8],
    digest: &str,
    opts: &str,
) -> Result<Accepting, OpError> {
    let accepted = log
        .accept_chunk(
            &AcceptArgs {
                seq: chunk.seq,
                last: chunk.last,
                records,
                digest,
                cap: ctx.config.group_cap,
                opts,
            },
            ctx.gen_hint(chunk.batch),
        )
        .await?;
    let count = |outcome: &'static str| {
        metrics::counter!("groupcast_chunks_total", "outcome" => outcome).increment(1);
    };
    Ok(match accepted {
        Accepted::Conflict(reason) | Accepted::Rejected(reason) => {
            count("rejected");
            tracing::warn!(%reason, "chunk rejected");
            Accepting::Settled(Handled::new(Outcome::Dead(reason)))
        }
        Accepted::Refused(why) => Accepting::Settled(refused(ctx, chunk.batch, &why).await?),
        Accepted::Duplicate { loaded: true, .. } => {
            count("duplicate");
            Accepting::Settled(Handled::new(Outcome::Done))
        }
        Accepted::Assigned {
            gen,
            group,
            duplicates,
        } => {
            count("accepted");
            Accepting::Assigned(Assignment {
                gen,
                group,
                duplicates,
                first: true,
            })
        }
        Accepted::Duplicate {
            gen,
            group,
            duplicates,
            ..
        } => {
            count("duplicate");
            Accepting::Assigned(Assignment {
                gen,
                group,
                duplicates,
                first: false,
            })
        }
    })
}

/// What waiting for (or parking for) a generation's group came to.
enum Grouped {
    /// The group: the chunk is loaded into it.
    Group(String),
    /// The chunk is handled (parked, loaded before, or its batch or
    /// generation ended).
    Done,
    /// Its assignment was lost meanwhile.
    Unassigned,
}

/// A chunk of generation `gen`, which has no group on record: waits for it,
/// or parks the chunk.
async fn wait_or_park(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
    payload: &[u8],
) -> Result<Grouped, OpError> {
    // The group was asked for when the generation's first chunk with
    // numbers was accepted (accept.lua): every chunk waits here for it, the
    // first one here watching the batch's state (group_wait.rs), and parks
    // only if it does not come in time.
    let hold = group_wait::hold_for(&ctx.config);
    let rx = match ctx.group_waits.join(chunk.batch, gen) {
        Role::Lead(lead) => lead.watch(hold, log.clone(), gen),
        Role::Wait(rx) => rx,
    };
    if let Some(g) = group_wait::wait(rx, hold).await {
        return Ok(Grouped::Group(g));
    }
    Ok(match log.park(chunk.seq, gen, payload).await? {
        Parked::Parked => {
            metrics::counter!("groupcast_chunks_total", "outcome" => "parked").increment(1);
            Grouped::Done
        }
        Parked::AlreadyLoaded => Grouped::Done,
        Parked::Ended => {
            // Cancelled (not reported: an assigned chunk not
            // loaded holds its batch's report back): never sent.
            let p = log.read(&[field::CANCELLED.to_string()]).await?;
            if p.cancelled().is_some() {
                let numbers = chunk.recipients.iter().map(|r| r.to);
                load_chunk::record_cancelled(ctx, log, gen, numbers).await?;
            }
            tracing::info!(batch = %chunk.batch, gen, seq = chunk.seq, "the batch was cancelled or reported: chunk not parked");
            Grouped::Done
        }
        Parked::Unassigned => Grouped::Unassigned,
        Parked::Failed => {
            load_chunk::give_up_in_failed_generation(log, chunk, gen).await?;
            Grouped::Done
        }
        Parked::Group(g) => Grouped::Group(g),
    })
}

/// A load that did not finish: its `outcome`, retried as a `load` work item
/// carrying the chunk (`payload`).
fn retry_as_load(
    chunk: &ChunkRef<'_>,
    gen: u32,
    group: String,
    payload: std::borrow::Cow<'_, [u8]>,
    outcome: Outcome,
) -> Handled {
    let retry = WorkItem {
        batch: chunk.batch.to_string(),
        gen,
        seq: Some(chunk.seq),
        group_id: Some(group),
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
        cursor: None,
    };
    Handled {
        outcome,
        retry_as: Some((Op::Load, retry, Some(payload.into_owned()))),
    }
}

/// Keeps each copy (at `positions` of `chunk`, in generation `gen`) of a
/// number the batch already had, under `<number>#<seq>`: `groupcast
/// results --status duplicate` lists them. Written at every acceptance
/// that answers them (a repeat delivery overwrites the same fields).
async fn record_duplicates(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
    positions: &[u32],
) -> Result<(), OpError> {
    let copies = positions
        .iter()
        .filter_map(|&i| chunk.recipients.get(i as usize))
        .map(|x| x.to);
    let r = crate::results::Record::duplicate(gen, chunk.seq);
    load_chunk::record_each(ctx, log, &r, copies).await
}

/// A chunk its batch takes no more. Its batch has ended (reported,
/// cancelled or closed): counted on the batch (`status` shows how many) and
/// acknowledged, with one warning per batch, not per chunk: after a cancel
/// every later chunk comes here, and a dead letter each would only bury the
/// ones that need a look. Otherwise (the batch has no state any more, or
/// went on without this seq): dead-lettered with the reason.
async fn refused(ctx: &Ctx, batch: &str, why: &str) -> Result<Handled, OpError> {
    let counted = ctx.store.count_chunk_after_end(batch).await?;
    if counted > 0 {
        metrics::counter!("groupcast_chunks_total", "outcome" => "after_end").increment(1);
        if counted == 1 {
            tracing::warn!(
                %batch, reason = %why,
                "a chunk came after its batch ended: counted on the batch (status shows how many), not dead-lettered; later ones are counted without a warning"
            );
        } else {
            tracing::debug!(%batch, counted, "another chunk came after its batch ended: counted");
        }
        return Ok(Handled::new(Outcome::Done));
    }
    metrics::counter!("groupcast_chunks_total", "outcome" => "refused").increment(1);
    tracing::warn!(reason = %why, "chunk refused: its batch takes no more chunks");
    Ok(Handled::new(Outcome::Dead(why.to_string())))
}
