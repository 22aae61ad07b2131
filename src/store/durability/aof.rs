//! Waiting until Redis has events on disk, exactly: `WAITAOF`, group-committed.
//!
//! `WAITAOF numlocal numreplicas timeout` (Redis and Valkey 7.2 and newer)
//! blocks until every write *the calling connection* made before it is
//! fsynced to the local AOF (`numlocal` 1) and acknowledged by `numreplicas`
//! replicas. It waits for the connection's own last write offset, not for
//! the writes of other connections, and a connection that wrote nothing
//! returns at once. An add or a send relies on events that other processes
//! may have appended (the `ready` of a generation, the group record), so a
//! `WAITAOF` alone, on whatever connection, proves nothing about them.
//!
//! What makes it cover them: every round runs, on one dedicated connection
//! and in this order, (1) an `HMGET` of the facts relied on (the entry id
//! each idempotency key holds in the batch's state hash; one `HMGET` per
//! hash), (2) a write (`SET` of a marker key), (3) `WAITAOF`. Redis runs one
//! connection's commands in order, so when (1) finds a fact, the event is in
//! that server's dataset, and its write is earlier in the server's one
//! replication stream than the marker write of (2). The AOF is that stream in
//! that order, and `WAITAOF` returns when the fsynced (or
//! replica-acknowledged) offset has reached the marker's offset: an fsync
//! covers the file up to a point, so everything before the marker, every fact
//! found in (1), is on disk too. The three commands are one pipeline on a
//! connection that never reconnects on its own: if Redis restarts in between
//! (and may have lost a fact), the connection is gone and the round fails as
//! a whole; a fact is never read in one server lifetime and confirmed in the
//! next. A fact not found (or under another entry id) in (1) is answered
//! [`Fsync::Gone`]: Redis lost it.
//!
//! Group commit: a round (one pipeline, one `WAITAOF`) carries every waiter
//! queued when it starts. While one is in flight the next starts when a
//! round ends or 100 ms after the last one started (up to 12 in flight,
//! each on its own connection): under `appendfsync everysec` a round takes
//! until the next fsync (at most about a second), so with a single round in
//! flight a waiter that arrived just after its marker waited for it and
//! then for one more fsync, up to two seconds. Each round's argument below
//! is its own: its reads, its marker, its connection.
//!
//! Single servers only: on a cluster the facts of different batches live on
//! different masters, and `WAITAOF` answers for one node.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use crate::store::{RedisTarget, StoreError, StoreResult};

/// How long one `WAITAOF` waits before it answers what it has: longer than
/// `everysec` takes to fsync, including a slow fsync's postponement.
pub const WAITAOF_TIMEOUT: Duration = Duration::from_secs(3);

/// How long the marker key lives after the last round (it only has to be
/// written, never read).
const MARKER_TTL_MS: u64 = 60_000;

/// One fact an add or a send relies on: the event appended under an
/// idempotency key, as the batch's state hash records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// The batch's state hash.
    pub state: String,
    /// Its field `k:<event key>`.
    pub field: String,
    /// The entry id the event was appended as.
    pub id: String,
}

/// What a wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// Every fact is on disk (and on the replicas asked for).
    Durable,
    /// A fact is not there any more (or under another entry id): Redis lost
    /// acknowledged writes. Nothing may rest on it.
    Gone,
    /// The facts are there, but not confirmed on disk within
    /// [`WAITAOF_TIMEOUT`] (a slow disk, replicas missing): wait again.
    NotYet,
}

struct Request {
    facts: Vec<Fact>,
    reply: oneshot::Sender<Result<Fsync, String>>,
}

/// The process's group-committing `WAITAOF` waiter (see the module docs).
pub struct AofWaiter {
    target: RedisTarget,
    marker: String,
    replicas: u32,
    rounds: OnceLock<mpsc::UnboundedSender<Request>>,
}

impl AofWaiter {
    /// A waiter on `target`'s server, writing its marker to `marker`,
    /// asking for `replicas` replica acknowledgements. The round task starts
    /// with the first wait (inside the runtime).
    pub fn new(target: RedisTarget, marker: String, replicas: u32) -> AofWaiter {
        AofWaiter {
            target,
            marker,
            replicas,
            rounds: OnceLock::new(),
        }
    }

