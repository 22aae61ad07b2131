//! The durability waits on real servers: what `--durability auto` chooses
//! from each server's persistence (Debian's Redis 7.0 without and with an
//! AOF, Valkey 8.1 with `everysec` and `always`), the `WAITAOF` waiter
//! (facts on disk, facts gone, one call for many waiters), the guard on a
//! load retried after a wait, and a batch through workers that wait with it.
//!
//! Valkey comes from `scripts/ensure-deps --tests` (or
//! `GROUPCAST_VALKEY_SERVER`); without it these tests fail, saying so.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::events::{BatchStalled, Event};
use groupcast::keys::Keyspace;
use groupcast::store::batch::Appended;
use groupcast::store::durability::aof::{Fact, Fsync};
use groupcast::store::Store;
use groupcast::worker::durability::{choose_wait, Durability, ServerPersistence};
use groupcast::worker::{DurableWait, WorkerConfig};
use groupcast_rigs::redis_server::{aof_args, RedisServer, ServerOptions};

fn valkey(fsync: &str) -> RedisServer {
    RedisServer::start_valkey(fsync, &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn redis8(fsync: &str) -> RedisServer {
    RedisServer::start_redis8(fsync, &[]).unwrap_or_else(|e| panic!("{e}"))
}

async fn connect(server: &RedisServer) -> Store {
    Store::connect(&server.url(), Keyspace::new("gct", 1))
        .await
        .expect("connect")
}

async fn auto(server: &RedisServer, replicas: u32) -> (DurableWait, String) {
    let store = connect(server).await;
    let p = ServerPersistence::read(&store).await.expect("persistence");
    choose_wait(Durability::Auto, replicas, &p).expect("auto always chooses")
}

const WINDOW: DurableWait = DurableWait::Window(groupcast::store::durability::witness::WINDOW);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_follows_the_servers_persistence() {
    // Debian's Redis 7.0 without an AOF: nothing to wait for, and a warning.
    let plain = common::redis();
    let (wait, why) = auto(&plain, 0).await;
    assert_eq!(wait, DurableWait::None, "{why}");
    assert!(
        why.contains("WARNING") && why.contains("appendonly=no"),
        "{why}"
    );
    // Redis 7.0 with everysec: no WAITAOF, so the window.
    let redis_everysec = RedisServer::start_with(ServerOptions {
        args: aof_args("everysec"),
        ..ServerOptions::default()
    })
    .expect("redis-server");
    let (wait, why) = auto(&redis_everysec, 0).await;
    assert_eq!(wait, WINDOW, "{why}");
    assert!(why.contains("no WAITAOF"), "{why}");
    // WAITAOF asked for explicitly on a server without it: refused.
    let p = ServerPersistence::read(&connect(&redis_everysec).await)
        .await
        .expect("persistence");
    assert!(choose_wait(Durability::Waitaof, 0, &p).is_err());

    // Valkey 8.1.8 with everysec has WAITAOF, but it confirms writes that
    // are not fsynced yet (redis/redis#13793: fsyncs come a second apart,
    // its confirmations every ~100 ms): auto measures that and waits the
    // window; an explicit `waitaof` is the operator's word, warned.
    let everysec = valkey("everysec");
    let (wait, why) = auto(&everysec, 0).await;
    assert_eq!(wait, WINDOW, "{why}");
    assert!(why.contains("confirms before the fsync"), "{why}");
    let p = ServerPersistence::read(&connect(&everysec).await)
        .await
        .expect("persistence");
    assert!(p.confirms_early.is_some(), "{p:?}");
    let (wait, why) = choose_wait(Durability::Waitaof, 0, &p).expect("explicit waitaof");
    assert_eq!(wait, DurableWait::WaitAof { replicas: 0 }, "{why}");
    assert!(
        why.contains("WARNING") && why.contains("WAITAOF 1 0"),
        "{why}"
    );
    // Redis 8.0 with everysec: its WAITAOF waits for the fsync (the
    // measurement finds confirmations most of a second apart), so auto
    // waits with it.
    let fsyncs_first = redis8("everysec");
    let (wait, why) = auto(&fsyncs_first, 0).await;
    assert_eq!(wait, DurableWait::WaitAof { replicas: 0 }, "{why}");
    assert!(why.contains("WAITAOF 1 0"), "{why}");
    let honest = ServerPersistence::read(&connect(&fsyncs_first).await)
        .await
        .expect("persistence");
    assert!(honest.confirms_early.is_none(), "{honest:?}");
    // The operator's explicit window stays available.
    assert_eq!(
        choose_wait(Durability::Everysec, 0, &p).expect("ok").0,
        WINDOW
    );

    // Valkey with always: nothing to wait for, unless replicas must ack.
    let always = valkey("always");
    assert_eq!(auto(&always, 0).await.0, DurableWait::None);
    assert_eq!(
        auto(&always, 1).await.0,
        DurableWait::WaitAof { replicas: 1 }
    );
}

/// Appends an event to `batch` and returns the fact it is.
async fn event(store: &Store, batch: &str, key: &str) -> Fact {
    let log = store.batch(batch);
    let e = Event::BatchStalled(BatchStalled {
        quiet_since_ms: 1,
        quiet_for_ms: 2,
    });
    let Appended::New(id) = log.append(key, &e).await.expect("append") else {
        panic!("{key} appended before");
    };
    Fact {
        state: log.keys.state.clone(),
        field: format!("k:{key}"),
        id,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_confirms_what_is_there_and_finds_what_is_gone() {
    let server = valkey("everysec");
    let store = connect(&server).await;
    let waiter = store.aof_waiter(0);
    let a = event(&store, "dur-a", "stalled/1").await;
    let b = event(&store, "dur-b", "stalled/1").await;
    assert_eq!(
        waiter.wait(vec![a.clone(), b.clone()]).await.expect("wait"),
        Fsync::Durable
    );
    // Another entry id under the same key (appended again after a loss), or
    // the key gone: Redis lost the event.
    let other = Fact {
        id: "1-1".into(),
        ..a.clone()
    };
    assert_eq!(
        waiter.wait(vec![b.clone(), other]).await.expect("wait"),
        Fsync::Gone
    );
    let _: () = redis::cmd("HDEL")
        .arg(&b.state)
        .arg(&b.field)
        .query_async(&mut store.raw_conn())
        .await
        .expect("hdel");
    assert_eq!(waiter.wait(vec![b]).await.expect("wait"), Fsync::Gone);
    assert_eq!(waiter.wait(vec![a]).await.expect("wait"), Fsync::Durable);
    // Asking replicas that do not exist: the facts are there, but not
    // acknowledged within the timeout.
    let c = event(&store, "dur-c", "stalled/1").await;
    let started = Instant::now();
    assert_eq!(
        store.aof_waiter(1).wait(vec![c]).await.expect("wait"),
        Fsync::NotYet
    );
    assert!(started.elapsed() >= groupcast::store::durability::aof::WAITAOF_TIMEOUT);
}

/// The measurement of how a server's `WAITAOF` confirms is made once per
/// server process: a second worker starting against it reads the first
/// one's answer (no `WAITAOF`), and a restarted server is measured again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_is_measured_once_per_server_process() {
    let dir = tempfile::tempdir().expect("dir");
    let options = ServerOptions {
        program: Some(
            groupcast_rigs::redis_server::REDIS8
                .program()
                .unwrap_or_else(|e| panic!("{e}")),
        ),
        args: aof_args("everysec"),
        dir: Some(dir.path().to_path_buf()),
        ..ServerOptions::default()
    };
    let server = RedisServer::start_with(options.clone()).expect("redis 8");
    let store = connect(&server).await;
    let first = store.waitaof_confirmation_delay().await.expect("measure");
    assert!(first >= Duration::from_millis(500), "{first:?}");
    let calls = waitaof_calls(&store).await;
    let second = store.waitaof_confirmation_delay().await.expect("read");
    assert_eq!(second.as_millis(), first.as_millis());
    assert_eq!(waitaof_calls(&store).await, calls, "measured again");
    drop(store);
    drop(server);
    let server = RedisServer::start_with(options).expect("redis 8 again");
    let store = connect(&server).await;
    let calls = waitaof_calls(&store).await;
    store.waitaof_confirmation_delay().await.expect("measure");
    assert!(
        waitaof_calls(&store).await > calls,
        "not measured after a restart"
    );
}

/// `cmdstat_waitaof`'s calls on the server.
async fn waitaof_calls(store: &Store) -> u64 {
    common::command_calls(store, "waitaof").await
}

// One thread: every waiter has queued before the round task first runs, so
// that the round must take them all.
#[tokio::test(flavor = "current_thread")]
async fn waiters_of_a_process_share_one_waitaof() {
    let server = valkey("everysec");
    let store = connect(&server).await;
    let mut facts = Vec::new();
    for k in 0..100 {
        facts.push(event(&store, &format!("dur-{k}"), "stalled/1").await);
    }
    let waiter = store.aof_waiter(0);
    let before = waitaof_calls(&store).await;
    let all =
        futures_util::future::join_all(facts.iter().map(|f| waiter.wait(vec![f.clone()]))).await;
    assert!(
        all.iter().all(|r| matches!(r, Ok(Fsync::Durable))),
        "{all:?}"
    );
    assert_eq!(waitaof_calls(&store).await - before, 1);
}

// One thread, as above: the round takes every waiter.
#[tokio::test(flavor = "current_thread")]
async fn a_round_reads_the_facts_of_one_batch_with_one_hmget() {
    let server = redis8("everysec");
    let store = connect(&server).await;
    let mut facts = Vec::new();
    for k in 0..50 {
        facts.push(event(&store, "dur-one", &format!("stalled/{k}")).await);
    }
    // The same field as the first fact under another entry id (appended
    // again after a loss), and a field that is not there: read once with
    // the others, each answered for its own waiter.
    let lost = Fact {
        id: "1-1".into(),
        ..facts[0].clone()
    };
    let missing = Fact {
        field: "k:stalled/absent".into(),
        ..facts[0].clone()
    };
    let waiter = store.aof_waiter(0);
    let (hmget, hget) = (
        common::command_calls(&store, "hmget").await,
        common::command_calls(&store, "hget").await,
    );
    let mut asked: Vec<Vec<Fact>> = facts.iter().map(|f| vec![f.clone()]).collect();
    asked.push(vec![facts[1].clone(), lost]);
    asked.push(vec![missing]);
    let all = futures_util::future::join_all(asked.into_iter().map(|f| waiter.wait(f))).await;
    let answers: Vec<Fsync> = all.into_iter().map(|r| r.expect("wait")).collect();
    assert!(
        answers[..50].iter().all(|a| *a == Fsync::Durable),
        "{answers:?}"
    );
    assert_eq!(answers[50..], [Fsync::Gone, Fsync::Gone]);
    assert_eq!(common::command_calls(&store, "hmget").await - hmget, 1);
    assert_eq!(common::command_calls(&store, "hget").await, hget);
}

/// On Redis 8.0, whose `WAITAOF` waits for the fsync: every add and send
/// waits for a real fsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_completes_with_workers_waiting_for_waitaof() {
    let server = redis8("everysec");
    let store = connect(&server).await;
    let config = WorkerConfig {
        durable: DurableWait::WaitAof { replicas: 0 },
        group_cap: 500,
        ..common::test_config()
    };
    let rig = common::Rig::start_on(server, store, 2, config, common::mock_config()).await;
    let batch = "dur-batch".to_string();
    let chunks = common::shuffled_chunks(&batch, 0, 2_000, 100, 7);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    // Four generations, each add and each send waiting for an fsync (about
    // a second at most under everysec), far less than the 4 s window each.
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 2_000)]));
    assert!(waitaof_calls(&rig.store).await > 0);
    rig.stop().await;
}

