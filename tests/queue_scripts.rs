//! The queue scripts that have no Rust mirror in `src/protocol/`
//! (`retry_later.lua`, `promote.lua`, `ack_recorded.lua`, `dead_letter.lua`,
//! `lease.lua`, `release.lua`, `renew_lease.lua`, `restore.lua`,
//! `learn_rate.lua`) held to the
//! contracts their headers document, on a real redis-server, called through
//! the store's own methods as the worker calls them.
//!
//! The scripts with state between calls (the delayed set, the work streams,
//! the dead letters, a consumer group's pending entries, a batch's `alive`)
//! run long random sequences against a small model here, compared after
//! every step; the others get targeted cases.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use groupcast::events::{BatchStalled, Event};
use groupcast::keys::Priority;
use groupcast::store::batch::{BatchLog, Rebuilt};
use groupcast::store::clock::RedisClock;
use groupcast::store::durability::witness::LastAppended;
use groupcast::store::queue::{read_group, Alive, DelayedEntry, LoadHolds, Rescheduled};
use groupcast::store::scripts::SCRIPTS;
use groupcast::store::Store;
use groupcast::worker::maintenance::promote_due;
use groupcast_rigs::redis_server::RedisServer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

/// Random runs, and steps in each (on a fresh keyspace).
const RUNS: u64 = 40;
const STEPS: usize = 60;
/// The consumer group and consumer the deliveries go to.
const GROUP: &str = "loaders";
const CONSUMER: &str = "c1";
const HOUR: u64 = 3_600_000;
/// The batches whose state hashes the calls name.
const BATCHES: [&str; 2] = ["qa", "qb"];

/// A work entry as `promote.lua` writes it: `op`, `d`, and `c` when not
/// empty.
type Work = (String, Vec<u8>, Option<Vec<u8>>);

/// A stream entry's fields.
type Fields = Vec<(String, Vec<u8>)>;

/// What the scripts keep, as the contracts say it evolves.
#[derive(Default)]
struct Model {
    /// Delayed set: member → due (ms, the Redis clock).
    delayed: BTreeMap<Vec<u8>, u64>,
    /// The work streams, by lane in [`Priority::ALL`] order.
    work: [Vec<Work>; 3],
    /// Ids delivered to the group and not acknowledged.
    pending: BTreeSet<String>,
    /// Every id ever delivered.
    delivered: Vec<String>,
    /// The dead letters: id and fields.
    dlq: Vec<(String, Fields)>,
    /// The batches' state hashes.
    states: [BTreeMap<String, String>; 2],
    /// How often each decision of the contracts was reached.
    reached: BTreeMap<&'static str, usize>,
}

impl Model {
    fn reach(&mut self, decision: &'static str) {
        *self.reached.entry(decision).or_default() += 1;
    }

    fn batch_of(&self, state_key: &str, store: &Store) -> usize {
        BATCHES
            .iter()
            .position(|b| store.batch(b).keys.state == state_key)
            .expect("a state of the test's batches")
    }

    /// Whether the event under `key` is recorded as entry `id` in `state`.
    fn recorded(&self, store: &Store, a: &LastAppended) -> bool {
        let b = self.batch_of(&a.state, store);
        self.states[b].get(&format!("k:{}", a.key)) == Some(&a.id)
    }
}

/// A state change made by the other scripts (accept, record_group, any
/// append), written directly: the scripts here only read these fields.
#[derive(Debug, Clone)]
enum StateChange {
    Delete,
    Set(String, String),
    /// Chunk `seq` assigned to generation `gen`, whose group is recorded
    /// (what accept.lua and record_group.lua leave).
    Assign(u32, u32),
}

/// One step of a run.
#[derive(Debug, Clone)]
enum Step {
    /// A new entry on the source stream, read by the consumer.
    Deliver,
    RetryLater {
        id: String,
        delay: u64,
        entry: DelayedEntry,
        batch: usize,
        /// None: no heartbeat; Some(until_due).
        alive: Option<bool>,
        /// A load's seq, gen and group.
        load: Option<(u32, u32, String)>,
    },
    /// A member written directly, due `offset` ms from the Redis clock: an
    /// unreadable one, a past-due one, or ties.
    Member {
        member: Vec<u8>,
        offset: i64,
    },
    Promote {
        limit: usize,
    },
    DeadLetter {
        id: String,
        fields: Fields,
        after: Option<LastAppended>,
    },
    AckRecorded {
        acks: Vec<(String, Option<LastAppended>)>,
    },
    State {
        batch: usize,
        change: StateChange,
    },
}

/// The lane a member's lane name puts it on (`promote.lua`: urgent, bulk,
/// anything else normal), as an index in [`Priority::ALL`].
fn lane_index(name: &[u8]) -> usize {
    let lane = match name {
        b"urgent" => Priority::Urgent,
        b"bulk" => Priority::Bulk,
        _ => Priority::Normal,
    };
    Priority::ALL
        .iter()
        .position(|p| *p == lane)
        .expect("a lane")
}