    /// Waits until every fact in `facts` is on disk, or finds one gone.
    /// An error is a round that failed (Redis away or restarting): retryable.
    pub async fn wait(&self, facts: Vec<Fact>) -> StoreResult<Fsync> {
        let tx = self.rounds.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(rounds(
                self.target.clone(),
                self.marker.clone(),
                self.replicas,
                rx,
            ));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let gone = || unavailable("the WAITAOF round task stopped".into());
        tx.send(Request { facts, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?.map_err(unavailable)
    }
}

/// A failed round as a retryable error (the waiter tries again later).
fn unavailable(reason: String) -> StoreError {
    StoreError::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("waiting for the AOF fsync: {reason}"),
    )))
}

/// Rounds in flight at once, at most (each on a dedicated connection).
const ROUNDS_IN_FLIGHT: usize = 12;

/// While a round is in flight, the next one starts when one ends or this
/// long after the last one started, whichever comes first: a waiter that
/// arrives just after a round's marker waits for the next fsync, not for
/// that round and then one more (up to two seconds under `everysec`).
const ROUND_GAP: Duration = Duration::from_millis(100);

/// The round task: takes every waiter queued, runs one round for them all,
/// answers them, and starts over, with up to [`ROUNDS_IN_FLIGHT`] rounds in
/// flight ([`ROUND_GAP`]). Runs until the waiter is dropped.
async fn rounds(
    target: RedisTarget,
    marker: String,
    replicas: u32,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    // Idle connections; one that failed is dropped, never reused: the next
    // round opens a new one (and reads the facts again).
    let idle = std::sync::Arc::new(std::sync::Mutex::new(Vec::<MultiplexedConnection>::new()));
    let mut in_flight = tokio::task::JoinSet::new();
    let mut last_start: Option<tokio::time::Instant> = None;
    let mut n: u64 = 0;
    while let Some(first) = rx.recv().await {
        // Reap the rounds that ended.
        while in_flight.try_join_next().is_some() {}
        if !in_flight.is_empty() {
            let gap_ends = last_start.map_or_else(tokio::time::Instant::now, |t| t + ROUND_GAP);
            if in_flight.len() >= ROUNDS_IN_FLIGHT {
                in_flight.join_next().await;
            } else {
                tokio::select! {
                    _ = in_flight.join_next() => {}
                    _ = tokio::time::sleep_until(gap_ends) => {}
                }
            }
        }
        let mut round = vec![first];
        while let Ok(more) = rx.try_recv() {
            round.push(more);
        }
        n += 1;
        last_start = Some(tokio::time::Instant::now());
        let (target, marker, idle) = (target.clone(), marker.clone(), idle.clone());
        in_flight.spawn(async move {
            let mut conn = idle.lock().ok().and_then(|mut v| v.pop());
            let result = run_round(&target, &mut conn, &marker, n, replicas, &round).await;
            if let (Ok(_), Some(c)) = (&result, conn) {
                if let Ok(mut v) = idle.lock() {
                    v.push(c);
                }
            }
            match result {
                Ok(answers) => {
                    for (req, a) in round.into_iter().zip(answers) {
                        let _ = req.reply.send(Ok(a));
                    }
                }
                Err(e) => {
                    let reason = e.to_string();
                    for req in round {
                        let _ = req.reply.send(Err(reason.clone()));
                    }
                }
            }
        });
    }
}

/// Appends to `pipe` a write of `marker` (value `n`) and the `WAITAOF` for
/// it: the fsync the reply confirms covers the marker and everything the
/// server took before it.
fn mark_then_wait(pipe: &mut redis::Pipeline, marker: &str, n: u64, replicas: u32) {
    pipe.cmd("SET")
        .arg(marker)
        .arg(n)
        .arg("PX")
        .arg(MARKER_TTL_MS)
        .ignore();
    pipe.cmd("WAITAOF")
        .arg(1)
        .arg(replicas)
        .arg(WAITAOF_TIMEOUT.as_millis() as u64);
}