/// A `WAITAOF` wait gives its consumer slot back, like the window's sleep:
/// the round gathers every entry the consumer can read meanwhile, not only
/// the `concurrency` it holds. 40 chunks through one worker with 2 slots per
/// consumer: holding the slot, the adds alone took at least 20 rounds (each
/// up to the next fsync, a second apart); given back, a few rounds carry
/// them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_waits_give_their_consumer_slot_back() {
    let server = redis8("everysec");
    let store = connect(&server).await;
    let config = WorkerConfig {
        durable: DurableWait::WaitAof { replicas: 0 },
        concurrency: 2,
        group_cap: 1_000,
        ..common::test_config()
    };
    let rig = common::Rig::start_on(server, store, 1, config, common::mock_config()).await;
    let batch = "slots-batch".to_string();
    let chunks = groupcast::producer::cut(
        &batch,
        &common::template(),
        common::recipients(0, 4_000),
        100,
    );
    let before = waitaof_calls(&rig.store).await;
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(90))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    let rounds = waitaof_calls(&rig.store).await - before;
    assert!(
        rounds <= 12,
        "{rounds} WAITAOF rounds for 40 adds and 4 sends"
    );
    rig.stop().await;
}

/// `cmdstat_zadd`'s calls on the server: the delayed retries (and a few
/// others: the first poll of each generation, each report's tombstone).
async fn zadd_calls(store: &Store) -> u64 {
    common::command_calls(store, "zadd").await
}

