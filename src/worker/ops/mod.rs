//! Work items: one file per operation, and a thin dispatcher.
//!
//! A work stream entry has the fields `op` (below), `d` (a MessagePack
//! [`WorkItem`]) and, for `load`, `c` (the chunk payload). Every provider call
//! is one of these, so that one rate limiter counts them all and retries,
//! backoff and dead letters come from one place ([`crate::worker::consumer`]).

pub(crate) mod create_group;
pub(crate) mod delete_group;
pub(crate) mod deliver_report;
pub(crate) mod load_chunk;
pub(crate) mod poll_group;
pub(crate) mod recall_send;
pub mod send_group;
pub(crate) mod track_delivery;

use std::time::Duration;

pub use crate::events::work_item::{Op, WorkItem};
use crate::provider::{ProviderError, RetryDecision};
use crate::store::batch::BatchLog;
use crate::store::StoreError;

/// [`Outcome::from_provider`] for a call made for batch `batch`. A refusal
/// of the credentials is also noted on the batch, so that `status` and the
/// board say "provider refused credentials" rather than only the dead
/// letters (the next call is refused the same way until someone fixes the
/// key or the secret).
pub(crate) async fn provider_failed(
    ctx: &crate::worker::Ctx,
    batch: &str,
    e: &ProviderError,
) -> Outcome {
    if e.refused_credentials() {
        // The dead letter still tells; only the batch's line would be missing.
        if let Err(err) = ctx
            .store
            .note_credentials_refused(batch, &e.to_string())
            .await
        {
            tracing::warn!(batch, error = %err, "could not note the refused credentials on the batch");
        }
    }
    Outcome::from_provider(e)
}

/// How a handler's entry is to be finished.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done: acknowledge.
    Done,
    /// Try again later. `delay` None means the backoff for the next attempt;
    /// `spend` false means this try does not count (a 429, a poll).
    Retry {
        /// A delay fixed by the cause (Retry-After; for a poll, replaced by
        /// the next poll's, see [`crate::worker::retry::decide`]).
        delay: Option<Duration>,
        /// Whether this counts as an attempt.
        spend: bool,
        /// What kind of trouble it is, for metrics.
        cause: RetryCause,
        /// Why, for the log and the dead letter if attempts run out.
        reason: String,
    },
    /// Never worth retrying: dead-letter with the reason.
    Dead(String),
}

/// Why an entry is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryCause {
    /// A transient failure (5xx, timeout, dropped connection).
    Transient,
    /// The provider asked us to slow down (429 with Retry-After).
    RateLimited,
    /// Waiting for the provider to finish (a poll).
    NotFinished,
    /// The report webhook did not accept the report.
    Webhook,
    /// Waiting until Redis has made the facts a send relies on durable.
    Durability,
    /// The shared rate limiter asked for a wait too long to hold the entry
    /// through: given back, no slot reserved.
    Limiter,
    /// A send held until the batch's `send_at` or the end of its quiet hours.
    Scheduled,
    /// A send whose claim's lifetime ran out before the provider call could
    /// start (a limiter or durability wait): claimed again at once.
    ClaimExpired,
    /// Delivery tracking: some messages of a sent group have no final
    /// result yet; the list is read again after a wait that grows from
    /// seconds to minutes (carried in the item's `poll_delay_ms`).
    AwaitingResults,
}

impl RetryCause {
    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            RetryCause::Transient => "transient",
            RetryCause::RateLimited => "rate_limited",
            RetryCause::NotFinished => "not_finished",
            RetryCause::Webhook => "webhook",
            RetryCause::Durability => "durability",
            RetryCause::Limiter => "limiter",
            RetryCause::Scheduled => "scheduled",
            RetryCause::ClaimExpired => "claim_expired",
            RetryCause::AwaitingResults => "awaiting_results",
        }
    }

    /// Whether waiting out this cause spends the item's time budget
    /// (`--retry-for`): trouble at the provider or the webhook does; waiting
    /// on our own pace (the limiter, durability) or on a group the provider
    /// is still sending does not.
    pub(crate) fn spends_budget(self) -> bool {
        matches!(
            self,
            RetryCause::Transient | RetryCause::RateLimited | RetryCause::Webhook
        )
    }

    /// Whether this wait shows the batch is alive (a heartbeat for the
    /// watchdog although no event is appended): a poll of a group still
    /// sending, a limiter or a durability wait.
    pub(crate) fn is_heartbeat(self) -> bool {
        matches!(
            self,
            RetryCause::NotFinished
                | RetryCause::Durability
                | RetryCause::Limiter
                | RetryCause::Scheduled
                | RetryCause::ClaimExpired
        )
    }
}

