//! The context every handler shares ([`Ctx`]: the store, the provider, the
//! settings, the rate limiter) and what a handler decided ([`Handled`]).

use crate::provider::ProviderClient;
use crate::store::{Store, StoreResult};
use crate::worker::limiter::Limiter;
use crate::worker::ops::{Op, Outcome, WorkItem};
use crate::worker::WorkerConfig;

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
    /// The `WAITAOF` waiter, when adds and sends wait with it
    /// ([`crate::worker::DurableWait::WaitAof`]).
    pub aof: Option<crate::store::durability::aof::AofWaiter>,
    /// This process's chunks waiting for their generation's group.
    pub group_waits: std::sync::Arc<crate::worker::group_wait::GroupWaits>,
    gen_hints: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

impl Ctx {
    /// Builds a context.
    pub fn new(store: Store, provider: ProviderClient, config: WorkerConfig) -> Ctx {
        let store = store.with_policy(config.batch_policy());
        let limiter = Limiter::new(
            store.clone(),
            config.rate_limit,
            config.rate_burst,
            config.bulk_share,
        );
        // The limiter learns the provider's pace from its 429s (`auto`).
        let provider = provider.on_rate_limited({
            let limiter = limiter.clone();
            move || limiter.pushed_back()
        });
        let aof = match config.durable {
            crate::worker::DurableWait::WaitAof { replicas } => Some(store.aof_waiter(replicas)),
            _ => None,
        };
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
            group_waits: Default::default(),
            aof,
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
        self.store
            .enqueue(work, op.name(), &crate::events::encode_payload(item), chunk)
            .await?;
        Ok(())
    }

    /// The generation this process last saw a chunk of `batch` join (0 if
    /// none): a hint that saves the accept script a read.
    pub(crate) fn gen_hint(&self, batch: &str) -> u32 {
        self.gen_hints
            .lock()
            .ok()
            .and_then(|m| m.get(batch).copied())
            .unwrap_or(0)
    }

    /// Remembers the generation a chunk of `batch` joined.
    pub(crate) fn remember_gen(&self, batch: &str, gen: u32) {
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
    pub(super) fn in_flight(&self, stream: &'static str, delta: i64) {
        metrics::gauge!("groupcast_worker_in_flight", "stream" => stream).increment(delta as f64);
    }
}