/// Under the window (a server without a trustworthy `WAITAOF`), an add or a
/// send waits in place until what it relies on is old enough, its consumer
/// slot given back meanwhile: no chunk goes through the delayed set just to
/// wait. 20 chunks, 4 generations: waiting through the delayed set would
/// schedule at least 24 retries; the first polls and the tombstone are 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_window_adds_and_sends_wait_in_place() {
    let config = WorkerConfig {
        durable: DurableWait::Window(Duration::from_millis(300)),
        group_cap: 500,
        ..common::test_config()
    };
    let rig = rig_on_own_server(2, config, common::mock_config()).await;
    let batch = "window-batch".to_string();
    let chunks = common::shuffled_chunks(&batch, 0, 2_000, 100, 7);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 2_000)]));
    let scheduled = zadd_calls(&rig.store).await;
    assert!(
        scheduled <= 10,
        "{scheduled} entries were scheduled in the delayed set"
    );
    rig.stop().await;
}

/// `workers` workers with `config`, and a mock provider with `mock`, on a
/// private server.
async fn rig_on_own_server(
    workers: usize,
    config: WorkerConfig,
    mock: groupcast_rigs::mock::MockConfig,
) -> common::Rig {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let store = connect(&server).await;
    common::Rig::start_on(server, store, workers, config, mock).await
}