/// Takes `requests` slots of the shared rate limiter for a request of
/// `lane`, waiting for them when the wait is short (within the lane's
/// horizon, see [`crate::worker::limiter`]). A wait longer than [`WorkerConfig::max_limiter_wait`]
/// reserves nothing and returns the outcome that gives the entry back until
/// then: holding it that long would let the visibility timeout hand it to a
/// second consumer, which would reserve (and call) again.
///
/// [`WorkerConfig::max_limiter_wait`]: crate::worker::WorkerConfig::max_limiter_wait
pub(crate) async fn provider_slots(
    ctx: &crate::worker::Ctx,
    lane: crate::keys::Priority,
    requests: u32,
) -> Result<Option<Outcome>, StoreError> {
    match ctx
        .limiter
        .reserve_within(lane, requests, ctx.config.max_limiter_wait())
        .await?
    {
        Ok(_) => Ok(None),
        Err(wait) => Ok(Some(Outcome::Retry {
            delay: Some(wait),
            spend: false,
            cause: RetryCause::Limiter,
            reason: format!("the rate limiter asks for a {wait:?} wait: entry given back"),
        })),
    }
}

/// A handler failure, before it is turned into an [`Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The provider failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// Redis failed: the entry stays pending and is reclaimed later.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A chunk's assignment kept disappearing (Redis losing its writes
    /// again and again): the entry stays pending and is reclaimed later.
    #[error("{0}")]
    Unassigned(String),
}

/// What [`on_disk`] found.
#[derive(Debug)]
pub(crate) enum OnDisk {
    /// What the call rests on is on disk (or nothing is waited for): go.
    Yes,
    /// Not yet: the outcome that waits.
    NotYet(Outcome),
    /// A fact is gone (Redis lost it): the outcome that reads the entry
    /// again, whose handler then finds what survived.
    Gone(Outcome),
}

/// Whether an add or a send may go out now, resting on the events in
/// `facts` (event key, entry id) of `log`'s batch: [`OnDisk::Yes`] when they
/// are on disk (or nothing is waited for, [`DurableWait::None`]), else the
/// outcome that waits, or that reads the entry again because a fact is
/// gone. A provider call that cannot be taken back must not rest on facts
/// Redis can still lose in a crash: the chunk would be reassigned or the
/// generation redone, and recipients registered or sent twice.
///
/// - [`DurableWait::Window`]: until the youngest fact is that old
///   ([`durability_wait`]): the handler sleeps until then without its
///   consumer slot; when too many entries of its consumer already wait so,
///   holding it (the consumer then reads no more until a wait ends). Then
///   it reads the facts again: one Redis lost during the sleep sends the
///   entry back to be read again, as below.
/// - [`DurableWait::WaitAof`]: waits here (its consumer slot given back,
///   as above), with every other waiter of the
///   process, for one `WAITAOF` round ([`crate::store::durability::aof`]), which also
///   checks that each fact is still there. A fact gone (Redis lost it) sends
///   the entry back to be read again: its handler then finds what
///   survived.
///
/// [`DurableWait::None`]: crate::worker::DurableWait::None
/// [`DurableWait::Window`]: crate::worker::DurableWait::Window
/// [`DurableWait::WaitAof`]: crate::worker::DurableWait::WaitAof
pub(crate) async fn on_disk(
    ctx: &crate::worker::Ctx,
    log: &BatchLog,
    facts: &[(&str, &str)],
    what: impl FnOnce() -> String,
) -> Result<OnDisk, StoreError> {
    use crate::store::durability::aof::{Fact, Fsync};
    use crate::worker::DurableWait;
    match ctx.config.durable {
        DurableWait::None => Ok(OnDisk::Yes),
        DurableWait::Window(window) => {
            let ids: Vec<&str> = facts.iter().map(|(_, id)| *id).collect();
            // Waits here, its consumer slot given back unless too many
            // entries already wait so (then holding it); through the
            // delayed retries only outside a consumer's entry. A few
            // seconds at most, well within the entry's lease. The
            // server's clock is read once: a sleep never ends early, so
            // after `delay` the youngest fact is older than the window (and
            // its 50 ms of slack) by real time, which is what the fsync
            // schedule runs on.
            let Some(delay) = durability_wait(log, window, &ids).await? else {
                return Ok(OnDisk::Yes);
            };
            if !crate::worker::slot::wait_without_slot(delay).await {
                return Ok(OnDisk::NotYet(wait_for_disk(delay, what())));
            }
            // Age makes a fact durable only if Redis still has it: a crash
            // during the sleep (a restart from an AOF that missed its last
            // second) can have taken it back, and the call would rest on
            // nothing (seen in the chaos suite: a send claimed, its `ready`
            // and claim lost, the send still made after the sleep, and a
            // chunk of that generation then loaded again into a group
            // already sending). So the facts are read again: one `HMGET`.
            // (A wait through the delayed retries reads them on its retry.)
            let names: Vec<String> = facts
                .iter()
                .map(|(key, _)| crate::projection::field::key(key))
                .collect();
            let now = log.fields(&names).await?;
            let kept = facts
                .iter()
                .zip(&now)
                .all(|((_, id), now)| now.as_deref() == Some(*id));
            Ok(if kept {
                OnDisk::Yes
            } else {
                OnDisk::Gone(gone(what()))
            })
        }
        DurableWait::WaitAof { .. } => {
            let Some(aof) = &ctx.aof else {
                return Err(StoreError::Config {
                    url: ctx.store.target.redacted(),
                    reason: "WAITAOF waits configured without a waiter".into(),
                });
            };
            let facts = facts
                .iter()
                .map(|(key, id)| Fact {
                    state: log.keys.state.clone(),
                    field: crate::projection::field::key(key),
                    id: id.to_string(),
                })
                .collect();
            let started = std::time::Instant::now();
            // Up to the next fsync (a second under everysec): without the
            // consumer slot, like the window's sleep, so that the round
            // gathers every entry the consumer can read meanwhile.
            let found = crate::worker::slot::without_slot(aof.wait(facts)).await?;
            metrics::histogram!("groupcast_fsync_wait_seconds")
                .record(started.elapsed().as_secs_f64());
            Ok(match found {
                Fsync::Durable => OnDisk::Yes,
                Fsync::NotYet => OnDisk::NotYet(wait_for_disk(Duration::from_millis(100), what())),
                Fsync::Gone => OnDisk::Gone(gone(what())),
            })
        }
    }
}

