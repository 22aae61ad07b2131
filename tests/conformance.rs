//! The pure protocol functions (`src/protocol/`) against the real scripts
//! (`streams/scripts/`) on a real redis-server: long random sequences of
//! script calls, each run through both, comparing after every step the
//! reply, the state hash (projection and idempotency keys), the event
//! stream, the work stream, the parked hashes, the active set, the reports
//! stream, the delayed set and the retention TTL. A script changed without
//! its mirror fails here; so does a mirror changed without its script.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use groupcast::events::{
    decode_payload, entry_millis, BatchStalled, ChunkLoaded, Event, GroupDiscarded, InputRejected,
    Recorded, RegistrationFailure, ReportDelivered, SendRefused,
};
use groupcast::keys::Keyspace;
use groupcast::protocol::{self, accept::AcceptArgs, completed::CompletedArgs, Db, WorkEntry};
use groupcast::store::batch::{Accepted, Appended, BatchLog, Completion, GroupRecord, Parked};
use groupcast::store::queue::parse_entries;
use groupcast::store::Store;
use groupcast::worker::ops::WorkItem;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;

/// Steps per run, and runs (each on fresh batches, under a fresh prefix:
/// a batch soon has every seq and every generation decided, and most calls
/// after that are repeats).
const STEPS: usize = 80;
const RUNS: u64 = 130;
const CAP: u64 = 6;
const SEQS: u32 = 6;
const GENS: u32 = 5;

/// One script call, with its arguments.
#[derive(Debug, Clone)]
enum Call {
    Accept {
        seq: u32,
        last: bool,
        count: u32,
        digest: String,
    },
    Park {
        seq: u32,
        gen: u32,
        payload: Vec<u8>,
    },
    RecordGroup {
        gen: u32,
        group: String,
    },
    Loaded(ChunkLoaded),
    Sent {
        gen: u32,
        group: String,
        outcome: String,
        poll: Vec<u8>,
    },
    Completed {
        gen: u32,
        group: String,
        status: String,
        ss: u64,
        sf: u64,
        retention: u64,
        deliver: bool,
    },
    Append {
        key: String,
        event: Event,
    },
}

