//! The worker: consumer-group readers for every role, sharing one context.
//!
//! - [`ctx`]: the context every handler gets, and what a handler decided.
//! - [`loader`]: ingest entry → accepted chunk → parked or loaded.
//! - [`operator`] and [`ops`]: work items, one file per provider operation.
//! - [`consumer`]: reading, reclaiming, and settling every entry.
//! - [`retry`]: the time budget of retries, and the backoff.
//! - [`maintenance`]: delayed retries back to their streams; stream trimming.
//! - [`watchdog`]: batches that went quiet before their report.
//! - [`limiter`]: the provider rate limiter shared by every process.
//! - [`durability`]: acknowledged events read back, to detect lost writes.
//! - [`webhook`]: signing report deliveries, and their fields' names.

pub(crate) mod config;
pub(crate) mod consumer;
pub(crate) mod ctx;
pub mod durability;
pub(crate) mod group_wait;
pub mod limiter;
pub(crate) mod loader;
pub mod maintenance;
pub(crate) mod operator;
pub mod ops;
pub(crate) mod retry;
mod slot;
pub mod watchdog;
pub(crate) mod webhook;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

pub use config::{RateLimit, Role, WorkerConfig};
pub use ctx::{Ctx, Handled};
pub use durability::DurableWait;

use crate::keys::Priority;
use crate::store::StoreResult;

/// A running worker.
pub struct Worker {
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// Its context.
    pub ctx: Arc<Ctx>,
}

impl Worker {
    /// Creates the consumer groups and starts every configured role.
    pub async fn start(ctx: Ctx) -> StoreResult<Worker> {
        let ctx = Arc::new(ctx);
        let keys = &ctx.store.keys;
        for shard in 0..keys.shards() {
            for lane in Priority::ALL {
                ctx.store
                    .ensure_group(&keys.ingest_in(shard, lane), crate::keys::LOADERS_GROUP)
                    .await?;
                ctx.store
                    .ensure_group(&keys.work_in(shard, lane), crate::keys::OPERATORS_GROUP)
                    .await?;
            }
        }
        let (tx, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(durability::lost_writes::run(ctx.clone(), rx.clone()));
        for role in &ctx.config.roles {
            match role {
                Role::Load | Role::Operate => {
                    let source = if *role == Role::Load {
                        consumer::Source::Ingest
                    } else {
                        consumer::Source::Work
                    };
                    for shard in 0..keys.shards() {
                        for lane in Priority::ALL {
                            tasks.spawn(consumer::run(
                                ctx.clone(),
                                source,
                                shard,
                                lane,
                                rx.clone(),
                            ));
                        }
                    }
                }
                Role::Promote => {
                    tasks.spawn(maintenance::run(ctx.clone(), rx.clone()));
                }
                Role::Watchdog => {
                    tasks.spawn(watchdog::run(ctx.clone(), rx.clone()));
                }
            }
        }
        tracing::info!(consumer = %ctx.consumer, roles = ?ctx.config.roles, "worker started");
        Ok(Worker {
            shutdown: tx,
            tasks,
            ctx,
        })
    }

    /// Stops taking work, lets in-flight entries finish (up to the drain
    /// timeout), and returns. Unfinished entries stay pending for reclaim.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        tracing::info!(consumer = %self.ctx.consumer, "worker stopped");
    }

    /// Aborts every task at once, like a crash (for tests).
    pub fn abort(mut self) {
        self.tasks.abort_all();
    }
}
