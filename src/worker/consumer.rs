//! A consumer-group reader for one stream, and the one place where an entry
//! is finished as its outcome says: acknowledged, retried later, or
//! dead-lettered. ("Finish", not "settle": `settle.lua` ends a batch.)

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use crate::events::encode_payload;
use crate::keys::Priority;
use crate::keys::{LOADERS_GROUP, OPERATORS_GROUP};
use crate::store::durability::witness::{self, LastAppended};
use crate::store::queue::{read_group, Alive, DelayedEntry, Entry, LoadHolds, Rescheduled};
use crate::store::BlockingConn;
use crate::worker::ops::{
    create_group, load_chunk, recall_send, Op, Outcome, RetryCause, WorkItem,
};
use crate::worker::slot::{self, Slot};
use crate::worker::{loader, operator, retry, Ctx, Handled};

/// Which stream a consumer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A shard's ingest stream (the loaders).
    Ingest,
    /// A shard's work stream (the operators).
    Work,
}

impl Source {
    /// Its consumer group.
    pub(crate) fn group(self) -> &'static str {
        match self {
            Source::Ingest => LOADERS_GROUP,
            Source::Work => OPERATORS_GROUP,
        }
    }
    /// Its stream on a shard's lane.
    pub(crate) fn stream(self, ctx: &Ctx, shard: u32, lane: Priority) -> String {
        match self {
            Source::Ingest => ctx.store.keys.ingest_in(shard, lane),
            Source::Work => ctx.store.keys.work_in(shard, lane),
        }
    }
    fn label(self) -> &'static str {
        match self {
            Source::Ingest => "ingest",
            Source::Work => "work",
        }
    }
}

/// Reads `source` on `shard`'s `lane` until `shutdown`,
/// `ctx.config.concurrency` entries at a time; every `visibility_timeout / 2`
/// it also takes over entries another consumer left pending too long. Each
/// lane has its own reader (its own reads and its own `concurrency`), so an
/// urgent entry never waits behind bulk entries read before it.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    source: Source,
    shard: u32,
    lane: Priority,
    mut shutdown: watch::Receiver<bool>,
) {
    let stream = source.stream(&ctx, shard, lane);
    let group = source.group();
    let permits = Arc::new(Semaphore::new(ctx.config.concurrency.max(1)));
    let waiting = Arc::new(Semaphore::new(slot::WAITING_KIB));
    let (acker, flusher) = Acker::spawn(ctx.store.clone(), stream.clone(), group);
    let total = ctx.config.concurrency.max(1) as u32;
    let mut reader = Reader::new(&ctx, source, stream.clone());
    while !*shutdown.borrow() {
        let slot = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        reader.reclaim_if_due(&ctx).await;
        if reader.buffer.is_empty() {
            match reader.read(&ctx, &mut shutdown).await {
                Fill::Read => {}
                Fill::Failed => continue,
                Fill::Shutdown => break,
            }
        }
        let Some((entry, deliveries)) = reader.buffer.pop_front() else {
            continue;
        };
        let ctx = ctx.clone();
        let stream = stream.clone();
        let acker = acker.clone();
        // Every log line of this entry (handling and settling) names it.
        let span = tracing::info_span!("entry", stream = source.label(), shard, lane = lane.name(), id = %entry.id, deliveries);
        let bytes = entry.fields.iter().map(|(k, v)| k.len() + v.len()).sum();
        let slot = Slot::new(permits.clone(), slot, waiting.clone(), bytes);
        tokio::spawn(
            slot::scope(slot, async move {
                let at = At {
                    source,
                    shard,
                    lane,
                    stream: &stream,
                };
                process(&ctx, &acker, &at, entry, deliveries).await;
            })
            .instrument(span),
        );
    }
    // Drain: wait for in-flight entries; what does not finish stays pending
    // and is reclaimed by another consumer after the visibility timeout.
    let _ = tokio::time::timeout(ctx.config.drain_timeout, permits.acquire_many(total)).await;
    // The last acknowledgements go out before we return.
    drop(acker);
    let _ = flusher.await;
}

