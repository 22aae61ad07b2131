//! `load`: add a chunk's messages to its generation's group, then append
//! `chunk_loaded` (only after every piece was accepted: write order replaces
//! recovery logic) and evaluate the generation's completion.

use crate::events::chunk::{ChunkRef, RecipientFields, TemplateRef};
use crate::events::{ChunkLoaded, RegistrationFailure};
use crate::projection::{event_key, field};
use crate::provider::add_body::add_body;
use crate::provider::model::AddSummary;
use crate::provider::{ProviderError, MAX_MESSAGES_PER_REQUEST};
use crate::results::{NotSentReason, Record};
use crate::store::batch::{BatchLog, Loading};
use crate::worker::ops::{on_disk, provider_slots, OnDisk, OpError, Outcome};
use crate::worker::Ctx;

/// Adds every recipient, one request per [`MAX_MESSAGES_PER_REQUEST`], and
/// sums the answers (failures by their position in `recipients`).
async fn add_all<R: RecipientFields>(
    ctx: &Ctx,
    group_id: &str,
    template: &TemplateRef<'_>,
    recipients: &[R],
) -> Result<AddSummary, ProviderError> {
    let mut total = AddSummary::default();
    for (k, part) in recipients.chunks(MAX_MESSAGES_PER_REQUEST).enumerate() {
        let body = add_body(template, part);
        let s = ctx
            .provider
            .add_messages_json(group_id, body, part.len())
            .await?;
        let offset = k * MAX_MESSAGES_PER_REQUEST;
        total.error_count += s.error_count;
        total.results += s.results;
        total.registered += s.registered;
        total.duplicates += s.duplicates;
        total
            .failed
            .extend(s.failed.into_iter().map(|(i, code)| (i + offset, code)));
    }
    Ok(total)
}

/// What a load came to.
#[derive(Debug)]
pub(crate) enum Load {
    /// Added and recorded, or to be retried or dead-lettered as it says.
    Handled(Outcome),
    /// Under `everysec`: the chunk's assignment to the generation, or the
    /// generation's group, is not what the load was given (Redis lost the
    /// writes that made them): nothing was added. A load item is dropped
    /// (its chunk is loaded through what survived); the ingest handler
    /// accepts the chunk again.
    Stale,
}

/// Loads `chunk`, read in place ([`ChunkRef::decode`]), into `group_id` and
/// records it.
pub(crate) async fn run_ref(
    ctx: &Ctx,
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
    group_id: &str,
) -> Result<Load, OpError> {
    load(
        ctx,
        log,
        chunk.seq,
        &chunk.template,
        &chunk.recipients,
        gen,
        group_id,
    )
    .await
}

/// Loads chunk `seq` (`template`, `recipients`) into `group_id`.
async fn load<R: RecipientFields + Sync>(
    ctx: &Ctx,
    log: &BatchLog,
    seq: u32,
    template: &TemplateRef<'_>,
    recipients: &[R],
    gen: u32,
    group_id: &str,
) -> Result<Load, OpError> {
    if ctx.config.durable.waits() {
        if let Some(stop) = wait_for_assignment(ctx, log, seq, gen, group_id).await? {
            return Ok(stop);
        }
    }
    let requests = recipients.len().div_ceil(MAX_MESSAGES_PER_REQUEST) as u32;
    if let Some(back) = provider_slots(ctx, log.keys.lane, requests).await? {
        return Ok(Load::Handled(back));
    }
    let summary = match add_all(ctx, group_id, template, recipients).await {
        Ok(s) => s,
        Err(e) => return add_failed(ctx, log, seq, gen, recipients, &e).await,
    };
    let event = loaded_event(seq, gen, group_id, summary, recipients);
    record_load(ctx, log, &event, recipients).await?;
    Ok(Load::Handled(Outcome::Done))
}

