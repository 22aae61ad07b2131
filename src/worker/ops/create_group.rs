//! `create`: create a generation's provider group and record it. Two racers
//! may both create one; `record_group.lua` keeps the first recorded and the
//! loser enqueues the deletion of its own, as does a creator that finds the
//! batch cancelled meanwhile.

use std::collections::BTreeMap;

use crate::keys::Priority;
use crate::projection::field;
use crate::store::batch::GroupRecord;
use crate::worker::ops::{provider_slots, Op, OpError, Outcome, WorkItem};
use crate::worker::Ctx;

/// Runs a create item.
pub async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let log = ctx.store.batch_in(&item.batch, lane);
    let gen = item.gen;
    let p = log
        .read(&[field::group(gen), field::CANCELLED.to_string()])
        .await?;
    if p.group_of(gen).is_some() || p.cancelled().is_some() {
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
        Err(e) => return Ok(Outcome::from_provider(&e)),
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
    }
    let delete = WorkItem {
        batch: item.batch.clone(),
        gen,
        seq: None,
        group_id: Some(group.group_id),
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
    };
    ctx.enqueue(&log.keys.work, Op::Delete, &delete, None)
        .await?;
    Ok(Outcome::Done)
}
