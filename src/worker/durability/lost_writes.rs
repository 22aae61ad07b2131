//! Reads this process's acknowledged events back once Redis must have made
//! them durable, and reports any that are gone: Redis lost acknowledged writes
//! (see [`crate::store::durability::witness`]). Runs in every worker, whatever its roles.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::store::durability::witness::{self, WINDOW};
use crate::worker::Ctx;

/// How often due events are read back.
const EVERY: Duration = Duration::from_millis(500);

/// Runs until shutdown.
pub(crate) async fn run(ctx: Arc<Ctx>, mut shutdown: watch::Receiver<bool>) {
    // A reported batch's state expires after the retention: with a retention
    // this short, a state gone entirely may be an expiry, not a loss.
    let expiry_possible = ctx.config.retention < WINDOW * 15;
    while !*shutdown.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = shutdown.changed() => {}
        }
        let due = ctx.store.witnesses.due(WINDOW);
        if due.is_empty() {
            continue;
        }
        let lost = match witness::check(&ctx.store, &due, expiry_possible).await {
            Ok(lost) => lost,
            Err(e) => {
                // Redis is away: ask again when it is back.
                tracing::debug!(error = %e, n = due.len(), "cannot read acknowledged events back yet");
                ctx.store.witnesses.put_back(due);
                continue;
            }
        };
        if lost.is_empty() {
            continue;
        }
        let batches: std::collections::BTreeSet<&str> =
            lost.iter().map(|l| l.witness.batch.as_str()).collect();
        tracing::error!(
            lost = lost.len(),
            ?batches,
            example = %format!("{} {} (entry {}, now {:?})", lost[0].witness.batch, lost[0].witness.key, lost[0].witness.id, lost[0].now),
            "REDIS LOST ACKNOWLEDGED WRITES: events this worker appended are gone after a Redis restart or failover. \
             The provider may hold groups or sends that these batches' events no longer show; verify them \
             (groupcast verify) and check the provider. Run Redis with appendonly yes and appendfsync always."
        );
        metrics::counter!("groupcast_redis_writes_lost_total").increment(lost.len() as u64);
        if let Err(e) = witness::record_lost(&ctx.store, &lost, &ctx.consumer).await {
            tracing::warn!(error = %e, "cannot record the lost writes yet; will check again");
            // Still missing next time: reported then.
            ctx.store
                .witnesses
                .put_back(lost.into_iter().map(|l| l.witness).collect());
        }
    }
}
