//! The worker: consumer-group readers for every role, sharing one context.
//!
//! - [`loader`]: ingest entry → accepted chunk → parked or loaded.
//! - [`operator`] and [`ops`]: work items, one file per provider operation.
//! - [`consumer`]: reading, reclaiming, and settling every entry.
//! - [`retry`]: the time budget of retries, and the backoff.
//! - [`maintenance`]: delayed retries back to their streams; stream trimming.
//! - [`watchdog`]: batches that went quiet before their report.
//! - [`limiter`]: the provider rate limiter shared by every process.
//! - [`durability`]: acknowledged events read back, to detect lost writes.

pub mod config;
pub mod consumer;
pub mod durability;
pub mod limiter;
pub mod loader;
pub mod maintenance;
pub mod operator;
pub mod ops;
pub mod retry;
pub mod watchdog;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

pub use config::{Role, WorkerConfig};

use crate::provider::ProviderClient;
use crate::store::{Store, StoreResult};
use limiter::Limiter;
use ops::{Op, Outcome, WorkItem};

/// What a handler decided, and how to retry it if it must be retried.
#[derive(Debug)]
pub struct Handled {
    /// The outcome.
    pub outcome: Outcome,
    /// The work item a retry runs: its op, item and chunk payload.
    pub retry_as: Option<(Op, WorkItem, Option<Vec<u8>>)>,
}

impl Handled {
    /// An outcome with nothing to retry as.
    pub fn new(outcome: Outcome) -> Handled {
        Handled {
            outcome,
            retry_as: None,
        }
    }
}

/// Everything a handler needs.
pub struct Ctx {
    /// Redis.
    pub store: Store,
    /// The provider.
    pub provider: ProviderClient,
    /// Settings.
    pub config: WorkerConfig,
    /// The shared rate limiter.
    pub limiter: Limiter,
    /// The HTTP client for the report webhook.
    pub webhook: reqwest::Client,
    /// This process's consumer name: unique per process start, so that a
    /// restarted worker never inherits (and hides) a dead one's entries.
    pub consumer: String,
    gen_hints: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl Ctx {
    /// Builds a context.
    pub fn new(store: Store, provider: ProviderClient, config: WorkerConfig) -> Ctx {
        let limiter = Limiter::new(store.clone(), config.rate_limit, config.rate_burst);
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into());
        Ctx {
            store,
            provider,
            limiter,
            webhook: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            consumer: format!("{host}-{}-{}", std::process::id(), ulid::Ulid::new()),
            gen_hints: Default::default(),
            config,
        }
    }

    /// Appends a work item to a work stream.
    pub async fn enqueue(
        &self,
        work: &str,
        op: Op,
        item: &WorkItem,
        chunk: Option<&[u8]>,
    ) -> StoreResult<()> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(work)
            .arg("*")
            .arg("op")
            .arg(op.name())
            .arg("d")
            .arg(crate::events::encode_payload(item));
        if let Some(c) = chunk {
            cmd.arg("c").arg(c);
        }
        cmd.query_async::<String>(&mut self.store.conn.clone())
            .await?;
        Ok(())
    }

    /// The generation this process last saw a chunk of `batch` join (0 if
    /// none): a hint that saves the accept script a read.
    pub fn gen_hint(&self, batch: &str) -> u32 {
        self.gen_hints
            .lock()
            .ok()
            .and_then(|m| m.get(batch).copied())
            .unwrap_or(0)
    }

    /// Remembers the generation a chunk of `batch` joined.
    pub fn remember_gen(&self, batch: &str, gen: u32) {
        if let Ok(mut m) = self.gen_hints.lock() {
            // Bounded: a long-running worker sees many batches; an empty map
            // only costs one extra read per batch.
            if m.len() >= 10_000 {
                m.clear();
            }
            m.insert(batch.to_string(), gen);
        }
    }

    /// Counts an entry of `stream` (`ingest`, `work`) in or out of
    /// handling. The gauge is per process: several contexts in one process
    /// (the demo, tests) add up instead of overwriting each other.
    fn in_flight(&self, stream: &'static str, delta: i64) {
        metrics::gauge!("groupcast_worker_in_flight", "stream" => stream).increment(delta as f64);
    }
}

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
            ctx.store
                .ensure_group(&keys.ingest(shard), crate::keys::LOADERS_GROUP)
                .await?;
            ctx.store
                .ensure_group(&keys.work(shard), crate::keys::OPERATORS_GROUP)
                .await?;
        }
        let (tx, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(durability::run(ctx.clone(), rx.clone()));
        for role in &ctx.config.roles {
            match role {
                Role::Load | Role::Operate => {
                    let source = if *role == Role::Load {
                        consumer::Source::Ingest
                    } else {
                        consumer::Source::Work
                    };
                    for shard in 0..keys.shards() {
                        tasks.spawn(consumer::run(ctx.clone(), source, shard, rx.clone()));
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