/// Under a durability that waits: checks that chunk `seq` is still
/// assigned to `gen` and `group_id` is still its group, and waits until both
/// are on disk. None: they are, the add may go; else what the load comes to.
async fn wait_for_assignment(
    ctx: &Ctx,
    log: &BatchLog,
    seq: u32,
    gen: u32,
    group_id: &str,
) -> Result<Option<Load>, OpError> {
    // The add relies on the chunk's assignment to `gen` and on `group_id`
    // being that generation's group: both must still hold (an item from
    // writes Redis lost is dropped; its chunk is loaded through what
    // survived: it is parked again, or its ingest entry redelivered) and
    // be on disk before the provider registers anyone.
    let (assign_key, group_key) = (event_key::assign(seq), event_key::group(gen));
    let p = log
        .read(&[
            field::assignment(seq),
            field::group(gen),
            field::key(&assign_key),
            field::key(&group_key),
        ])
        .await?;
    let assigned_gen = p.assignment(seq).map(|(g, _, _)| g);
    if assigned_gen != Some(gen) || p.group_of(gen) != Some(group_id) {
        tracing::warn!(
            batch = %log.batch, seq, gen, group = group_id,
            assigned = ?assigned_gen, recorded = ?p.group_of(gen),
            "load of a chunk into a group our events no longer show for it (lost Redis writes?): dropped"
        );
        metrics::counter!("groupcast_chunks_total", "outcome" => "stale").increment(1);
        return Ok(Some(Load::Stale));
    }
    let facts: Vec<(&str, &str)> = [
        (assign_key.as_str(), p.appended(&assign_key)),
        (group_key.as_str(), p.appended(&group_key)),
    ]
    .into_iter()
    .filter_map(|(k, id)| Some((k, id?)))
    .collect();
    // Waits here (the chunk's first load never goes through the delayed
    // set just to wait), unless too many entries already wait so.
    match on_disk(ctx, log, &facts, || {
        format!("chunk {seq} was just assigned to generation {gen} or its group")
    })
    .await?
    {
        OnDisk::Yes => Ok(None),
        OnDisk::NotYet(wait) => Ok(Some(Load::Handled(wait))),
        // Redis lost the assignment or the group meanwhile (a restart
        // from disk during the wait): what the load was given no longer
        // holds. Retried as a load item, the chunk would have nothing
        // to bring it back once that item found itself stale; the
        // ingest handler accepts it again instead.
        OnDisk::Gone(_) => {
            tracing::warn!(
                batch = %log.batch, seq, gen, group = group_id,
                "the chunk's assignment or group was lost while the load waited for the disk (lost Redis writes?)"
            );
            metrics::counter!("groupcast_chunks_total", "outcome" => "stale").increment(1);
            Ok(Some(Load::Stale))
        }
    }
}

/// The add of chunk `seq` failed with `e`: retried or dead-lettered as the
/// provider's answer says, unless the chunk needs no add any more.
async fn add_failed<R: RecipientFields>(
    ctx: &Ctx,
    log: &BatchLog,
    seq: u32,
    gen: u32,
    recipients: &[R],
    e: &ProviderError,
) -> Result<Load, OpError> {
    let outcome = super::provider_failed(ctx, &log.batch, e).await;
    if matches!(outcome, Outcome::Dead(_)) {
        // A repeat delivery racing the original can find the group
        // already sent (400 InvalidGroupStatus): harmless if the chunk
        // is recorded as loaded. A cancel deletes the group of a
        // generation it stopped: nothing more is loaded into it.
        let p = log
            .read(&[
                field::key(&event_key::loaded(gen, seq)),
                field::CANCELLED.to_string(),
            ])
            .await?;
        if p.is_loaded(gen, seq) {
            return Ok(Load::Handled(Outcome::Done));
        }
        if p.cancelled().is_some() {
            let numbers = recipients.iter().map(|r| r.to());
            record_cancelled(ctx, log, gen, numbers).await?;
            return Ok(Load::Handled(Outcome::Done));
        }
    }
    Ok(Load::Handled(outcome))
}

/// The `chunk_loaded` event of chunk `seq`, from the provider's answers
/// to its adds (`summary`).
fn loaded_event<R: RecipientFields>(
    seq: u32,
    gen: u32,
    group_id: &str,
    summary: AddSummary,
    recipients: &[R],
) -> ChunkLoaded {
    // 1026 counts as registered: already in this group, i.e. an earlier
    // attempt of this very add registered it (the response was lost). No
    // other chunk of the batch can have put the number there: the
    // batch-wide dedupe gives each number to one chunk only.
    let duplicates = summary.duplicates;
    let registered = summary.registered + duplicates;
    // Each failure's position is that of a result, and there is exactly one
    // result per recipient (`add_messages_json` checks).
    let failed: Vec<RegistrationFailure> = summary
        .failed
        .into_iter()
        .map(|(i, code)| RegistrationFailure {
            to: recipients[i].to().to_string(),
            code,
        })
        .collect();
    ChunkLoaded {
        gen,
        seq,
        group_id: group_id.to_string(),
        registered,
        duplicates,
        failed,
        given_up: None,
    }
}

/// Records the chunk loaded (`loaded.lua`) and counts it, once.
async fn record_load<R: RecipientFields>(
    ctx: &Ctx,
    log: &BatchLog,
    event: &ChunkLoaded,
    recipients: &[R],
) -> Result<(), OpError> {
    let (gen, registered) = (event.gen, event.registered);
    let failures = event.failed.len() as u64;
    match log.record_loaded(event).await? {
        Loading::Loaded { ready } => {
            // Counted only when the loaded event is new: a chunk loaded twice
            // (a repeat delivery racing the first) counts its recipients once,
            // so the counters add up to the batches' registered totals.
            metrics::counter!("groupcast_chunks_total", "outcome" => "loaded").increment(1);
            metrics::counter!("groupcast_recipients_registered_total")
                .increment(u64::from(registered));
            metrics::counter!("groupcast_recipients_failed_total").increment(failures);
            if ready {
                tracing::info!(batch = %log.batch, gen, "generation complete: send enqueued");
            }
        }
        Loading::Duplicate => {}
        Loading::Cancelled => {
            // Registered into a group the cancel deletes (its delete may
            // have listed the group before this add): never sent.
            let failed: std::collections::HashSet<&str> =
                event.failed.iter().map(|f| f.to.as_str()).collect();
            let numbers = recipients
                .iter()
                .map(|r| r.to())
                .filter(|n| !failed.contains(n));
            record_cancelled(ctx, log, gen, numbers).await?;
        }
    }
    Ok(())
}