/// Waiting out a 2 s window before each add and send: time enough for a
/// test to take facts away during the sleep.
fn window_config() -> WorkerConfig {
    WorkerConfig {
        durable: DurableWait::Window(Duration::from_secs(2)),
        ..common::test_config()
    }
}

/// One worker on its own server with [`window_config`].
async fn window_rig() -> common::Rig {
    rig_on_own_server(1, window_config(), common::mock_config()).await
}

/// Under the window, age makes a fact durable only if Redis still has it
/// when the wait ends: a send whose claim Redis lost while it slept
/// (emulated here by taking the claim's state field away, as a restart from
/// an AOF that missed its last second would: the claim is the newest fact)
/// is not made on it; its entry is read again, claims again, waits for that
/// claim and sends. Without the second read the send went out on the lost
/// claim (and in the chaos suite, with its `ready` lost too, a chunk of the
/// generation was then loaded again into a group already sending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_claim_is_lost_during_the_window_claims_again() {
    use groupcast::projection::{event_key, field};
    let rig = window_rig().await;
    let batch = "window-lost".to_string();
    let chunks =
        groupcast::producer::cut(&batch, &common::template(), common::recipients(0, 10), 10);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    let log = rig.store.batch(&batch);
    let claim = field::key(&event_key::claim(0));
    // The claim comes right before the send's wait (2 s): take it away
    // while the send sleeps.
    common::wait_until(Duration::from_secs(30), "the send claimed", || async {
        log.fields(std::slice::from_ref(&claim))
            .await
            .is_ok_and(|v| v[0].is_some())
    })
    .await;
    let lost = log
        .fields(std::slice::from_ref(&claim))
        .await
        .expect("read")[0]
        .clone();
    let _: () = redis::cmd("HDEL")
        .arg(&log.keys.state)
        .arg(&claim)
        .query_async(&mut rig.store.raw_conn())
        .await
        .expect("hdel");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    // Sent once, on a claim Redis has: a new one, not the lost one.
    let now = log
        .fields(std::slice::from_ref(&claim))
        .await
        .expect("read")[0]
        .clone();
    assert!(
        now.is_some() && now != lost,
        "the send's claim: {now:?} (the lost one: {lost:?})"
    );
    let ledger = rig.mock.ledger();
    assert_eq!(ledger.groups.len(), 1);
    assert_eq!(ledger.groups[0].send_calls.len(), 1);
    rig.stop().await;
}

/// `batch` reported, and verify fails nothing but the log's integrity
/// (invariant 0: the acknowledged writes a roll-back took away).
async fn reported_failing_only_integrity(rig: &common::Rig, batch: &str) {
    let v = groupcast::verify::verify_batch(
        &rig.store,
        Some(&rig.provider),
        batch,
        rig.config.group_cap,
    )
    .await
    .expect("verify");
    assert!(v.reported);
    let failed: Vec<_> = v.failures().into_iter().map(|c| c.invariant).collect();
    assert!(failed.iter().all(|i| *i == 0), "{:#?}", v.failures());
}

/// Whether `log`'s state holds field `name`.
async fn recorded(log: &groupcast::store::batch::BatchLog, name: String) -> bool {
    log.fields(std::slice::from_ref(&name))
        .await
        .is_ok_and(|v| v[0].is_some())
}

/// Every key of the server with its `DUMP` (what a restart from disk goes
/// back to).
async fn snapshot(conn: &mut groupcast::store::RedisConn) -> BTreeMap<String, Vec<u8>> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("keys");
    let mut all = BTreeMap::new();
    for key in keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(conn)
            .await
            .expect("dump");
        all.extend(dump.map(|d| (key, d)));
    }
    all
}