/// A plausible call most of the time (the state guides the arguments), an
/// arbitrary one otherwise.
fn pick(rng: &mut StdRng, db: &Db, batch: &str) -> Call {
    let top = db
        .field(batch, "gen")
        .and_then(|g| g.parse::<u32>().ok())
        .unwrap_or(0);
    let gen = if rng.random_bool(0.8) {
        top.saturating_sub(rng.random_range(0..2))
    } else {
        rng.random_range(0..GENS)
    };
    let assigned: Vec<(u32, u32)> = (0..SEQS)
        .filter_map(|s| {
            let v = db.field(batch, &format!("s:{s}"))?;
            Some((s, v.split('|').next()?.parse().ok()?))
        })
        .collect();
    let (seq, sgen) = match assigned.len() {
        0 => (rng.random_range(0..SEQS), gen),
        n if rng.random_bool(0.85) => assigned[rng.random_range(0..n)],
        _ => (rng.random_range(0..SEQS), gen),
    };
    let group = format!("G{gen}-{}", rng.random_range(0..2));
    let kept = db
        .field(batch, &format!("g:{sgen}:group"))
        .map(str::to_string)
        .unwrap_or_else(|| format!("G{sgen}-0"));
    match rng.random_range(0..100) {
        0..=29 => {
            let seq = rng.random_range(0..SEQS);
            Call::Accept {
                seq,
                last: rng.random_bool(0.25),
                count: rng.random_range(1..=4),
                digest: if rng.random_bool(0.9) {
                    format!("d{seq}")
                } else {
                    "other".into()
                },
            }
        }
        30..=42 => Call::Park {
            seq,
            gen: sgen,
            payload: format!("chunk {seq}").into_bytes(),
        },
        43..=54 => Call::RecordGroup { gen, group },
        55..=72 => {
            let failed: Vec<RegistrationFailure> = (0..rng.random_range(0..2))
                .map(|i| RegistrationFailure {
                    to: format!("0100000{seq}{i}"),
                    code: "3059".into(),
                })
                .collect();
            Call::Loaded(ChunkLoaded {
                gen: sgen,
                seq,
                group_id: kept,
                registered: rng.random_range(0..4),
                duplicates: rng.random_range(0..2),
                failed,
            })
        }
        73..=82 => Call::Sent {
            gen,
            group: db
                .field(batch, &format!("g:{gen}:group"))
                .unwrap_or("G?")
                .to_string(),
            outcome: if rng.random_bool(0.8) {
                "sent"
            } else {
                "already_sent"
            }
            .into(),
            poll: format!("poll|{batch}|{gen}").into_bytes(),
        },
        83..=92 => Call::Completed {
            gen,
            group: format!("G{gen}"),
            status: if rng.random_bool(0.8) {
                "COMPLETE"
            } else {
                "FAILED"
            }
            .into(),
            ss: rng.random_range(0..5),
            sf: rng.random_range(0..2),
            retention: if rng.random_bool(0.5) { 3600 } else { 0 },
            deliver: rng.random_bool(0.5),
        },
        _ => {
            let (key, event) = match rng.random_range(0..5) {
                0 => (
                    format!("discard/G{gen}-1"),
                    Event::GroupDiscarded(GroupDiscarded {
                        gen,
                        group_id: format!("G{gen}-1"),
                        kept: format!("G{gen}-0"),
                    }),
                ),
                1 => (
                    format!("reject/{seq}/other"),
                    Event::InputRejected(InputRejected {
                        seq: Some(seq),
                        reason: "conflict".into(),
                    }),
                ),
                2 => (
                    format!("stall/{}", rng.random_range(0..3)),
                    Event::BatchStalled(BatchStalled {
                        quiet_since_ms: 5,
                        quiet_for_ms: 7,
                    }),
                ),
                3 => (
                    "delivered".into(),
                    Event::ReportDelivered(ReportDelivered { status: 200 }),
                ),
                _ => (
                    format!("refused/{gen}"),
                    Event::SendRefused(SendRefused {
                        gen,
                        group_id: format!("G{gen}"),
                        reason: "count".into(),
                    }),
                ),
            };
            Call::Append { key, event }
        }
    }
}