/// The reading side of a consumer: its connection, and the entries read
/// (or reclaimed) but not yet started.
struct Reader {
    source: Source,
    stream: String,
    group: &'static str,
    /// Entries asked for per read or reclaim.
    read_count: usize,
    /// The blocking connection, opened on first use and after a failure.
    conn: Option<BlockingConn>,
    /// Failures in a row (opening or reading), for the pause after them.
    failures: u32,
    last_reclaim: Instant,
    reclaim_every: Duration,
    /// Entries read but not yet started, with their delivery counts. Reads
    /// ask for a whole `concurrency` worth at once and refill only when this
    /// runs dry, so a busy consumer reads many entries per command; at most
    /// `concurrency` entries wait here, well within the visibility timeout.
    buffer: VecDeque<(Entry, u64)>,
}

/// What a read came to.
enum Fill {
    /// Read (maybe nothing).
    Read,
    /// Failed (after a pause): start over.
    Failed,
    /// Shut down while blocked.
    Shutdown,
}

impl Reader {
    /// A reader of `stream`, of `source`.
    fn new(ctx: &Ctx, source: Source, stream: String) -> Reader {
        Reader {
            source,
            stream,
            group: source.group(),
            read_count: ctx.config.concurrency.max(1),
            conn: None,
            failures: 0,
            last_reclaim: Instant::now(),
            reclaim_every: (ctx.config.visibility_timeout / 2).max(Duration::from_millis(100)),
            buffer: VecDeque::new(),
        }
    }

    /// With nothing buffered and the time come, takes over the entries
    /// left pending past the visibility timeout.
    async fn reclaim_if_due(&mut self, ctx: &Ctx) {
        if !self.buffer.is_empty() || self.last_reclaim.elapsed() < self.reclaim_every {
            return;
        }
        let (stream, source) = (&self.stream, self.source);
        self.last_reclaim = Instant::now();
        let min_idle = ctx.config.visibility_timeout.as_millis() as u64;
        match ctx
            .store
            .reclaim(stream, self.group, &ctx.consumer, min_idle, self.read_count)
            .await
        {
            Ok((got, deleted)) => {
                if deleted > 0 {
                    tracing::warn!(%stream, deleted, "pending entries were trimmed before they were handled");
                    metrics::counter!("groupcast_reclaimed_trimmed_total", "stream" => source.label())
                        .increment(deleted as u64);
                }
                if !got.is_empty() {
                    tracing::info!(%stream, n = got.len(), "reclaimed idle entries");
                    metrics::counter!("groupcast_reclaimed_total", "stream" => source.label())
                        .increment(got.len() as u64);
                }
                self.buffer
                    .extend(got.into_iter().map(|r| (r.entry, r.deliveries)));
            }
            Err(e) => tracing::warn!(%stream, error = %e, "reclaim failed"),
        }
    }

    /// Reads new entries into the buffer, blocking up to `config.block`.
    async fn read(&mut self, ctx: &Ctx, shutdown: &mut watch::Receiver<bool>) -> Fill {
        let stream = &self.stream;
        if self.conn.is_none() {
            match ctx.store.blocking().await {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.failures += 1;
                    tracing::warn!(error = %e, "cannot open a reading connection");
                    pause(shutdown, self.failures).await;
                    return Fill::Failed;
                }
            }
        }
        let Some(c) = self.conn.as_mut() else {
            return Fill::Failed;
        };
        let block = ctx.config.block.as_millis() as u64;
        let streams = [stream.clone()];
        let read = tokio::select! {
            r = read_group(c, self.group, &ctx.consumer, &streams, self.read_count, block) => r,
            _ = shutdown.changed() => return Fill::Shutdown,
        };
        match read {
            Ok(entries) => {
                self.failures = 0;
                self.buffer.extend(entries.into_iter().map(|(_, e)| (e, 1)));
                Fill::Read
            }
            Err(e) => {
                self.failures += 1;
                if matches!(&e, crate::store::StoreError::Redis(r) if r.code() == Some("NOGROUP")) {
                    // The stream or its group was deleted under us.
                    let _ = ctx.store.ensure_group(stream, self.group).await;
                }
                tracing::warn!(%stream, error = %e, "read failed");
                self.conn = None;
                pause(shutdown, self.failures).await;
                Fill::Failed
            }
        }
    }
}