/// `promote.lua`'s reading of a member, `^([a-z_]+)@?([a-z]*)|(%d+)|`:
/// its lane and work entry, or None when unreadable.
fn parse_member(m: &[u8]) -> Option<(usize, Work)> {
    let op_end = m
        .iter()
        .position(|c| !(c.is_ascii_lowercase() || *c == b'_'))?;
    if op_end == 0 {
        return None;
    }
    let mut at = op_end;
    if m.get(at) == Some(&b'@') {
        at += 1;
    }
    let lane_end = at
        + m[at..]
            .iter()
            .take_while(|c| c.is_ascii_lowercase())
            .count();
    let lane = &m[at..lane_end];
    at = lane_end;
    if m.get(at) != Some(&b'|') {
        return None;
    }
    at += 1;
    let digits = m[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || m.get(at + digits) != Some(&b'|') {
        return None;
    }
    let dlen: usize = std::str::from_utf8(&m[at..at + digits])
        .ok()?
        .parse()
        .ok()?;
    at += digits + 1;
    let split = (at + dlen).min(m.len());
    let op = String::from_utf8(m[..op_end].to_vec()).ok()?;
    let c = m[split..].to_vec();
    Some((
        lane_index(lane),
        (op, m[at..split].to_vec(), (!c.is_empty()).then_some(c)),
    ))
}

fn bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.random_range(0..=max);
    (0..n).map(|_| rng.random::<u8>()).collect()
}

/// An id to settle: usually one pending, sometimes one already settled.
fn some_id(rng: &mut StdRng, m: &Model) -> Option<String> {
    if !m.pending.is_empty() && rng.random_bool(0.8) {
        let i = rng.random_range(0..m.pending.len());
        return m.pending.iter().nth(i).cloned();
    }
    (!m.delivered.is_empty()).then(|| m.delivered[rng.random_range(0..m.delivered.len())].clone())
}

/// A condition on the last event appended: recorded as said, recorded under
/// another id, or not recorded.
fn some_after(rng: &mut StdRng, m: &Model, store: &Store) -> LastAppended {
    let b = rng.random_range(0..BATCHES.len());
    let state = store.batch(BATCHES[b]).keys.state.clone();
    let recorded: Vec<(&String, &String)> = m.states[b]
        .iter()
        .filter(|(f, _)| f.starts_with("k:"))
        .collect();
    if !recorded.is_empty() && rng.random_bool(0.6) {
        let (f, id) = recorded[rng.random_range(0..recorded.len())];
        let key = f.trim_start_matches("k:").to_string();
        let id = if rng.random_bool(0.8) {
            id.clone()
        } else {
            format!("{id}9")
        };
        return LastAppended { state, key, id };
    }
    LastAppended {
        state,
        key: format!("never/{}", rng.random_range(0..3)),
        id: "1-0".into(),
    }
}

/// A load's seq, gen and group for a retry: often what the batch's state
/// holds for one of its chunks (the load holds), else a drawn one (it
/// mostly does not).
fn load_of(rng: &mut StdRng, state: &BTreeMap<String, String>) -> (u32, u32, String) {
    let assigned: Vec<(u32, u32)> = state
        .iter()
        .filter_map(|(f, v)| {
            let seq = f.strip_prefix("s:")?.parse().ok()?;
            let gen = v.split('|').next()?.parse().ok()?;
            Some((seq, gen))
        })
        .collect();
    if !assigned.is_empty() && rng.random_bool(0.7) {
        let (seq, gen) = assigned[rng.random_range(0..assigned.len())];
        let group = state
            .get(&format!("g:{gen}:group"))
            .cloned()
            .unwrap_or_else(|| format!("G-{gen}"));
        return (seq, gen, group);
    }
    let gen = rng.random_range(0..3);
    let group = if rng.random_bool(0.8) {
        format!("G-{gen}")
    } else {
        "G-x".into()
    };
    (rng.random_range(0..3), gen, group)
}

fn pick(rng: &mut StdRng, m: &Model, store: &Store) -> Step {
    let id = some_id(rng, m);
    match (rng.random_range(0..100), id) {
        (0..15, _) | (_, None) => Step::Deliver,
        (15..40, Some(id)) => {
            let lane = Priority::ALL[rng.random_range(0..3)];
            // Every op a work item can have (`delivery_report` has an
            // underscore), and one no worker knows.
            let mut ops: Vec<&str> = groupcast::events::work_item::Op::ALL
                .iter()
                .map(|op| op.name())
                .collect();
            ops.push("add");
            let entry = DelayedEntry {
                op: ops[rng.random_range(0..ops.len())].into(),
                d: bytes(rng, 12),
                c: match rng.random_range(0..3) {
                    0 => None,
                    1 => Some(Vec::new()),
                    _ => Some(bytes(rng, 10)),
                },
                lane,
            };
            let batch = rng.random_range(0..BATCHES.len());
            let load = rng.random_bool(0.5).then(|| load_of(rng, &m.states[batch]));
            Step::RetryLater {
                id,
                // Due at once, or not before the run ends: never in between,
                // so that every promotion's outcome is exact.
                delay: if rng.random_bool(0.5) {
                    0
                } else {
                    HOUR + rng.random_range(0..1000)
                },
                entry,
                batch,
                alive: match rng.random_range(0..3) {
                    0 => None,
                    1 => Some(false),
                    _ => Some(true),
                },
                load,
            }
        }
        (40..48, _) => {
            let member: Vec<u8> = match rng.random_range(0..6) {
                0 => b"???".to_vec(),
                1 => b"Load|1|x".to_vec(),
                2 => b"load|x|y".to_vec(),
                3 => b"add@weird|1|xy".to_vec(),
                4 => b"send|9|abc".to_vec(),
                _ => {
                    let mut v = b"poll@bulk|2|".to_vec();
                    v.extend(bytes(rng, 5));
                    v
                }
            };
            let offset = match rng.random_range(0..3) {
                0 => -50_000, // ties, ordered by member
                1 => -rng.random_range(1..100_000),
                _ => (HOUR + rng.random_range(0..1000)) as i64,
            };
            Step::Member { member, offset }
        }
        (48..62, _) => Step::Promote {
            limit: rng.random_range(1..5),
        },
        (62..74, Some(id)) => {
            let mut fields = vec![("reason".to_string(), bytes(rng, 8))];
            if rng.random_bool(0.5) {
                fields.push(("f:op".into(), b"load".to_vec()));
            }
            Step::DeadLetter {
                id,
                fields,
                after: rng.random_bool(0.5).then(|| some_after(rng, m, store)),
            }
        }
        (74..84, _) => {
            let n = rng.random_range(0..4);
            let acks = (0..n)
                .filter_map(|_| {
                    let id = some_id(rng, m)?;
                    Some((id, rng.random_bool(0.6).then(|| some_after(rng, m, store))))
                })
                .collect();
            Step::AckRecorded { acks }
        }
        _ => {
            let batch = rng.random_range(0..BATCHES.len());
            let (seq, gen) = (rng.random_range(0..3u32), rng.random_range(0..3u32));
            let change = match rng.random_range(0..10) {
                0 => StateChange::Delete,
                1 => StateChange::Set("hb".into(), "1".into()),
                2 => StateChange::Set("report".into(), "completed".into()),
                3 => StateChange::Set(format!("s:{seq}"), format!("{gen}|10|x")),
                4 => StateChange::Assign(seq, gen),
                5 | 6 => {
                    // Mostly the group of a generation a chunk is assigned to.
                    let (_, gen, _) = load_of(rng, &m.states[batch]);
                    StateChange::Set(format!("g:{gen}:group"), format!("G-{gen}"))
                }
                _ => {
                    let keys = ["assign/0", "loaded/1/0", "group/2"];
                    let id = m.delivered.last().cloned().unwrap_or_else(|| "5-0".into());
                    StateChange::Set(format!("k:{}", keys[rng.random_range(0..keys.len())]), id)
                }
            };
            Step::State { batch, change }
        }
    }
}

