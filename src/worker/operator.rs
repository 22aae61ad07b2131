//! The operator role: runs work items (provider operations, report delivery).

use tracing::Instrument;

use crate::events::chunk::ChunkRef;
use crate::events::{clip, decode_payload, QUOTE_MAX};
use crate::keys::validate_batch_id;
use crate::keys::Priority;
use crate::store::queue::Entry;
use crate::worker::ops::{self, Op, OpError, Outcome, WorkItem};
use crate::worker::{Ctx, Handled};

/// Handles one work entry of `lane`'s work stream: the work items it leads
/// to stay in that lane.
pub(crate) async fn handle(ctx: &Ctx, lane: Priority, entry: &Entry) -> Result<Handled, OpError> {
    let dead = |reason: String| Ok(Handled::new(Outcome::Dead(reason)));
    let Some(op) = entry.text("op").as_deref().and_then(Op::parse) else {
        return dead(format!(
            "unknown work op {:?}",
            entry.text("op").map(|op| clip(&op, QUOTE_MAX))
        ));
    };
    let item: WorkItem = match entry.get("d").map(|d| decode_payload("work item", d)) {
        Some(Ok(i)) => i,
        Some(Err(e)) => return dead(e.to_string()),
        None => return dead("work entry has no `d` field".into()),
    };
    if let Err(e) = validate_batch_id(&item.batch) {
        return dead(format!("invalid batch id: {e}"));
    }
    // A span, not a guard: a guard held across `.await` would mark whatever
    // else runs on this thread meanwhile as part of this item.
    let span = tracing::info_span!(
        "op",
        op = op.name(),
        batch = %item.batch,
        gen = item.gen,
        seq = item.seq,
        attempt = item.attempt
    );
    run(ctx, lane, op, item, entry.get("c").map(<[u8]>::to_vec))
        .instrument(span)
        .await
}

/// Runs a decoded work item (inside its span).
async fn run(
    ctx: &Ctx,
    lane: Priority,
    op: Op,
    mut item: WorkItem,
    chunk_bytes: Option<Vec<u8>>,
) -> Result<Handled, OpError> {
    let dead = |reason: String| Ok(Handled::new(Outcome::Dead(reason)));
    let outcome = match op {
        Op::Create => ops::create_group::run(ctx, lane, &item).await?,
        Op::Send => ops::send_group::run(ctx, lane, &item).await?,
        Op::Poll => ops::poll_group::run(ctx, lane, &mut item).await?,
        Op::Delete => ops::delete_group::run(ctx, lane, &item).await?,
        Op::Recall => ops::recall_send::run(ctx, lane, &item).await?,
        Op::Report => ops::deliver_report::run(ctx, lane, &item).await?,
        Op::Track => ops::track_delivery::run(ctx, lane, &mut item).await?,
        Op::DeliveryReport => ops::deliver_report::run_delivery(ctx, lane, &item).await?,
        Op::Load => {
            let (Some(seq), Some(group), Some(bytes)) =
                (item.seq, item.group_id.as_deref(), chunk_bytes.as_deref())
            else {
                return dead("load item without seq, group or chunk".into());
            };
            let mut fallback = None;
            let chunk = match ChunkRef::decode_any(bytes, &mut fallback) {
                Ok(c) => c,
                Err(e) => return dead(format!("undecodable chunk in load item: {e}")),
            };
            let log = ctx.store.batch_in(&item.batch, lane);
            // A retried load may find its chunk loaded meanwhile: look before
            // calling the provider. A first attempt (a released parked chunk)
            // almost never is, and if it is, the add answers 1026 and
            // `loaded.lua` records nothing twice: skip the read.
            if item.attempt > 0 && log.is_loaded(item.gen, seq).await? {
                Outcome::Done
            } else if group.is_empty() {
                // Released by `fail_generation.lua`: the generation has no
                // group and never will; the chunk ends as given up.
                ops::load_chunk::give_up_in_failed_generation(&log, &chunk, item.gen).await?;
                Outcome::Done
            } else {
                match ops::load_chunk::run_ref(ctx, &log, &chunk, item.gen, group).await? {
                    ops::load_chunk::Load::Handled(outcome) => outcome,
                    // Dropped: its chunk is loaded through what survived.
                    ops::load_chunk::Load::Stale => Outcome::Done,
                }
            }
        }
    };
    metrics::counter!("groupcast_work_items_total", "op" => op.name(), "outcome" => outcome_name(&outcome))
        .increment(1);
    Ok(Handled {
        outcome,
        retry_as: Some((op, item, chunk_bytes)),
    })
}

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Done => "done",
        Outcome::Retry { .. } => "retry",
        Outcome::Dead(_) => "dead",
    }
}