async fn run_round(
    target: &RedisTarget,
    conn: &mut Option<MultiplexedConnection>,
    marker: &str,
    n: u64,
    replicas: u32,
    round: &[Request],
) -> StoreResult<Vec<Fsync>> {
    let c = match conn {
        Some(c) => c,
        None => conn.insert(target.connect_dedicated(WAITAOF_TIMEOUT * 2).await?),
    };
    // One HMGET per state hash for every fact the round's waiters rely on
    // in it (the facts of one batch share its state hash: a round of a big
    // batch reads them all in one command).
    let reads = reads_by_state(round);
    let mut pipe = redis::pipe();
    for (state, fields) in &reads {
        pipe.cmd("HMGET").arg(*state).arg(fields);
    }
    // The write whose offset the WAITAOF waits for: after every read above.
    mark_then_wait(&mut pipe, marker, n, replicas);
    let mut replies: Vec<Value> = pipe.query_async(c).await?;
    let acks = replies.pop().ok_or_else(|| StoreError::UnexpectedReply {
        script: "WAITAOF",
        reply: "no reply".into(),
    })?;
    let (local, remote): (i64, i64) =
        redis::from_redis_value(acks.clone()).map_err(|_| StoreError::UnexpectedReply {
            script: "WAITAOF",
            reply: format!("{acks:?}"),
        })?;
    let synced = local >= 1 && remote >= i64::from(replicas);
    // What each (state, field) holds now: absent when not there.
    let mut now: HashMap<(&str, &str), String> = HashMap::new();
    for ((state, fields), reply) in reads.iter().zip(replies) {
        let values: Vec<Option<String>> =
            redis::from_redis_value(reply.clone()).map_err(|_| StoreError::UnexpectedReply {
                script: "HMGET",
                reply: format!("{reply:?}"),
            })?;
        for (field, value) in fields.iter().zip(values) {
            if let Some(v) = value {
                now.insert((*state, *field), v);
            }
        }
    }
    Ok(round
        .iter()
        .map(|req| {
            let holds = req.facts.iter().all(|f| {
                now.get(&(f.state.as_str(), f.field.as_str()))
                    .map(String::as_str)
                    == Some(f.id.as_str())
            });
            match (holds, synced) {
                (false, _) => Fsync::Gone,
                (true, true) => Fsync::Durable,
                (true, false) => Fsync::NotYet,
            }
        })
        .collect())
}

/// The fields a round reads, by state hash (each field once), in the order
/// the waiters named them.
fn reads_by_state(round: &[Request]) -> Vec<(&str, Vec<&str>)> {
    let mut reads: Vec<(&str, Vec<&str>)> = Vec::new();
    // Where each state hash is in `reads`, and the fields already asked for.
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for f in round.iter().flat_map(|r| &r.facts) {
        if !seen.insert((&f.state, &f.field)) {
            continue;
        }
        let i = *at.entry(&f.state).or_insert_with(|| {
            reads.push((&f.state, Vec::new()));
            reads.len() - 1
        });
        reads[i].1.push(&f.field);
    }
    reads
}

/// How long `WAITAOF 1 0` takes to confirm a write made right after
/// another write was confirmed, the shortest of `tries` trials. Under
/// `appendfsync everysec` fsyncs are at least a second apart, so an honest
/// server takes most of a second; a server that confirms writes before they
/// are fsynced (redis/redis#13793: a flush with an empty AOF buffer marks
/// everything fsynced; Valkey 8.1.8 and 9.1.2 do it, measured) answers in a
/// tick (about 100 ms). On a dedicated connection; writes `marker`.
pub(crate) async fn confirmation_delay(
    target: &RedisTarget,
    marker: &str,
    tries: u32,
) -> StoreResult<Duration> {
    let conn = target.connect_dedicated(WAITAOF_TIMEOUT * 2).await?;
    let mut shortest = WAITAOF_TIMEOUT;
    let confirm = |n: u32| {
        let mut pipe = redis::pipe();
        mark_then_wait(&mut pipe, marker, u64::from(n), 0);
        let mut c = conn.clone();
        async move { pipe.query_async::<Vec<(i64, i64)>>(&mut c).await }
    };
    // Right after a confirmation (an fsync, on an honest server).
    confirm(0).await?;
    for n in 1..=tries {
        let started = std::time::Instant::now();
        confirm(n).await?;
        shortest = shortest.min(started.elapsed());
    }
    Ok(shortest)
}