/// The streams and keys of a run.
struct Keys {
    source: String,
    delayed: String,
    dlq: String,
    work: [String; 3],
}

impl Keys {
    fn of(store: &Store) -> Keys {
        let k = &store.keys;
        Keys {
            source: k.ingest(0),
            delayed: k.delayed(0),
            dlq: k.dead_letters(0),
            work: Priority::ALL.map(|lane| k.work_in(0, lane)),
        }
    }
}

/// Runs `step` on Redis and on the model; the replies must agree.
async fn apply(store: &Store, keys: &Keys, m: &mut Model, step: &Step) -> Result<(), String> {
    let mut conn = store.raw_conn();
    match step {
        Step::Deliver => {
            let id = deliver(store, keys, b"chunk").await;
            m.pending.insert(id.clone());
            m.delivered.push(id);
        }
        Step::RetryLater {
            id,
            delay,
            entry,
            batch,
            alive,
            load,
        } => {
            let state = store.batch(BATCHES[*batch]).keys.state.clone();
            let alive_arg = alive.map(|until_due| Alive {
                state: &state,
                until_due,
            });
            let load_arg = load.as_ref().map(|(seq, gen, group)| LoadHolds {
                state: &state,
                seq: *seq,
                gen: *gen,
                group,
            });
            let t0 = time(store).await;
            let r = store
                .retry_later(
                    &keys.delayed,
                    &keys.source,
                    GROUP,
                    id,
                    *delay,
                    entry,
                    alive_arg,
                    load_arg,
                )
                .await
                .map_err(|e| e.to_string())?;
            let t1 = time(store).await;
            let fields = &m.states[*batch];
            let holds = load.as_ref().is_none_or(|(seq, gen, group)| {
                let assigned = fields
                    .get(&format!("s:{seq}"))
                    .and_then(|s| s.split('|').next())
                    == Some(gen.to_string().as_str());
                assigned && fields.get(&format!("g:{gen}:group")) == Some(group)
            });
            if !holds {
                m.reach("retry: load gone");
                if r != Rescheduled::LoadGone {
                    return Err(format!(
                        "the load no longer holds: LoadGone expected, got {r:?}"
                    ));
                }
                return Ok(());
            }
            if r != Rescheduled::Scheduled {
                return Err(format!("the load holds: Scheduled expected, got {r:?}"));
            }
            let member = entry.encode();
            let score: Option<f64> = redis::cmd("ZSCORE")
                .arg(&keys.delayed)
                .arg(&member)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            let due = score.ok_or("the entry is not in the delayed set")? as u64;
            if !(t0 + delay..=t1 + delay).contains(&due) {
                return Err(format!(
                    "due {due}: not TIME + delay (TIME in [{t0}, {t1}], delay {delay})"
                ));
            }
            m.delayed.insert(member, due);
            m.pending.remove(id);
            m.reach(if load.is_some() {
                "retry: load holds"
            } else {
                "retry: scheduled"
            });
            let fields = &mut m.states[*batch];
            let decision = match alive {
                None => "alive: not asked",
                Some(_) if fields.is_empty() => "alive: no state",
                Some(_) if fields.contains_key("report") => "alive: reported",
                Some(until_due) => {
                    let stamp = if *until_due { due } else { due - delay };
                    fields.insert("alive".into(), stamp.to_string());
                    if *until_due {
                        "alive: due"
                    } else {
                        "alive: now"
                    }
                }
            };
            m.reach(decision);
        }
        Step::Member { member, offset } => {
            let now = time(store).await;
            let due = now.saturating_add_signed(*offset);
            let _: i64 = redis::cmd("ZADD")
                .arg(&keys.delayed)
                .arg(due)
                .arg(member)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            m.delayed.insert(member.clone(), due);
        }
        Step::Promote { limit } => {
            let t0 = time(store).await;
            let moved = store.promote(0, *limit).await.map_err(|e| e.to_string())?;
            let mut due: Vec<(u64, Vec<u8>)> = m
                .delayed
                .iter()
                .filter(|(_, d)| **d <= t0)
                .map(|(member, d)| (*d, member.clone()))
                .collect();
            if m.delayed.values().any(|d| *d > t0 && *d < t0 + HOUR / 2) {
                return Err("the generator made an entry due during the run".into());
            }
            due.sort();
            if due.len() > *limit {
                m.reach("promote: limit reached");
            }
            due.truncate(*limit);
            if moved != due.len() {
                return Err(format!("moved {moved}, expected {}", due.len()));
            }
            for (_, member) in due {
                m.delayed.remove(&member);
                match parse_member(&member) {
                    Some((lane, work)) => {
                        m.reach(["promote: urgent", "promote: normal", "promote: bulk"][lane]);
                        if work.2.is_some() {
                            m.reach("promote: with c");
                        }
                        m.work[lane].push(work)
                    }
                    None => {
                        m.reach("promote: invalid");
                        m.work[lane_index(b"normal")].push(("invalid".into(), member, None))
                    }
                }
            }
        }
        Step::DeadLetter { id, fields, after } => {
            let got = store
                .dead_letter(&keys.dlq, &keys.source, GROUP, id, fields, after.as_ref())
                .await
                .map_err(|e| e.to_string())?;
            let recorded = after.as_ref().is_none_or(|a| m.recorded(store, a));
            match (got, recorded) {
                (Some(dl), true) => {
                    m.reach(if after.is_some() {
                        "dead letter: event recorded"
                    } else {
                        "dead letter: unconditional"
                    });
                    m.dlq.push((dl, fields.clone()));
                    m.pending.remove(id);
                }
                (None, false) => m.reach("dead letter: event gone"),
                (got, _) => {
                    return Err(format!(
                        "dead letter {got:?}, while the event is recorded: {recorded}"
                    ))
                }
            }
        }
        Step::AckRecorded { acks } => {
            let kept = store
                .ack_recorded(&keys.source, GROUP, acks)
                .await
                .map_err(|e| e.to_string())?;
            let mut expected = Vec::new();
            for (id, after) in acks {
                if after.as_ref().is_none_or(|a| m.recorded(store, a)) {
                    m.reach("ack: acknowledged");
                    m.pending.remove(id);
                } else {
                    m.reach("ack: kept");
                    expected.push(id.clone());
                }
            }
            if kept != expected {
                return Err(format!("left pending {kept:?}, expected {expected:?}"));
            }
        }
        Step::State { batch, change } => {
            let state = store.batch(BATCHES[*batch]).keys.state.clone();
            match change {
                StateChange::Delete => {
                    let _: i64 = redis::cmd("DEL")
                        .arg(&state)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    m.states[*batch].clear();
                }
                StateChange::Set(f, v) => {
                    let _: i64 = redis::cmd("HSET")
                        .arg(&state)
                        .arg(f)
                        .arg(v)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    m.states[*batch].insert(f.clone(), v.clone());
                }
                StateChange::Assign(seq, gen) => {
                    let (s, g) = (format!("{gen}|10|x"), format!("G-{gen}"));
                    let _: i64 = redis::cmd("HSET")
                        .arg(&state)
                        .arg(format!("s:{seq}"))
                        .arg(&s)
                        .arg(format!("g:{gen}:group"))
                        .arg(&g)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    m.states[*batch].insert(format!("s:{seq}"), s);
                    m.states[*batch].insert(format!("g:{gen}:group"), g);
                }
            }
        }
    }
    Ok(())
}