/// How long finished entries wait to be acknowledged together: long enough
/// that a consumer settling a hundred entries a second acknowledges a few
/// per `XACK` (at 2 ms, W3's averaged under two), short against the
/// visibility timeout (an entry finished and not yet acknowledged is only
/// redelivered if the process dies meanwhile).
const ACK_WINDOW: Duration = Duration::from_millis(20);

/// Acknowledges finished entries in batches: one `XACK` carries every entry
/// finished within [`ACK_WINDOW`]. A crash in between only means a redelivery,
/// which every handler absorbs (idempotent keys).
///
/// Where Redis can lose acknowledged writes (the worker's durability waits:
/// `everysec`), an entry whose handling appended events is acknowledged only
/// while the last of them is still recorded (`ack_recorded.lua`): a restart
/// from disk between that event's answer and the `XACK` would otherwise
/// leave the entry done and its effect gone (a parked chunk or a recorded
/// group vanished), and its batch would never end.
#[derive(Clone)]
pub(crate) struct Acker {
    tx: tokio::sync::mpsc::UnboundedSender<(String, Option<LastAppended>)>,
}

impl Acker {
    /// Starts the flusher for `stream`; it ends when every `Acker` is dropped.
    pub(crate) fn spawn(
        store: crate::store::Store,
        stream: String,
        group: &'static str,
    ) -> (Acker, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Option<LastAppended>)>();
        let flusher = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                tokio::time::sleep(ACK_WINDOW).await;
                let mut acks = vec![first];
                while let Ok(ack) = rx.try_recv() {
                    acks.push(ack);
                }
                for part in acks.chunks(500) {
                    if let Err(e) = flush(&store, &stream, group, part).await {
                        // They stay pending and come back after the
                        // visibility timeout: handled again, harmlessly.
                        tracing::warn!(%stream, n = part.len(), error = %e, "acknowledgement failed");
                    }
                }
            }
        });
        (Acker { tx }, flusher)
    }

    /// Queues an acknowledgement of entry `id`, made only while `after`,
    /// the last event its handling appended, is still recorded (None:
    /// unconditional).
    pub(crate) fn ack(&self, id: &str, after: Option<LastAppended>) -> bool {
        self.tx.send((id.to_string(), after)).is_ok()
    }
}

/// Acknowledges `acks`: with one `XACK` when none has a condition, else
/// through `ack_recorded.lua`, counting the entries it leaves pending.
async fn flush(
    store: &crate::store::Store,
    stream: &str,
    group: &str,
    acks: &[(String, Option<LastAppended>)],
) -> crate::store::StoreResult<()> {
    if acks.iter().all(|(_, after)| after.is_none()) {
        let ids: Vec<String> = acks.iter().map(|(id, _)| id.clone()).collect();
        store.ack_all(stream, group, &ids).await?;
        return Ok(());
    }
    let kept = store.ack_recorded(stream, group, acks).await?;
    if !kept.is_empty() {
        metrics::counter!("groupcast_acks_withheld_total").increment(kept.len() as u64);
        tracing::error!(
            %stream, n = kept.len(), example = %kept[0],
            "entries left pending: the last event their handling appended is gone (Redis lost acknowledged writes?); they are handled again"
        );
    }
    Ok(())
}

async fn pause(shutdown: &mut watch::Receiver<bool>, failures: u32) {
    let d = Duration::from_millis(100 * u64::from(failures.min(30)));
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = shutdown.changed() => {}
    }
}

/// Where an entry was read: its stream, of `source` on `shard`'s `lane`.
pub(crate) struct At<'a> {
    /// The kind of stream.
    pub source: Source,
    /// The shard.
    pub shard: u32,
    /// The lane.
    pub lane: Priority,
    /// The stream's key.
    pub stream: &'a str,
}