/// Puts the server back to `snapshot` in one step: a restart from an AOF
/// that lost everything written since.
async fn roll_back(conn: &mut groupcast::store::RedisConn, snapshot: &BTreeMap<String, Vec<u8>>) {
    let now: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("keys");
    let mut restore = redis::pipe();
    restore.atomic();
    for key in now.iter().filter(|k| !snapshot.contains_key(*k)) {
        restore.del(key).ignore();
    }
    for (key, dump) in snapshot {
        restore.del(key).ignore();
        restore
            .cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(dump.as_slice())
            .ignore();
    }
    let _: () = restore.query_async(conn).await.expect("restore");
}

/// A poll in hand outlives the send it came from: Redis goes back to before
/// the generation's `send_triggered` (and the poll's own entry, and the
/// send's acknowledgement) while a worker waits in place between two reads
/// of the group. The poll then finds the group finished, and records
/// nothing (`completed.lua` answers `not_sent`); the send item, pending
/// again, is redelivered, finds the group sent and records the send, whose
/// own poll completes the generation: the log shows the send before the
/// completion, and verify finds nothing but the lost writes. Before, the
/// poll recorded the group finished with no send on record and the batch
/// reported; verify failed it (invariant 2, "batch reported but generation
/// never sent"; chaos `chaos_waitaof_everysec`, seed 1796506387171339083).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_that_outlives_its_send_records_nothing_and_the_send_is_recorded_again() {
    use groupcast::projection::{event_key, field};
    let config = WorkerConfig {
        // Reads of a sent group wait in place (up to a second each) rather
        // than going through the delayed set: the poll stays in hand.
        poll_interval: Duration::from_secs(2),
        // The send's entry, pending again after the roll-back, is
        // redelivered only once the poll has read the group finished (1.5 s
        // after the send): first the poll finds no send on record.
        visibility_timeout: Duration::from_secs(8),
        ..window_config()
    };
    let mock = groupcast_rigs::mock::MockConfig {
        complete_after: Duration::from_millis(1500),
        ..common::mock_config()
    };
    let rig = rig_on_own_server(1, config, mock).await;
    let batch = "poll-outlives-send".to_string();
    let chunks =
        groupcast::producer::cut(&batch, &common::template(), common::recipients(0, 10), 10);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    let log = rig.store.batch(&batch);
    let mut conn = rig.store.raw_conn();
    let has = |name: String| recorded(&log, name);
    // What the disk holds: the send claimed, its item pending, nothing sent
    // (the send sleeps out its window, 2 s, before the provider call).
    common::wait_until(Duration::from_secs(30), "the send claimed", || {
        has(field::key(&event_key::claim(0)))
    })
    .await;
    let before = snapshot(&mut conn).await;
    assert!(
        !has(field::key(&event_key::send(0))).await,
        "the snapshot came after the send was recorded"
    );
    // Sent, and its poll read from the work stream (out of the delayed
    // set, nothing left to deliver): in hand, reading the group in place,
    // which stays SENDING for 1.5 s.
    common::wait_until(Duration::from_secs(30), "the send recorded", || {
        has(field::key(&event_key::send(0)))
    })
    .await;
    let keys = Keyspace::new("gct", 1);
    let (delayed, work) = (keys.delayed(0), keys.work(0));
    common::wait_until(Duration::from_secs(30), "the poll in hand", || {
        let mut conn = rig.store.raw_conn();
        let (delayed, work) = (delayed.clone(), work.clone());
        async move {
            let scheduled: u64 = redis::cmd("ZCARD")
                .arg(&delayed)
                .query_async(&mut conn)
                .await
                .unwrap_or(1);
            let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&work)
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            let delivered = !groups.is_empty()
                && groups
                    .iter()
                    .all(|g| g.get("lag") == Some(&redis::Value::Int(0)));
            scheduled == 0 && delivered
        }
    })
    .await;
    roll_back(&mut conn, &before).await;
    // The premise: the provider could not have answered the poll COMPLETE
    // yet, so it was still to record the completion.
    let sent_at = rig.mock.ledger().groups[0].sent_at_ms.expect("sent");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    assert!(
        now.saturating_sub(sent_at) < 1500,
        "rolled back {} ms after the send: the poll may have finished",
        now.saturating_sub(sent_at)
    );
    assert!(!has(field::key(&event_key::send(0))).await);
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    let ledger = rig.mock.ledger();
    assert_eq!(ledger.groups.len(), 1);
    assert_eq!(ledger.groups[0].send_calls.len(), 1, "sent once");
    // The send recorded again, before the completion (invariant 2).
    reported_failing_only_integrity(&rig, &batch).await;
    rig.stop().await;
}