/// Appends an entry with `d` to the source stream and delivers it to the
/// consumer; answers its id.
async fn deliver(store: &Store, keys: &Keys, d: &[u8]) -> String {
    store
        .enqueue(&keys.source, "load", d, None)
        .await
        .expect("xadd");
    let mut reader = store.blocking().await.expect("connect");
    let got = read_group(
        &mut reader,
        GROUP,
        CONSUMER,
        std::slice::from_ref(&keys.source),
        1,
        1,
    )
    .await
    .expect("xreadgroup");
    match got.as_slice() {
        [(_, entry)] => entry.id.clone(),
        _ => panic!("one delivery expected, got {got:?}"),
    }
}

/// A fresh server, a store on it, and the source stream's consumer group.
async fn rig() -> (RedisServer, Store, Keys) {
    let (server, store) = common::store(1).await;
    let keys = Keys::of(&store);
    store
        .ensure_group(&keys.source, GROUP)
        .await
        .expect("group");
    (server, store, keys)
}

/// A work entry without a chunk.
fn work_entry(op: &str, d: &[u8], lane: Priority) -> DelayedEntry {
    DelayedEntry {
        op: op.into(),
        d: d.to_vec(),
        c: None,
        lane,
    }
}

/// Delivers an entry and retries it as `entry` in `delay` ms, as a
/// handler's failure does.
async fn deliver_and_retry(
    store: &Store,
    keys: &Keys,
    entry: &DelayedEntry,
    delay: u64,
    alive: Option<Alive<'_>>,
) {
    let id = deliver(store, keys, &entry.d).await;
    let r = store
        .retry_later(
            &keys.delayed,
            &keys.source,
            GROUP,
            &id,
            delay,
            entry,
            alive,
            None,
        )
        .await
        .expect("retry_later");
    assert_eq!(r, Rescheduled::Scheduled);
}

/// The shard's Redis clock.
async fn time(store: &Store) -> u64 {
    store.shard_time_ms(0).await.expect("TIME")
}