/// Handles and finishes one entry.
pub(crate) async fn process(ctx: &Ctx, acker: &Acker, at: &At<'_>, entry: Entry, deliveries: u64) {
    let (source, shard, lane, stream) = (at.source, at.shard, at.lane, at.stream);
    let group = source.group();
    if deliveries > ctx.config.max_deliveries {
        let reason =
            format!("delivered {deliveries} times without being finished (a poison entry?)");
        finish_entry(
            ctx,
            acker,
            at,
            &entry,
            Handled::new(Outcome::Dead(reason)),
            deliveries,
            None,
        )
        .await;
        return;
    }
    ctx.in_flight(source.label(), 1);
    let handling = async {
        match source {
            Source::Ingest => loader::handle(ctx, shard, lane, &entry).await,
            Source::Work => operator::handle(ctx, lane, &entry).await,
        }
    };
    let (handled, appended) =
        witness::noting_appended(renewing_lease(ctx, stream, group, &entry.id, handling)).await;
    ctx.in_flight(source.label(), -1);
    // What the acknowledgement waits on, where Redis can lose what it
    // acknowledged (see `Acker`).
    let appended = appended.filter(|_| ctx.config.durable.waits());
    match handled {
        Ok(h) => finish_entry(ctx, acker, at, &entry, h, deliveries, appended).await,
        Err(e) => {
            // Redis trouble: leave the entry pending; it is reclaimed after
            // the visibility timeout (by us or by another consumer).
            tracing::warn!(%stream, id = %entry.id, error = %e, group, "entry left pending");
            metrics::counter!("groupcast_entries_left_pending_total", "stream" => source.label())
                .increment(1);
        }
    }
}

/// Runs `handling` while renewing the entry's lease every
/// [`lease_renewal`](crate::worker::WorkerConfig::lease_renewal): a slow
/// provider call (up to its request timeout, several in a row for a big
/// chunk) must not leave the entry idle past the visibility timeout, or
/// another consumer would reclaim it and run it a second time meanwhile.
/// Entries handled quicker than that cost nothing more.
async fn renewing_lease<T>(
    ctx: &Ctx,
    stream: &str,
    group: &str,
    id: &str,
    handling: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(handling);
    let every = ctx.config.lease_renewal();
    loop {
        tokio::select! {
            out = &mut handling => return out,
            _ = tokio::time::sleep(every) => {
                if let Err(e) = ctx.store.renew_lease(stream, group, &ctx.consumer, id).await {
                    tracing::warn!(%stream, %id, error = %e, "could not renew the entry's lease");
                }
            }
        }
    }
}