/// Reading acknowledged events back (`witness::check`): events still there
/// cost one `HMGET` per batch and are not reported; an event under another
/// entry id, or gone, is; a batch whose whole state is gone only counts
/// when no retention could have expired it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_events_back_finds_what_is_gone_in_one_read_when_nothing_is() {
    use groupcast::store::durability::witness::{check, Witnesses};
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server).await;
    let a = event(&store, "wit-a", "stalled/1").await;
    let b = event(&store, "wit-b", "stalled/1").await;
    let witnesses = Witnesses::default();
    for (batch, f) in [("wit-a", &a), ("wit-b", &b)] {
        let key = f.field.trim_start_matches("k:");
        witnesses.record(batch, &f.state, key, &f.id);
    }
    let all = witnesses.due(Duration::ZERO);
    let commands = |info: String| -> u64 {
        info.lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter(|l| !l.starts_with("info:"))
            .filter_map(|l| l.split("calls=").nth(1))
            .filter_map(|r| r.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    let before = commands(store.info("commandstats").await.expect("info"));
    assert!(check(&store, &all, false).await.expect("check").is_empty());
    let after = commands(store.info("commandstats").await.expect("info"));
    assert_eq!(after - before, 2, "one HMGET per batch, nothing else");
    // Another entry id under a's key: lost.
    let other = groupcast::store::durability::witness::Witness {
        id: "1-1".into(),
        ..all[0].clone()
    };
    let lost = check(&store, &[other, all[1].clone()], false)
        .await
        .expect("check");
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].now.as_deref(), Some(a.id.as_str()));
    // b's whole state gone: lost, unless its retention may have expired it.
    let _: () = redis::cmd("DEL")
        .arg(&b.state)
        .query_async(&mut store.raw_conn())
        .await
        .expect("del");
    let lost = check(&store, &all, false).await.expect("check");
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].witness.batch, "wit-b");
    assert_eq!(lost[0].now, None);
    assert!(check(&store, &all, true).await.expect("check").is_empty());
}

/// The retry of a load under a durability wait (`retry_later` with
/// `LoadHolds`) happens only while the chunk is still assigned to the
/// load's generation and that generation still has the load's group: a
/// restart from disk during the wait can take either away, and acking the
/// delivery then would lose the chunk for good. When they do not hold,
/// nothing is written or acknowledged: the delivery stays pending.
#[tokio::test(flavor = "current_thread")]
async fn a_load_retried_after_its_facts_are_gone_stays_pending() {
    use groupcast::store::queue::{DelayedEntry, LoadHolds, Rescheduled};
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server).await;
    let mut conn = store.raw_conn();
    let (stream, group, delayed) = ("gct:test:ingest", "loaders", "gct:test:delayed");
    let state = store.batch("holds").keys.state.clone();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("xgroup");
    let entry = DelayedEntry {
        op: "load".into(),
        d: b"chunk".to_vec(),
        c: None,
        lane: Default::default(),
    };
    let holds = LoadHolds {
        state: &state,
        seq: 4,
        gen: 2,
        group: "G-2",
    };
    let set = |fields: &[(&str, &str)]| {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(&state);
        for (f, v) in fields {
            cmd.arg(*f).arg(*v);
        }
        cmd
    };
    // (what the state hash holds, why the load no longer holds)
    let gone: [(&[(&str, &str)], &str); 3] = [
        (&[("g:2:group", "G-2")], "the chunk is not assigned"),
        (
            &[("s:4", "3|10|abc"), ("g:2:group", "G-2")],
            "the chunk is assigned to another generation",
        ),
        (
            &[("s:4", "2|10|abc"), ("g:2:group", "G-other")],
            "the generation has another group",
        ),
    ];
    for (fields, why) in gone {
        let _: () = redis::cmd("DEL")
            .arg(&state)
            .query_async(&mut conn)
            .await
            .expect("del");
        let _: () = set(fields).query_async(&mut conn).await.expect("hset");
        let id = deliver(&mut conn, stream, group).await;
        let r = store
            .retry_later(delayed, stream, group, &id, 0, &entry, None, Some(holds))
            .await
            .expect("retry_later");
        assert_eq!(r, Rescheduled::LoadGone, "{why}");
        assert!(
            pending_ids(&mut conn, stream, group).await.contains(&id),
            "{why}: the delivery must stay pending"
        );
        let scheduled: u64 = redis::cmd("ZCARD")
            .arg(delayed)
            .query_async(&mut conn)
            .await
            .expect("zcard");
        assert_eq!(scheduled, 0, "{why}: nothing scheduled");
    }
    // The load holds: scheduled, and the delivery acknowledged.
    let _: () = set(&[("s:4", "2|10|abc"), ("g:2:group", "G-2")])
        .query_async(&mut conn)
        .await
        .expect("hset");
    let id = deliver(&mut conn, stream, group).await;
    let r = store
        .retry_later(delayed, stream, group, &id, 0, &entry, None, Some(holds))
        .await
        .expect("retry_later");
    assert_eq!(r, Rescheduled::Scheduled);
    assert!(!pending_ids(&mut conn, stream, group).await.contains(&id));
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(delayed)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("zrange");
    assert_eq!(members, vec![entry.encode()]);
}