/// Compares everything the scripts write with the model.
async fn compare(store: &Store, keys: &Keys, m: &Model) -> Result<(), String> {
    let mut conn = store.raw_conn();
    let err = |e: redis::RedisError| e.to_string();
    let delayed: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(&keys.delayed)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    let mut want: Vec<(u64, Vec<u8>)> = m.delayed.iter().map(|(k, d)| (*d, k.clone())).collect();
    want.sort();
    let got: Vec<(u64, Vec<u8>)> = delayed.into_iter().map(|(k, s)| (s as u64, k)).collect();
    if got != want {
        return Err(format!("delayed set:\n  redis {got:?}\n  model {want:?}"));
    }
    let next = store.next_due(0).await.map_err(|e| e.to_string())?;
    if next != want.first().map(|(d, _)| *d) {
        return Err(format!(
            "next_due {next:?}, the set's first {:?}",
            want.first()
        ));
    }
    for (lane, stream) in keys.work.iter().enumerate() {
        let mut got: Vec<Work> = Vec::new();
        for e in store.entries(stream).await.map_err(|e| e.to_string())? {
            let names: Vec<&str> = e.fields.iter().map(|(f, _)| f.as_str()).collect();
            let c = e.get("c").map(<[u8]>::to_vec);
            let expected: &[&str] = if c.is_some() {
                &["op", "d", "c"]
            } else {
                &["op", "d"]
            };
            if names != expected {
                return Err(format!("work entry {} has the fields {names:?}", e.id));
            }
            got.push((
                e.text("op").unwrap_or_default(),
                e.get("d").map(<[u8]>::to_vec).unwrap_or_default(),
                c,
            ));
        }
        if got != m.work[lane] {
            return Err(format!(
                "work stream {stream}:\n  redis {got:?}\n  model {:?}",
                m.work[lane]
            ));
        }
    }
    let dlq: Vec<(String, Fields)> = store
        .entries(&keys.dlq)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|e| (e.id, e.fields))
        .collect();
    if dlq != m.dlq {
        return Err(format!(
            "dead letters:\n  redis {dlq:?}\n  model {:?}",
            m.dlq
        ));
    }
    let pending = pending(store, &keys.source).await;
    let pending: BTreeSet<String> = pending.into_iter().map(|p| p.id).collect();
    if pending != m.pending {
        return Err(format!(
            "pending:\n  redis {pending:?}\n  model {:?}",
            m.pending
        ));
    }
    for (b, batch) in BATCHES.iter().enumerate() {
        let got = store
            .batch(batch)
            .state()
            .await
            .map_err(|e| e.to_string())?
            .fields;
        if got != m.states[b] {
            return Err(format!(
                "state of {batch}:\n  redis {got:?}\n  model {:?}",
                m.states[b]
            ));
        }
    }
    Ok(())
}

/// One pending entry of the group, as `XPENDING` details it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    id: String,
    consumer: String,
    idle_ms: u64,
    deliveries: u64,
}

async fn pending(store: &Store, stream: &str) -> Vec<Pending> {
    let rows: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(GROUP)
        .arg("-")
        .arg("+")
        .arg(10_000)
        .query_async(&mut store.raw_conn())
        .await
        .expect("xpending");
    rows.into_iter()
        .map(|(id, consumer, idle_ms, deliveries)| Pending {
            id,
            consumer,
            idle_ms,
            deliveries,
        })
        .collect()
}

/// retry_later, promote, dead_letter and ack_recorded, in random sequences
/// against the model: a retry acknowledges the delivery and schedules the
/// entry at the Redis clock plus its delay in one step, stamps `alive` (now
/// or the due time) only on a state that exists without a report, and
/// writes nothing when its load's assignment or group no longer holds;
/// promote moves exactly the due entries (earliest first, at most its
/// limit) to their lanes' streams with `op`, `d` and `c`, and an unreadable
/// member to the normal lane as `op=invalid`; a dead letter is written and
/// its entry acknowledged only while the `after` event is recorded under
/// that id; ack_recorded acknowledges exactly the entries whose condition
/// holds and answers the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delayed_queue_scripts_keep_their_contracts() {
    let server = common::redis();
    let mut seen = [0usize; 7];
    let mut reached: BTreeMap<&'static str, usize> = BTreeMap::new();
    for run in 0..RUNS {
        let keys_space = groupcast::keys::Keyspace::new(format!("q{run}"), 1);
        let store = Store::connect(&server.url(), keys_space)
            .await
            .expect("connect");
        let keys = Keys::of(&store);
        store
            .ensure_group(&keys.source, GROUP)
            .await
            .expect("group");
        let mut rng = StdRng::seed_from_u64(run);
        let mut m = Model::default();
        let mut trail: Vec<Step> = Vec::new();
        for _ in 0..STEPS {
            let step = pick(&mut rng, &m, &store);
            seen[match step {
                Step::Deliver => 0,
                Step::RetryLater { .. } => 1,
                Step::Member { .. } => 2,
                Step::Promote { .. } => 3,
                Step::DeadLetter { .. } => 4,
                Step::AckRecorded { .. } => 5,
                Step::State { .. } => 6,
            }] += 1;
            trail.push(step.clone());
            let checked = match apply(&store, &keys, &mut m, &step).await {
                Ok(()) => compare(&store, &keys, &m).await,
                Err(e) => Err(e),
            };
            if let Err(e) = checked {
                let last: Vec<String> = trail
                    .iter()
                    .rev()
                    .take(8)
                    .rev()
                    .map(|s| format!("{s:?}"))
                    .collect();
                panic!(
                    "run {run} (seed {run}), step {}: {e}\nlast steps:\n  {}",
                    trail.len(),
                    last.join("\n  ")
                );
            }
        }
        for (decision, n) in m.reached {
            *reached.entry(decision).or_default() += n;
        }
    }
    // Every decision of the contracts was reached, several times.
    let decisions = [
        "retry: load gone",
        "retry: load holds",
        "retry: scheduled",
        "alive: not asked",
        "alive: no state",
        "alive: reported",
        "alive: due",
        "alive: now",
        "promote: limit reached",
        "promote: urgent",
        "promote: normal",
        "promote: bulk",
        "promote: with c",
        "promote: invalid",
        "dead letter: event recorded",
        "dead letter: unconditional",
        "dead letter: event gone",
        "ack: acknowledged",
        "ack: kept",
    ];
    let rare: Vec<_> = decisions
        .iter()
        .filter(|d| reached.get(*d).copied().unwrap_or(0) < 10)
        .collect();
    assert!(
        rare.is_empty(),
        "reached too rarely: {rare:?}; all: {reached:?}"
    );
    eprintln!("decisions reached: {reached:?}");
    // Every kind of step was drawn many times.
    assert!(seen.iter().all(|n| *n > 50), "steps drawn: {seen:?}");
}