/// Runs a call through the pure functions: the reply without its `ev=`/`w=` tail.
fn model(db: &mut Db, batch: &str, call: &Call) -> Vec<String> {
    match call {
        Call::Accept {
            seq,
            last,
            count,
            digest,
        } => protocol::accept(
            db,
            batch,
            &AcceptArgs {
                seq: *seq,
                last: *last,
                count: *count,
                digest,
                cap: CAP,
            },
        ),
        Call::Park { seq, gen, payload } => protocol::park(db, batch, *seq, *gen, payload),
        Call::RecordGroup { gen, group } => protocol::record_group(db, batch, *gen, group),
        Call::Loaded(e) => protocol::loaded(db, batch, e),
        Call::Sent {
            gen,
            group,
            outcome,
            poll,
        } => protocol::sent(db, batch, *gen, group, outcome, poll),
        Call::Completed {
            gen,
            group,
            status,
            ss,
            sf,
            retention,
            deliver,
        } => protocol::completed(
            db,
            batch,
            &CompletedArgs {
                gen: *gen,
                group,
                status,
                sent_success: *ss,
                sent_failed: *sf,
                retention_secs: *retention,
                deliver: *deliver,
            },
        ),
        Call::Append { key, event } => protocol::append(db, batch, key, event),
    }
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Runs a call through the real scripts (the worker's own calls), its
/// answer spelt as the script's reply.
async fn real(log: &BatchLog, call: &Call) -> Vec<String> {
    let fail = "a script call on the private redis-server";
    match call {
        Call::Accept {
            seq,
            last,
            count,
            digest,
        } => match log
            .accept(*seq, *last, *count, digest, CAP)
            .await
            .expect(fail)
        {
            Accepted::Assigned { gen, group } => {
                vec![s("assigned"), s(gen), group.unwrap_or_default(), s("0")]
            }
            Accepted::Duplicate { gen, group, loaded } => vec![
                s("duplicate"),
                s(gen),
                group.unwrap_or_default(),
                s(if loaded { "1" } else { "0" }),
            ],
            Accepted::Conflict(r) => vec![s("conflict"), r],
            Accepted::Rejected(r) => vec![s("rejected"), r],
        },
        Call::Park { seq, gen, payload } => {
            match log.park(*seq, *gen, payload).await.expect(fail) {
                Parked::Parked => vec![s("parked")],
                Parked::Group(g) => vec![s("group"), g],
                Parked::AlreadyLoaded => vec![s("loaded")],
            }
        }
        Call::RecordGroup { gen, group } => {
            match log.record_group(*gen, group).await.expect(fail) {
                GroupRecord::Won => vec![s("won"), group.clone()],
                GroupRecord::Lost { kept } => vec![s("lost"), kept],
            }
        }
        Call::Loaded(e) => match log.loaded(e).await.expect(fail) {
            Some(ready) => vec![s("loaded"), s(if ready { "1" } else { "0" })],
            None => vec![s("duplicate")],
        },
        Call::Sent {
            gen,
            group,
            outcome,
            poll,
        } => {
            let new = log
                .sent(*gen, group, outcome, 1000, poll)
                .await
                .expect(fail);
            vec![s(if new { "recorded" } else { "duplicate" })]
        }
        Call::Completed {
            gen,
            group,
            status,
            ss,
            sf,
            retention,
            deliver,
        } => match log
            .completed(*gen, group, status, *ss, *sf, *retention, *deliver)
            .await
            .expect(fail)
        {
            Completion::Completed => vec![s("completed")],
            Completion::Reported => vec![s("reported")],
            Completion::Duplicate => vec![s("duplicate")],
        },
        Call::Append { key, event } => match log.append(key, event).await.expect(fail) {
            Appended::New(id) => vec![s("appended"), id],
            Appended::Duplicate(id) => vec![s("duplicate"), id],
        },
    }
}

/// Everything the scripts touch, read from Redis.
struct Seen {
    state: BTreeMap<String, String>,
    events: Vec<Recorded>,
    work: Vec<(String, String, WorkItem, Option<Vec<u8>>)>,
    parked: BTreeMap<u32, BTreeMap<String, Vec<u8>>>,
    active: BTreeSet<String>,
    reports: Vec<(String, String, Event)>,
    delayed: BTreeSet<Vec<u8>>,
    expiring: bool,
}

async fn xrange(
    conn: &mut groupcast::store::RedisConn,
    key: &str,
) -> Vec<groupcast::store::queue::Entry> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    parse_entries(&v)
}

async fn read(store: &Store, log: &BatchLog) -> Seen {
    let mut conn = store.raw_conn();
    let k = &log.keys;
    let state: BTreeMap<String, String> = conn.hgetall(&k.state).await.expect("HGETALL");
    let events = xrange(&mut conn, &k.events)
        .await
        .iter()
        .map(|e| Recorded::from_fields(&e.id, &e.fields).expect("an event that decodes"))
        .collect();
    let mut work = Vec::new();
    for e in xrange(&mut conn, &k.work).await {
        let op = String::from_utf8_lossy(e.get("op").expect("op")).into_owned();
        let item: WorkItem = decode_payload("work", e.get("d").expect("d")).expect("a work item");
        work.push((e.id.clone(), op, item, e.get("c").map(<[u8]>::to_vec)));
    }
    let mut parked = BTreeMap::new();
    for gen in 0..=GENS + 1 {
        let h: BTreeMap<String, Vec<u8>> = conn.hgetall(k.parked(gen)).await.expect("HGETALL");
        if !h.is_empty() {
            parked.insert(gen, h);
        }
    }
    let active: BTreeSet<String> = conn.smembers(&k.active).await.expect("SMEMBERS");
    let reports = xrange(&mut conn, &k.reports)
        .await
        .iter()
        .map(|e| {
            let batch = String::from_utf8_lossy(e.get("batch").expect("batch")).into_owned();
            let report = Event::decode("batch_reported", e.get("d").expect("d")).expect("a report");
            (e.id.clone(), batch, report)
        })
        .collect();
    let delayed: Vec<Vec<u8>> = conn.zrange(&k.delayed, 0, -1).await.expect("ZRANGE");
    let ttl: i64 = conn.pttl(&k.state).await.expect("PTTL");
    Seen {
        state,
        events,
        work,
        parked,
        active,
        reports,
        delayed: delayed.into_iter().collect(),
        expiring: ttl > 0,
    }
}

/// The model's id `<n>-0` of an event of `batch` → the real id at the same
/// place in the stream.
fn real_id<'a>(model: &protocol::BatchDb, seen: &'a Seen, id: &str) -> Option<&'a str> {
    let i = model.events.iter().position(|e| e.id == id)?;
    seen.events.get(i).map(|e| e.id.as_str())
}