/// A restart from disk while a chunk's load sleeps out the window, taking
/// back the chunk's accept (its assignment, the dedupe of its numbers, its
/// event): the load finds its facts gone and the chunk is accepted again;
/// the batch still reports, with every recipient registered once. (Before,
/// the load was retried as a work item and its ingest entry acknowledged;
/// that item found itself stale and was dropped, and the chunk was lost for
/// good: chaos everysec, seed 1796230546767886180.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_whose_accept_is_lost_while_its_load_waits_is_accepted_again() {
    use groupcast::projection::{event_key, field};
    let rig = window_rig().await;
    let batch = "accept-lost".to_string();
    let chunks =
        groupcast::producer::cut(&batch, &common::template(), common::recipients(0, 20), 10);
    assert_eq!(chunks.len(), 2);
    let log = rig.store.batch(&batch);
    let mut conn = rig.store.raw_conn();
    let has = |name: String| recorded(&log, name);
    // Chunk 0 first, through its group's creation and its load: chunk 1
    // then finds the group and loads straight from its ingest entry.
    groupcast::producer::append_chunks(&rig.store, &chunks[..1])
        .await
        .expect("append chunk 0");
    let loaded_0 = field::key(&event_key::loaded(0, 0));
    common::wait_until(Duration::from_secs(30), "chunk 0 loaded", || {
        has(loaded_0.clone())
    })
    .await;
    // What the disk holds before chunk 1's accept: the batch's keys.
    let keys = [
        log.keys.state.clone(),
        log.keys.events.clone(),
        log.keys.numbers.clone(),
    ];
    let mut before = Vec::new();
    for key in &keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("dump");
        before.push((key.clone(), dump));
    }
    groupcast::producer::append_chunks(&rig.store, &chunks[1..])
        .await
        .expect("append chunk 1");
    // The accept comes right before the load's wait (2 s): while it
    // sleeps, the server goes back to what it held before the accept.
    common::wait_until(Duration::from_secs(30), "chunk 1 assigned", || {
        has(field::assignment(1))
    })
    .await;
    let mut restore = redis::pipe();
    restore.atomic();
    for (key, dump) in &before {
        restore.del(key).ignore();
        if let Some(dump) = dump {
            restore
                .cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(dump.as_slice())
                .ignore();
        }
    }
    let _: () = restore.query_async(&mut conn).await.expect("restore");
    assert!(
        !has(field::assignment(1)).await,
        "chunk 1's accept rolled back"
    );
    // The premise: the rollback came while chunk 1's load still slept,
    // before its add (the provider holds chunk 0's numbers only).
    let held: usize = rig
        .mock
        .ledger()
        .groups
        .iter()
        .map(|g| g.messages.len())
        .sum();
    assert_eq!(
        held, 10,
        "chunk 1 was added before its accept was rolled back"
    );
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    let ledger = rig.mock.ledger();
    let sent: Vec<_> = ledger
        .groups
        .iter()
        .filter(|g| !g.send_calls.is_empty())
        .collect();
    assert_eq!(sent.len(), 1, "one group sent");
    assert_eq!(sent[0].send_calls.len(), 1, "sent once");
    assert_eq!(
        sent[0].messages.len(),
        20,
        "every recipient registered once"
    );
    // And the report is truthful: the provider's count of the batch's
    // numbers and its own invariants; invariants 1-7 from our events. The
    // log's integrity (invariant 0) names the acknowledged writes the
    // rollback took away: nothing else.
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 20)]));
    reported_failing_only_integrity(&rig, &batch).await;
    rig.stop().await;
}