/// `alive` by retry_later, case by case: a state that is gone is not
/// created, a live one is stamped (here with the due time), a reported one
/// is left alone; every retry acknowledges its delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_later_stamps_alive_only_on_a_live_unreported_state() {
    let (_server, store, keys) = rig().await;
    let log = store.batch("alive");
    let state = log.keys.state.clone();
    let entry = |d: &[u8]| work_entry("poll", d, Priority::Bulk);
    let alive = || {
        let log = &log;
        async move { log.fields(&["alive".into()]).await.expect("hget")[0].clone() }
    };
    // No state: nothing stamped, and no state created.
    deliver_and_retry(&store, &keys, &entry(b"1"), HOUR, Some(Alive::now(&state))).await;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&state)
        .query_async(&mut store.raw_conn())
        .await
        .expect("exists");
    assert_eq!(exists, 0, "a retry must not create a batch's state");
    // A live state: stamped with the due time when asked.
    hset(&store, &state, &[("hb", "1")]).await;
    let until_due = Alive {
        state: &state,
        until_due: true,
    };
    deliver_and_retry(&store, &keys, &entry(b"2"), HOUR, Some(until_due)).await;
    let due: u64 = redis::cmd("ZSCORE")
        .arg(&keys.delayed)
        .arg(entry(b"2").encode())
        .query_async(&mut store.raw_conn())
        .await
        .expect("zscore");
    assert_eq!(alive().await, Some(due.to_string()));
    // Reported: left alone.
    hset(&store, &state, &[("report", "completed")]).await;
    deliver_and_retry(&store, &keys, &entry(b"3"), 0, Some(Alive::now(&state))).await;
    assert_eq!(alive().await, Some(due.to_string()));
    assert!(
        pending(&store, &keys.source).await.is_empty(),
        "every retry acknowledged its delivery"
    );
}

/// The maintenance pass promotes by the shard's Redis clock, read once and
/// carried forward: a due entry moves on the first look; one due in an hour
/// stays, and the pass asks to look again within its period rather than at
/// the due time of some other clock; looking again sends no `TIME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maintenance_pass_promotes_by_the_redis_clock() {
    let (_server, store, keys) = rig().await;
    let mut clock = RedisClock::new(keys.delayed.clone(), Duration::from_secs(3600));
    let later = work_entry("add", b"later", Priority::Urgent);
    deliver_and_retry(&store, &keys, &later, HOUR, None).await;
    let now = work_entry("add", b"now", Priority::Urgent);
    deliver_and_retry(&store, &keys, &now, 0, None).await;
    // Due by the Redis clock that stamped it: moved on the first look.
    let wake = promote_due(&store, 0, &mut clock).await.expect("pass");
    assert_eq!(wake, None, "the pass promoted: nothing to wait for");
    let urgent = store.entries(&keys.work[0]).await.expect("xrange");
    assert_eq!(urgent.len(), 1);
    assert_eq!(urgent[0].get("d"), Some(&b"now"[..]));
    assert!(store.next_due(0).await.expect("zrange").is_some());
    // Due in an hour by the Redis clock: stays, and the next look comes
    // within the loop's period, on the monotonic clock.
    let times = common::command_calls(&store, "time").await;
    let wake = promote_due(&store, 0, &mut clock)
        .await
        .expect("pass")
        .expect("an entry waits");
    assert!(wake <= Instant::now() + Duration::from_millis(100));
    assert_eq!(
        common::command_calls(&store, "time").await,
        times,
        "the clock is carried forward: no TIME on the next look"
    );
    assert_eq!(store.entries(&keys.work[0]).await.expect("xrange").len(), 1);
    // The estimate never runs ahead of the server's clock.
    let (estimate, _) = clock.now(&store).await.expect("clock");
    assert!(estimate <= time(&store).await);
}