/// The differences between the model and Redis, as readable lines.
fn compare(db: &Db, batch: &str, seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    let empty = protocol::BatchDb::default();
    let m = db.batch(batch).unwrap_or(&empty);
    // The state hash, with the model's ids and clock readings translated.
    let mut state = BTreeMap::new();
    for (f, v) in &m.state {
        let t = if f.starts_with("k:") {
            real_id(m, seen, v).map(str::to_string)
        } else if f == "hb" || f == "t0" {
            real_id(m, seen, &format!("{v}-0")).map(|id| entry_millis(id).to_string())
        } else {
            Some(v.clone())
        };
        state.insert(f.clone(), t.unwrap_or_else(|| format!("<no event {v}>")));
    }
    if state != seen.state {
        let all: BTreeSet<&String> = state.keys().chain(seen.state.keys()).collect();
        for f in all {
            if state.get(f) != seen.state.get(f) {
                out.push(format!(
                    "state {f}: model {:?}, redis {:?}",
                    state.get(f),
                    seen.state.get(f)
                ));
            }
        }
    }
    if m.events.len() != seen.events.len() {
        out.push(format!(
            "events: model has {}, redis {}",
            m.events.len(),
            seen.events.len()
        ));
    }
    for (i, (a, b)) in m.events.iter().zip(&seen.events).enumerate() {
        if a.key != b.key || a.event != b.event {
            out.push(format!(
                "event {i}: model {} {:?}, redis {} {:?}",
                a.key, a.event, b.key, b.event
            ));
        }
    }
    // The work stream holds every batch's items: compare in order.
    let work: Vec<(&str, &WorkItem, Option<&Vec<u8>>)> = db
        .work
        .iter()
        .map(
            |WorkEntry {
                 op, item, chunk, ..
             }| (op.as_str(), item, chunk.as_ref()),
        )
        .collect();
    let real_work: Vec<(&str, &WorkItem, Option<&Vec<u8>>)> = seen
        .work
        .iter()
        .map(|(_, op, item, c)| (op.as_str(), item, c.as_ref()))
        .collect();
    if work != real_work {
        out.push(format!("work: model {work:?}\n      redis {real_work:?}"));
    }
    let parked: BTreeMap<u32, BTreeMap<String, Vec<u8>>> = m
        .parked
        .iter()
        .map(|(g, h)| (*g, h.iter().cloned().collect()))
        .collect();
    if parked != seen.parked {
        out.push(format!("parked: model {parked:?}, redis {:?}", seen.parked));
    }
    if db.active != seen.active {
        out.push(format!(
            "active: model {:?}, redis {:?}",
            db.active, seen.active
        ));
    }
    let reports: Vec<(&str, &Event)> = db.reports.iter().map(|(_, b, e)| (b.as_str(), e)).collect();
    let real_reports: Vec<(&str, &Event)> = seen
        .reports
        .iter()
        .map(|(_, b, e)| (b.as_str(), e))
        .collect();
    if reports != real_reports {
        out.push(format!(
            "reports: model {reports:?}, redis {real_reports:?}"
        ));
    }
    if db.delayed != seen.delayed {
        out.push(format!(
            "delayed: model {:?}, redis {:?}",
            db.delayed, seen.delayed
        ));
    }
    if m.expiring != seen.expiring {
        out.push(format!(
            "retention TTL: model {}, redis {}",
            m.expiring, seen.expiring
        ));
    }
    out
}