/// Finishes an entry as `handled` says: acknowledged, retried later, or
/// dead-lettered. On Redis trouble it stays pending.
async fn finish_entry(
    ctx: &Ctx,
    acker: &Acker,
    at: &At<'_>,
    entry: &Entry,
    handled: Handled,
    deliveries: u64,
    appended: Option<LastAppended>,
) {
    let (shard, stream) = (at.shard, at.stream);
    let group = at.source.group();
    let result = match handled.outcome {
        Outcome::Done => {
            if acker.ack(&entry.id, appended.clone()) {
                Ok(())
            } else {
                flush(&ctx.store, stream, group, &[(entry.id.clone(), appended)]).await
            }
        }
        Outcome::Retry {
            delay,
            spend,
            cause,
            reason,
        } => match handled.retry_as {
            Some((op, mut item, chunk)) => {
                let now = if retry::needs_clock(cause) {
                    // The shard server's clock: the one that started the
                    // item's budget, whichever worker that was.
                    match ctx.store.time_ms_at(&ctx.store.keys.delayed(shard)).await {
                        Ok(now) => Some(now),
                        Err(e) => {
                            tracing::warn!(%stream, id = %entry.id, error = %e, "could not finish entry; it stays pending");
                            return;
                        }
                    }
                } else {
                    None
                };
                match retry::decide(
                    &ctx.config,
                    op,
                    &mut item,
                    delay,
                    spend,
                    cause,
                    &reason,
                    now,
                ) {
                    retry::Decision::GiveUp(reason) => {
                        let load = (op, &item, chunk.as_deref());
                        dead_letter_giving_up(
                            ctx,
                            at,
                            entry,
                            &reason,
                            deliveries,
                            Some(load),
                            appended,
                        )
                        .await
                    }
                    retry::Decision::Retry(delay) => {
                        let retry = (op, item, chunk);
                        retry_later(ctx, at, entry, retry, delay, cause, &reason).await
                    }
                }
            }
            None => dead_letter(ctx, at, entry, &reason, deliveries, appended).await,
        },
        Outcome::Dead(reason) => {
            let load =
                (handled.retry_as.as_ref()).map(|(op, item, chunk)| (*op, item, chunk.as_deref()));
            dead_letter_giving_up(ctx, at, entry, &reason, deliveries, load, appended).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(%stream, id = %entry.id, error = %e, "could not finish entry; it stays pending");
    }
}

/// Moves `entry` to the delayed set, due in `delay`, as `retry` (op, item,
/// chunk) (`retry_later.lua`).
async fn retry_later(
    ctx: &Ctx,
    at: &At<'_>,
    entry: &Entry,
    retry: (Op, WorkItem, Option<Vec<u8>>),
    delay: Duration,
    cause: RetryCause,
    reason: &str,
) -> crate::store::StoreResult<()> {
    let (shard, lane, stream) = (at.shard, at.lane, at.stream);
    let keys = &ctx.store.keys;
    let (op, item, chunk) = retry;
    metrics::counter!("groupcast_retries_total", "op" => op.name(), "reason" => cause.label())
        .increment(1);
    let reason = crate::redact::text(reason);
    tracing::debug!(op = op.name(), attempt = item.attempt, ?delay, %reason, "retry later");
    // A wait that shows the batch alive (a poll, a limiter
    // or durability wait) refreshes its heartbeat in the
    // same step, so the watchdog does not call it stalled.
    // A held send stamps its due time: the batch is not
    // quiet before then.
    let state = cause
        .is_heartbeat()
        .then(|| ctx.store.keys.batch(&item.batch).state);
    let alive = state.as_deref().map(|state| Alive {
        state,
        until_due: cause == RetryCause::Scheduled,
    });
    let load_state = keys.batch(&item.batch).state;
    let load = load_holds(ctx.config.durable.waits(), op, &item, &load_state);
    let delayed = DelayedEntry {
        op: op.name().into(),
        d: encode_payload(&item),
        c: chunk,
        lane,
    };
    match ctx
        .store
        .retry_later(
            &keys.delayed(shard),
            stream,
            at.source.group(),
            &entry.id,
            delay.as_millis() as u64,
            &delayed,
            alive,
            load,
        )
        .await?
    {
        Rescheduled::Scheduled => {}
        Rescheduled::LoadGone => {
            metrics::counter!("groupcast_chunks_total", "outcome" => "stale").increment(1);
            tracing::warn!(
                %stream, id = %entry.id, batch = %item.batch, gen = item.gen, seq = ?item.seq,
                "the load to retry lost its chunk's assignment or group (lost Redis writes?): the entry stays pending, to be handled again"
            );
        }
    }
    Ok(())
}

/// What a retried load's rescheduling checks still holds, if anything.
/// A load retried while adds wait for durability (`durable_waits`) is
/// written only while its chunk's assignment and group still hold (see
/// `LoadHolds`): a restart from disk between the load's read and here may
/// have taken them.
fn load_holds<'a>(
    durable_waits: bool,
    op: Op,
    item: &'a WorkItem,
    state: &'a str,
) -> Option<LoadHolds<'a>> {
    match (op, item.seq, item.group_id.as_deref()) {
        (Op::Load, Some(seq), Some(group_id)) if durable_waits => Some(LoadHolds {
            state,
            seq,
            gen: item.gen,
            group: group_id,
        }),
        _ => None,
    }
}