/// learn_rate.lua: the first 429 sets the first rate; a 429 within the
/// least time between lowerings changes nothing; each later one halves the
/// rate, never below the lowest; the rate is kept for `kept` after the
/// last lowering (its TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_learned_rate_starts_at_the_first_rate_and_halves_once_per_period() {
    use groupcast::store::coord::RateLearning;
    let (_server, store) = common::store(1).await;
    let key = store.keys.learned_rate();
    let kept = Duration::from_secs(600);
    let once_an_hour = RateLearning {
        first: 300,
        lowest: 20,
        kept,
        between: Duration::from_secs(3600),
    };
    assert_eq!(store.learned_rate(&key).await.expect("hget"), None);
    assert_eq!(
        store.learn_rate(&key, &once_an_hour).await.expect("learn"),
        300
    );
    // Requests in flight when the rate was set come back 429 too: they say
    // nothing about the new rate.
    assert_eq!(
        store.learn_rate(&key, &once_an_hour).await.expect("learn"),
        300
    );
    assert_eq!(store.learned_rate(&key).await.expect("hget"), Some(300));
    let any_time = RateLearning {
        between: Duration::ZERO,
        ..once_an_hour
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(store.learn_rate(&key, &any_time).await.expect("learn"));
    }
    assert_eq!(
        seen,
        vec![150, 75, 37, 20, 20],
        "halved, down to the lowest"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut store.raw_conn())
        .await
        .expect("pttl");
    assert!(
        ttl > 0 && ttl <= kept.as_millis() as i64,
        "forgotten {kept:?} after the last lowering, not kept forever: {ttl} ms"
    );
}

/// lease.lua and release.lua: a random sequence of takes, releases,
/// expiries and shortened TTLs by three holders against the model "one
/// holder at most; the holder renews, nobody else takes it; only the holder
/// releases it".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_has_one_holder_and_only_the_holder_renews_or_releases_it() {
    let (_server, store) = common::store(1).await;
    let key = store.keys.watchdog_lock();
    let mut conn = store.raw_conn();
    let holders = ["w1", "w2", "w3"];
    let mut rng = StdRng::seed_from_u64(7);
    // The holder, and the TTL last set (ms).
    let mut model: Option<(&str, u64)> = None;
    let short = 5_000u64;
    let mut outcomes = BTreeSet::new();
    for step in 0..400 {
        let h = holders[rng.random_range(0..holders.len())];
        let what = match rng.random_range(0..10) {
            0..5 => {
                let ttl = [60_000u64, 120_000][rng.random_range(0..2)];
                let got = store.take_lease(&key, h, ttl).await.expect("lease");
                let expected = match model {
                    Some((holder, _)) if holder != h => false,
                    _ => {
                        model = Some((h, ttl));
                        true
                    }
                };
                assert_eq!(got, expected, "step {step}: take by {h}, model {model:?}");
                outcomes.insert(format!("take {expected}"));
                "take"
            }
            5..8 => {
                store.release_lease(&key, h).await.expect("release");
                if model.is_some_and(|(holder, _)| holder == h) {
                    model = None;
                    outcomes.insert("released".to_string());
                } else {
                    outcomes.insert("release refused".to_string());
                }
                "release"
            }
            8 => {
                // What an expiry does: the key is gone.
                let _: i64 = redis::cmd("DEL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("del");
                model = None;
                "expire"
            }
            _ => {
                // A lease near its end, so that a renewal shows.
                let _: i64 = redis::cmd("PEXPIRE")
                    .arg(&key)
                    .arg(short)
                    .query_async(&mut conn)
                    .await
                    .expect("pexpire");
                if let Some((holder, _)) = model {
                    model = Some((holder, short));
                }
                "shorten"
            }
        };
        let holder: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("get");
        assert_eq!(
            holder.as_deref(),
            model.map(|(h, _)| h),
            "step {step} ({what} by {h})"
        );
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("pttl");
        match model {
            None => assert_eq!(pttl, -2, "step {step}: no lease"),
            Some((_, ttl)) => {
                let pttl = pttl as u64;
                assert!(
                    pttl > 0 && pttl <= ttl,
                    "step {step}: PTTL {pttl}, set {ttl}"
                );
                // Set by a take or renewal: past what a shortened lease has.
                if ttl > short {
                    assert!(
                        pttl > short,
                        "step {step}: PTTL {pttl} not renewed to {ttl}"
                    );
                }
            }
        }
    }
    assert_eq!(outcomes.len(), 4, "every outcome was reached: {outcomes:?}");
}

/// renew_lease.lua: the owner's renewal resets the entry's idle time
/// without counting a delivery; a renewal by another consumer, of an entry
/// settled meanwhile, or of an entry reclaimed by another consumer, changes
/// nothing (it never takes an entry back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_an_entry_is_renewed_only_by_its_owner() {
    let (_server, store, keys) = rig().await;
    let mut conn = store.raw_conn();
    let ids = [
        deliver(&store, &keys, b"one").await,
        deliver(&store, &keys, b"two").await,
    ];
    // Both idle for an hour, as if their handler had been slow.
    for id in &ids {
        let _: Value = redis::cmd("XCLAIM")
            .arg(&keys.source)
            .arg(GROUP)
            .arg(CONSUMER)
            .arg(0)
            .arg(id)
            .arg("IDLE")
            .arg(HOUR)
            .arg("JUSTID")
            .query_async(&mut conn)
            .await
            .expect("xclaim");
    }
    let of = |id: &str, all: Vec<Pending>| all.into_iter().find(|p| p.id == id);
    store
        .renew_lease(&keys.source, GROUP, CONSUMER, &ids[0])
        .await
        .expect("renew");
    store
        .renew_lease(&keys.source, GROUP, "c2", &ids[1])
        .await
        .expect("renew");
    let p0 = of(&ids[0], pending(&store, &keys.source).await).expect("pending");
    let p1 = of(&ids[1], pending(&store, &keys.source).await).expect("pending");
    assert!(
        p0.idle_ms < HOUR,
        "the owner's renewal resets the idle time: {p0:?}"
    );
    assert_eq!(
        (p0.consumer.as_str(), p0.deliveries),
        (CONSUMER, 1),
        "no delivery counted"
    );
    assert!(
        p1.idle_ms >= HOUR,
        "another consumer's renewal changes nothing: {p1:?}"
    );
    assert_eq!((p1.consumer.as_str(), p1.deliveries), (CONSUMER, 1));
    // Reclaimed by another consumer: the old owner's renewal does not take
    // it back.
    let (taken, _) = store
        .reclaim(&keys.source, GROUP, "c2", HOUR / 2, 10)
        .await
        .expect("reclaim");
    assert_eq!(taken.len(), 1);
    store
        .renew_lease(&keys.source, GROUP, CONSUMER, &ids[1])
        .await
        .expect("renew");
    let p1 = of(&ids[1], pending(&store, &keys.source).await).expect("pending");
    assert_eq!((p1.consumer.as_str(), p1.deliveries), ("c2", 2), "{p1:?}");
    // Settled: a renewal does not make it pending again.
    store
        .ack_all(&keys.source, GROUP, std::slice::from_ref(&ids[0]))
        .await
        .expect("ack");
    store
        .renew_lease(&keys.source, GROUP, CONSUMER, &ids[0])
        .await
        .expect("renew");
    store
        .renew_lease(&keys.source, GROUP, CONSUMER, "999999-0")
        .await
        .expect("renew of an unknown id");
    let left: Vec<String> = pending(&store, &keys.source)
        .await
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(left, vec![ids[1].clone()]);
}

