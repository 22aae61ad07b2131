//! `delete`: delete a group that lost the creation race (or whose creator
//! found the batch cancelled), or the group of a generation a cancel
//! stopped, and record it.

use crate::events::{Event, GroupDiscarded};
use crate::keys::Priority;
use crate::projection::{event_key, field};
use crate::provider::{GroupStatus, ProviderErrorKind};
use crate::results::NotSentReason;
use crate::worker::ops::{provider_slots, OpError, Outcome, WorkItem};
use crate::worker::Ctx;

/// Runs a delete item.
pub(crate) async fn run(ctx: &Ctx, lane: Priority, item: &WorkItem) -> Result<Outcome, OpError> {
    let Some(group_id) = item.group_id.as_deref() else {
        return Ok(Outcome::Dead("delete item without a group id".into()));
    };
    let log = ctx.store.batch_in(&item.batch, lane);
    let key = event_key::discard(group_id);
    if log.appended(&key).await?.is_some() {
        return Ok(Outcome::Done);
    }
    // The generation's own group, stopped unsent: who was in it is read
    // before it goes (a group that lost the creation race holds nobody).
    let p = log
        .read(&[field::group(item.gen), field::gen(item.gen, "done")])
        .await?;
    let kept = p.group_of(item.gen).map(str::to_string);
    let reason = match p.gen_field(item.gen, "done") {
        Some("cancelled") => Some(NotSentReason::Cancelled),
        Some("unsent") => Some(NotSentReason::Unsent),
        _ => None,
    };
    if let (Some(reason), true) = (reason, kept.as_deref() == Some(group_id)) {
        if let Some(back) =
            super::track_delivery::record_not_sent(ctx, lane, &log, item.gen, group_id, reason)
                .await?
        {
            return Ok(back);
        }
    }
    if let Some(back) = provider_slots(ctx, lane, 1).await? {
        return Ok(back);
    }
    match ctx.provider.delete_group(group_id).await {
        Ok(()) => {}
        // Already gone: a retried delete whose first answer was lost.
        Err(e) if e.status() == Some(404) => {}
        Err(e) if e.kind() == ProviderErrorKind::Permanent => {
            // A retried delete whose first answer was lost finds the group
            // DELETED, which the provider refuses to delete again (400
            // NotOperationalStatus): look before giving up. The look waits
            // for its slot however far ahead the schedule is, holding the
            // entry (its lease is renewed meanwhile). Given back, the retry
            // would spend the lane's next slot on the delete again, and
            // under a busy limiter the look would be refused again, try
            // after try: the group would never be recorded as discarded.
            ctx.limiter.acquire(1).await?;
            match ctx.provider.get_group(group_id).await {
                Ok(g) if g.status == GroupStatus::Deleted => {}
                Ok(_) => {
                    return Ok(Outcome::Dead(format!(
                        "cannot delete group {group_id}: {e}"
                    )))
                }
                Err(ge) => return Ok(super::provider_failed(ctx, &item.batch, &ge).await),
            }
        }
        Err(e) => return Ok(super::provider_failed(ctx, &item.batch, &e).await),
    }
    let e = Event::GroupDiscarded(GroupDiscarded {
        gen: item.gen,
        group_id: group_id.to_string(),
        kept: kept.unwrap_or_default(),
    });
    log.append(&key, &e).await?;
    Ok(Outcome::Done)
}