/// An entry's acknowledgement under a durability wait
/// (`Store::ack_recorded`): made only while the last event its handling
/// appended is still recorded under the entry id Redis answered. Redis
/// restarting from an AOF that missed its last second between that answer
/// and the `XACK` (emulated by taking the event's state field away, or
/// appending it again) must leave the entry pending, to be handled again:
/// acknowledged, its effect gone, nothing would ever redo it (chaos
/// everysec, seed 1796327854399039636: a parked chunk vanished, and its
/// generation was never sent). The handling's last event is the one
/// `noting_appended` answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_waits_on_the_last_event_its_handling_appended() {
    use groupcast::store::durability::witness::{noting_appended, LastAppended};
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server).await;
    let mut conn = store.raw_conn();
    // The stream and the batches of one shard (one slot on a cluster).
    let stream = store.keys.ingest(0);
    let group = "loaders";
    store.ensure_group(&stream, group).await.expect("group");
    // What a handling appended: the last of its events, not the first.
    let log = store.batch("ack-a");
    let stalled = Event::BatchStalled(BatchStalled {
        quiet_since_ms: 1,
        quiet_for_ms: 2,
    });
    let ((), last) = noting_appended(async {
        log.append("stalled/1", &stalled).await.expect("append");
        log.append("stalled/2", &stalled).await.expect("append");
    })
    .await;
    let last = last.expect("the handling appended events");
    let recorded = log
        .fields(&["k:stalled/2".to_string()])
        .await
        .expect("read")[0]
        .clone();
    assert_eq!(
        (
            last.state.as_str(),
            last.key.as_str(),
            Some(last.id.clone())
        ),
        (log.keys.state.as_str(), "stalled/2", recorded)
    );
    let ((), none) = noting_appended(async {}).await;
    assert_eq!(none, None, "a handling that appended nothing");
    let other = event(&store, "ack-b", "stalled/1").await;
    let other = LastAppended {
        state: other.state,
        key: "stalled/1".into(),
        id: other.id,
    };
    // Five deliveries, each pending for consumer `w`.
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(deliver(&mut conn, &stream, group).await);
    }
    // Batch a's event appended again after a loss (another entry id), and
    // batch b's event gone.
    let again = LastAppended {
        id: "1-1".into(),
        ..last.clone()
    };
    let gone = LastAppended {
        key: "stalled/9".into(),
        ..other.clone()
    };
    let acks = vec![
        (ids[0].clone(), None),
        (ids[1].clone(), Some(last.clone())),
        (ids[2].clone(), Some(other.clone())),
        (ids[3].clone(), Some(again)),
        (ids[4].clone(), Some(gone)),
    ];
    let kept = store
        .ack_recorded(&stream, group, &acks)
        .await
        .expect("ack_recorded");
    assert_eq!(kept, vec![ids[3].clone(), ids[4].clone()]);
    let pending = pending_ids(&mut conn, &stream, group).await;
    assert_eq!(pending, vec![ids[3].clone(), ids[4].clone()]);
    // A dead letter waits on the same condition: not written while the
    // event is gone (the entry stays pending), written once it holds.
    let dlq = store.keys.dead_letters(0);
    let letter = [("reason".to_string(), b"refused".to_vec())];
    let gone = LastAppended {
        key: "stalled/9".into(),
        ..other.clone()
    };
    let none = store
        .dead_letter(&dlq, &stream, group, &ids[3], &letter, Some(&gone))
        .await
        .expect("dead_letter");
    assert_eq!(none, None);
    let written = store
        .dead_letter(&dlq, &stream, group, &ids[4], &letter, Some(&other))
        .await
        .expect("dead_letter");
    assert!(written.is_some());
    let letters: u64 = redis::cmd("XLEN")
        .arg(&dlq)
        .query_async(&mut conn)
        .await
        .expect("xlen");
    assert_eq!(letters, 1);
    let pending = pending_ids(&mut conn, &stream, group).await;
    assert_eq!(pending, vec![ids[3].clone()]);
}

/// Appends an entry to `stream` and delivers it to consumer `w` of
/// `group`: one pending delivery. Returns its id.
async fn deliver(conn: &mut groupcast::store::RedisConn, stream: &str, group: &str) -> String {
    let id: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("v")
        .arg("1")
        .query_async(conn)
        .await
        .expect("xadd");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("w")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(stream)
        .arg(">")
        .query_async(conn)
        .await
        .expect("xreadgroup");
    id
}

/// The ids of the entries of `stream` pending in `group`.
async fn pending_ids(
    conn: &mut groupcast::store::RedisConn,
    stream: &str,
    group: &str,
) -> Vec<String> {
    let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(100)
        .query_async(conn)
        .await
        .expect("xpending");
    pending.into_iter().map(|(id, ..)| id).collect()
}
