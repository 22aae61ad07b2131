//! `create`: create a generation's provider group and record it. Two racers
//! may both create one; `record_group.lua` keeps the first recorded and the
//! loser enqueues the deletion of its own, as does a creator that finds the
//! batch cancelled meanwhile.

use std::collections::BTreeMap;

use crate::keys::Priority;
use crate::projection::field;
use crate::store::batch::{GenerationFailure, GroupRecord};
use crate::worker::ops::{provider_slots, Op, OpError, Outcome, WorkItem};
use crate::worker::Ctx;

/// Runs a create item.
pub(crate) async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let p = log
        .read(&[
            field::group(gen),
            field::CANCELLED.to_string(),
            field::failed_in(gen),
        ])
        .await?;
    if p.cancelled().is_some() && p.group_of(gen).is_none() {
        // Never created now: the chunks parked for it (recipient data) have
        // no reason to outlive the batch.
        log.drop_parked(gen).await?;
        return Ok(Outcome::Done);
    }
    if p.group_of(gen).is_some() || p.failed_in(gen).is_some() {
        return Ok(Outcome::Done);
    }
    if let Some(back) = provider_slots(ctx, lane, 1).await? {
        return Ok(back);
    }
    let fields = BTreeMap::from([
        ("batchId".to_string(), item.batch.clone()),
        ("generation".to_string(), gen.to_string()),
    ]);
    let group = match ctx.provider.create_group(&fields).await {
        Ok(g) => g,
        Err(e) => return Ok(super::provider_failed(ctx, &item.batch, &e).await),
    };
    match log.record_group(gen, &group.group_id).await? {
        GroupRecord::Won => {
            tracing::info!(batch = %item.batch, gen, group = %group.group_id, "group created");
            ctx.group_waits.found(&item.batch, gen, &group.group_id);
            return Ok(Outcome::Done);
        }
        GroupRecord::Lost { kept } => {
            tracing::info!(batch = %item.batch, gen, group = %group.group_id, %kept, "lost the creation race: deleting ours");
        }
        GroupRecord::Cancelled => {
            tracing::info!(batch = %item.batch, gen, group = %group.group_id, "batch cancelled: deleting our group");
        }
        GroupRecord::Failed => {
            tracing::info!(batch = %item.batch, gen, group = %group.group_id, "the generation's creation was given up meanwhile: deleting our group");
        }
    }
    let delete = WorkItem {
        batch: item.batch.clone(),
        gen,
        seq: None,
        group_id: Some(group.group_id),
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
        cursor: None,
    };
    ctx.enqueue(&log.keys.work, Op::Delete, &delete, None)
        .await?;
    Ok(Outcome::Done)
}

/// Gives up a create item for good (the provider refused it, or it kept
/// failing past `--retry-for`): records the generation as failed
/// (`fail_generation.lua`) before the item is dead-lettered, so that its
/// chunks end as given up and the batch still reports.
pub(crate) async fn give_up(
    ctx: &Ctx,
    lane: Priority,
    item: &WorkItem,
    reason: &str,
) -> Result<(), OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let reason = crate::events::clip(reason, 4 * crate::events::QUOTE_MAX);
    match log.fail_generation(item.gen, &reason).await? {
        GenerationFailure::Failed { released } => {
            metrics::counter!("groupcast_generations_failed_total", "op" => "create").increment(1);
            tracing::error!(
                batch = %item.batch, gen = item.gen, released, %reason,
                "group creation given up: the generation's chunks end as failed"
            );
        }
        GenerationFailure::AlreadyFailed | GenerationFailure::Ended => {}
        GenerationFailure::HasGroup(group) => {
            tracing::info!(batch = %item.batch, gen = item.gen, %group, "a group was recorded meanwhile: nothing given up");
        }
    }
    Ok(())
}