/// The retry for an add or send one of whose facts Redis no longer has (it
/// lost writes): the entry is read again and its handler finds what
/// survived.
fn gone(what: String) -> Outcome {
    Outcome::Retry {
        delay: Some(Duration::from_millis(100)),
        spend: false,
        cause: RetryCause::Durability,
        reason: format!(
            "{what}: an event it relies on is no longer in Redis (lost writes?): read again"
        ),
    }
}

/// For [`DurableWait::Window`](crate::worker::DurableWait::Window): how much
/// longer until every event whose entry id is in `ids` has been in Redis
/// `window` long, i.e. is on disk. None: go now.
pub async fn durability_wait(
    log: &BatchLog,
    window: Duration,
    ids: &[&str],
) -> Result<Option<Duration>, StoreError> {
    if window.is_zero() {
        return Ok(None);
    }
    let youngest = ids
        .iter()
        .map(|id| crate::events::entry_millis(id))
        .max()
        .unwrap_or(0);
    // Entry ids carry the clock of the server that appended them: compare
    // with that one (on a cluster, the master holding the batch).
    let now = log.server_time_ms().await?;
    let age = Duration::from_millis(now.saturating_sub(youngest));
    Ok((age < window).then(|| window - age + Duration::from_millis(50)))
}

/// The retry for a wait until Redis has what an add or send relies on on disk.
pub(crate) fn wait_for_disk(delay: Duration, what: String) -> Outcome {
    Outcome::Retry {
        delay: Some(delay),
        spend: false,
        cause: RetryCause::Durability,
        reason: format!("{what}: waiting until Redis has it on disk"),
    }
}

impl Outcome {
    /// The outcome a provider error calls for.
    pub(crate) fn from_provider(e: &ProviderError) -> Outcome {
        match e.retry_decision() {
            RetryDecision::RetryWithBackoff => Outcome::Retry {
                delay: None,
                spend: true,
                cause: RetryCause::Transient,
                reason: e.to_string(),
            },
            RetryDecision::RetryAfter(d) => Outcome::Retry {
                delay: Some(d),
                spend: false,
                cause: RetryCause::RateLimited,
                reason: e.to_string(),
            },
            RetryDecision::AlreadyDone => Outcome::Done,
            RetryDecision::Abort => Outcome::Dead(e.to_string()),
        }
    }
}