/// Dead-letters `entry`, whose item `load` names (op, item, chunk). A load
/// that ends in the dead letters also ends its chunk: recorded as given up
/// (see [`load_chunk::give_up`]) before the entry is dead-lettered, so that
/// the generation and the batch still end; a create ends its generation
/// the same way ([`create_group::give_up`]), and a send, poll or recall
/// ends its generation `unsent` or `unknown` ([`recall_send::give_up`]).
/// The dead letter waits on the
/// give-up's event, else on `appended` (the handling's last), like an
/// acknowledgement; a give-up that cannot be recorded leaves the entry
/// pending.
async fn dead_letter_giving_up(
    ctx: &Ctx,
    at: &At<'_>,
    entry: &Entry,
    reason: &str,
    deliveries: u64,
    load: Option<(Op, &WorkItem, Option<&[u8]>)>,
    appended: Option<LastAppended>,
) -> crate::store::StoreResult<()> {
    let (recorded, gave_up) = witness::noting_appended(async {
        match load {
            Some((Op::Load, item, Some(bytes))) => {
                load_chunk::give_up(ctx, at.lane, item, bytes, reason).await
            }
            Some((Op::Create, item, _)) => create_group::give_up(ctx, at.lane, item, reason).await,
            Some((op @ (Op::Send | Op::Poll | Op::Recall), item, _)) => {
                recall_send::give_up(ctx, at.lane, op, item, reason).await
            }
            _ => Ok(()),
        }
    })
    .await;
    if let Err(e) = recorded {
        tracing::warn!(stream = %at.stream, id = %entry.id, error = %e, "could not record the given-up chunk; the entry stays pending");
        return Ok(());
    }
    let gave_up = gave_up.filter(|_| ctx.config.durable.waits());
    dead_letter(ctx, at, entry, reason, deliveries, gave_up.or(appended)).await
}

/// Dead-letters `entry`; with `after` (the last event its handling, or the
/// give-up of its chunk, appended), only while that event is still
/// recorded, else the entry stays pending (see [`Acker`]).
async fn dead_letter(
    ctx: &Ctx,
    at: &At<'_>,
    entry: &Entry,
    reason: &str,
    deliveries: u64,
    after: Option<LastAppended>,
) -> crate::store::StoreResult<()> {
    let (source, shard, stream) = (at.source, at.shard, at.stream);
    // Reasons quote input; whatever quoted it, a reason stays short. A URL
    // in it (a reqwest error names one) loses its userinfo and query, where
    // people put tokens: dead letters are shown by the board to anyone.
    let reason = &crate::events::clip(&crate::redact::text(reason), 32 * crate::events::QUOTE_MAX);
    let mut fields = vec![
        ("reason".to_string(), reason.as_bytes().to_vec()),
        ("source".to_string(), stream.as_bytes().to_vec()),
        ("entry".to_string(), entry.id.as_bytes().to_vec()),
        (
            "deliveries".to_string(),
            deliveries.to_string().into_bytes(),
        ),
        ("consumer".to_string(), ctx.consumer.as_bytes().to_vec()),
    ];
    for (f, v) in &entry.fields {
        fields.push((format!("f:{f}"), v.clone()));
    }
    let written = ctx
        .store
        .dead_letter(
            &ctx.store.keys.dead_letters(shard),
            stream,
            source.group(),
            &entry.id,
            &fields,
            after.as_ref(),
        )
        .await?;
    if written.is_some() {
        tracing::warn!(%stream, id = %entry.id, %reason, "dead-lettered");
        metrics::counter!("groupcast_dead_letters_total", "stream" => source.label()).increment(1);
    } else {
        metrics::counter!("groupcast_acks_withheld_total").increment(1);
        tracing::error!(
            %stream, id = %entry.id, %reason,
            "entry left pending instead of dead-lettered: the last event its handling appended is gone (Redis lost acknowledged writes?); it is handled again"
        );
    }
    Ok(())
}