fn stalled(i: u64) -> Event {
    Event::BatchStalled(BatchStalled {
        quiet_since_ms: i,
        quiet_for_ms: i + 1,
    })
}

async fn pttl(store: &Store, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut store.raw_conn())
        .await
        .expect("pttl")
}

async fn hset(store: &Store, key: &str, pairs: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (f, v) in pairs {
        cmd.arg(*f).arg(*v);
    }
    let _: i64 = cmd.query_async(&mut store.raw_conn()).await.expect("hset");
}

/// The fold of a batch's events, with the live-only fields the state had.
async fn folded(log: &BatchLog, live: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut want = log
        .replay()
        .await
        .expect("events")
        .expect("decodable")
        .fields;
    for (f, v) in live {
        want.insert(f.to_string(), v.to_string());
    }
    want
}

/// restore.lua through `BatchLog::rebuild`: the state becomes the fold of
/// the events (fields the events do not give are dropped, wrong counts
/// corrected, lost keys back), keeping `alive`, `dlen`, `dstamp` and the TTL; a
/// state of more than 2,000 arguments is written in slices; a state that
/// is gone is rebuilt without a TTL. And the guard itself: a rebuild that
/// read up to an event other than the stream's last writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_replaces_the_state_only_from_every_event() {
    let (_server, store) = common::store(1).await;
    let log = store.batch("rebuilt");
    let state = log.keys.state.clone();
    // Over 1,000 idempotency keys: more than 2,000 arguments.
    for i in 0..1_100 {
        log.append(&format!("test/{i}"), &stalled(i))
            .await
            .expect("append");
    }
    hset(
        &store,
        &state,
        &[
            ("stalls", "9999"),
            ("zz-not-from-events", "1"),
            ("alive", "123"),
            ("dlen", "7"),
            ("dstamp", "0123456789abcdef"),
        ],
    )
    .await;
    let _: i64 = redis::cmd("HDEL")
        .arg(&state)
        .arg("k:test/5")
        .query_async(&mut store.raw_conn())
        .await
        .expect("hdel");
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&state)
        .arg(HOUR)
        .query_async(&mut store.raw_conn())
        .await
        .expect("pexpire");
    let want = folded(
        &log,
        &[
            ("alive", "123"),
            ("dlen", "7"),
            ("dstamp", "0123456789abcdef"),
        ],
    )
    .await;
    assert!(want.len() > 1_100);
    assert_eq!(want.get("stalls").map(String::as_str), Some("1100"));
    let r = log.rebuild(3).await.expect("rebuild");
    assert!(matches!(r, Rebuilt::Replaced { retries: 0, .. }), "{r:?}");
    assert_eq!(log.state().await.expect("state").fields, want);
    let ttl = pttl(&store, &state).await;
    assert!(ttl > 0 && ttl <= HOUR as i64, "the TTL is kept: {ttl}");

    // Gone altogether: rebuilt, with no TTL and no live-only fields.
    let _: i64 = redis::cmd("DEL")
        .arg(&state)
        .query_async(&mut store.raw_conn())
        .await
        .expect("del");
    log.rebuild(1).await.expect("rebuild");
    assert_eq!(
        log.state().await.expect("state").fields,
        folded(&log, &[]).await
    );
    assert_eq!(pttl(&store, &state).await, -1);

    // The guard: a rebuild that read up to an older event, or to none,
    // while the stream has more, replaces nothing.
    hset(&store, &state, &[("stalls", "1")]).await;
    let before = log.state().await.expect("state").fields;
    let events = log.events().await.expect("events");
    let older = events[events.len() - 2]
        .as_ref()
        .expect("decodable")
        .id
        .clone();
    for read_up_to in [older.as_str(), ""] {
        let replaced: i64 = SCRIPTS
            .restore
            .key(&state)
            .key(&log.keys.events)
            .arg(read_up_to)
            .arg("stalls")
            .arg("0")
            .invoke_async(&mut store.raw_conn())
            .await
            .expect("restore");
        assert_eq!(replaced, 0, "read up to {read_up_to:?}");
        assert_eq!(log.state().await.expect("state").fields, before);
    }
}