/// Writes to the real stderr, past the test harness's output capture.
fn shout(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pure_functions_decide_as_the_scripts_do() {
    let server = common::redis();
    let seed0: u64 = std::env::var("CONFORMANCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(13);
    let mut steps = 0usize;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for run in 0..RUNS {
        let seed = seed0 + run;
        let store = Store::connect(&server.url(), Keyspace::new(format!("c{run}"), 1))
            .await
            .expect("connect to the private redis-server");
        let mut db = Db::default();
        let mut rng = StdRng::seed_from_u64(seed);
        // Two batches per run share the shard's work, active and reports keys.
        let names = [format!("c{seed}a"), format!("c{seed}b")];
        let mut history: Vec<String> = Vec::new();
        for step in 0..STEPS {
            let batch = &names[usize::from(rng.random_bool(0.3))];
            let log = store.batch(batch);
            let call = pick(&mut rng, &db, batch);
            let want = model(&mut db, batch, &call);
            let got = real(&log, &call).await;
            let kind = format!(
                "{}:{}",
                format!("{call:?}").split([' ', '(']).next().unwrap_or(""),
                want[0]
            );
            *kinds.entry(kind).or_default() += 1;
            history.push(format!("{batch} {call:?} -> {want:?}"));
            let mut diffs = Vec::new();
            // `append` answers with an entry id: translate the model's.
            let want_cmp: Vec<String> = match (&call, want.as_slice()) {
                (Call::Append { .. }, [t, id]) => {
                    let seen = read(&store, &log).await;
                    let m = db.batch(batch).expect("appended");
                    vec![t.clone(), real_id(m, &seen, id).unwrap_or("?").to_string()]
                }
                _ => want.clone(),
            };
            if want_cmp != got {
                diffs.push(format!("reply: model {want_cmp:?}, redis {got:?}"));
            }
            let seen = read(&store, &log).await;
            diffs.extend(
                compare(&db, batch, &seen)
                    .into_iter()
                    .map(|d| format!("{batch}: {d}")),
            );
            steps += 1;
            if !diffs.is_empty() {
                let tail: Vec<&String> = history.iter().rev().take(12).rev().collect();
                panic!(
                    "seed {seed}, step {step}: the model and the scripts disagree\n{}\nlast calls:\n  {}",
                    diffs.join("\n"),
                    tail.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
                );
            }
        }
    }
    shout(&format!(
        "conformance: steps={steps} seeds={seed0}..{} calls={kinds:?}",
        seed0 + RUNS - 1
    ));
    // Every kind of decision was exercised, not only the easy ones.
    for k in [
        "Accept:assigned",
        "Accept:duplicate",
        "Accept:conflict",
        "Accept:rejected",
        "Park:parked",
        "Park:group",
        "RecordGroup:won",
        "RecordGroup:lost",
        "Loaded:loaded",
        "Loaded:duplicate",
        "Sent:recorded",
        "Sent:duplicate",
        "Completed:completed",
        "Completed:reported",
        "Completed:duplicate",
        "Append:appended",
        "Append:duplicate",
    ] {
        assert!(kinds.get(k).is_some_and(|&n| n > 0), "no {k} in {kinds:?}");
    }
    assert!(steps >= 10_000);
}