/// Records `numbers` (of generation `gen`) as never sent because their
/// batch was cancelled: a chunk the cancel stopped before it was loaded,
/// or whose load the cancel made pointless.
pub(crate) async fn record_cancelled<'a>(
    ctx: &Ctx,
    log: &BatchLog,
    gen: u32,
    numbers: impl Iterator<Item = &'a str>,
) -> Result<(), OpError> {
    let r = Record::not_sent(gen, NotSentReason::Cancelled, "");
    record_each(ctx, log, &r, numbers).await
}

/// Records the same outcome `r` for each of `numbers` (one write): the
/// recipients a cancel stopped, the copies a chunk held.
pub(crate) async fn record_each<'a>(
    ctx: &Ctx,
    log: &BatchLog,
    r: &Record,
    numbers: impl Iterator<Item = &'a str>,
) -> Result<(), OpError> {
    let encoded = r.encode();
    let records: Vec<(String, String)> = numbers.map(|n| (r.field(n), encoded.clone())).collect();
    log.record_outcomes(&records, ctx.config.results_keep())
        .await?;
    Ok(())
}

/// Records chunk `seq` of generation `gen` as loaded with nobody to add:
/// every number in it was a copy of one the batch already had.
pub(crate) async fn record_nothing_to_load(
    log: &BatchLog,
    seq: u32,
    gen: u32,
    group_id: Option<&str>,
) -> Result<(), OpError> {
    let event = ChunkLoaded {
        gen,
        seq,
        group_id: group_id.unwrap_or_default().to_string(),
        registered: 0,
        duplicates: 0,
        failed: Vec::new(),
        given_up: None,
    };
    log.loaded(&event).await?;
    Ok(())
}

/// The failure code of recipients whose chunk was given up on.
pub(crate) const GIVEN_UP: &str = "given_up";

/// Gives up loading a chunk (its add was refused for good, or kept failing
/// past `--retry-for`): records it as loaded with every recipient failed
/// (code [`GIVEN_UP`]) and the reason, so that its generation can still be
/// sent and the batch can report. Whether the provider registered some of
/// them before giving up is unknown; the send's count check allows for
/// that (`g:<gen>:unsure`). A chunk already recorded loaded stays as it is.
pub(crate) async fn give_up(
    ctx: &Ctx,
    lane: crate::keys::Priority,
    item: &crate::worker::ops::WorkItem,
    chunk_bytes: &[u8],
    reason: &str,
) -> Result<(), OpError> {
    let Some(seq) = item.seq else {
        return Ok(());
    };
    let mut fallback = None;
    let chunk = match ChunkRef::decode_any(chunk_bytes, &mut fallback) {
        Ok(c) => c,
        // Not a chunk: nothing a give-up could list (the dead letter keeps it).
        Err(_) => return Ok(()),
    };
    let log = ctx.store.batch_in(&item.batch, lane);
    let group = item.group_id.as_deref().unwrap_or_default();
    record_given_up(&log, &chunk, item.gen, seq, group, reason).await
}

/// Records chunk `seq` (`chunk`) of generation `gen` as loaded into `group`
/// with every recipient failed (code [`GIVEN_UP`]) for `reason`: the
/// recording shared by a load given up and a chunk of a generation whose
/// group can never be created.
async fn record_given_up(
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
    seq: u32,
    group: &str,
    reason: &str,
) -> Result<(), OpError> {
    let event = ChunkLoaded {
        gen,
        seq,
        group_id: group.to_string(),
        registered: 0,
        duplicates: 0,
        failed: chunk
            .recipients
            .iter()
            .map(|r| RegistrationFailure {
                to: r.to.to_string(),
                code: GIVEN_UP.to_string(),
            })
            .collect(),
        given_up: Some(crate::events::clip(reason, 4 * crate::events::QUOTE_MAX)),
    };
    if log.loaded(&event).await?.is_some() {
        metrics::counter!("groupcast_chunks_total", "outcome" => "given_up").increment(1);
        metrics::counter!("groupcast_recipients_failed_total").increment(event.failed.len() as u64);
        tracing::warn!(batch = %log.batch, gen, seq, %reason, "chunk given up: its recipients are recorded as failed");
    }
    Ok(())
}

/// Records `chunk` (assigned to generation `gen`) as given up because the
/// generation's group can never be created (`fail_generation.lua`): its
/// recipients fail with the reason, and the generation completes without
/// it. Called for a chunk that finds the generation failed when it parks,
/// and for the parked chunks the give-up released.
pub(crate) async fn give_up_in_failed_generation(
    log: &BatchLog,
    chunk: &ChunkRef<'_>,
    gen: u32,
) -> Result<(), OpError> {
    let reason = format!("generation {gen} has no group: its creation was given up");
    record_given_up(log, chunk, gen, chunk.seq, "", &reason).await
}
