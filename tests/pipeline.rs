//! The group-send pipeline end to end: real Redis, the mock provider, many
//! workers; invariants checked from the provider's ledger and our events.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use groupcast::producer::append_chunks;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shuffled_duplicated_chunks_of_three_batches_on_eight_workers() {
    let rig = Rig::start(8, test_config(), mock_config()).await;
    let batches: Vec<(String, usize)> = (0..3)
        .map(|k| (format!("camp-{k}"), 2_000 + 500 * k))
        .collect();
    scenarios::shuffled_duplicated_batches(&rig, &batches, 150, Duration::from_secs(60)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cap_rollover_keeps_every_generation_under_the_cap() {
    let config = groupcast::worker::WorkerConfig {
        group_cap: 1_000,
        ..test_config()
    };
    let rig = Rig::start(4, config, mock_config()).await;
    scenarios::cap_rollover(&rig, "rollover", Duration::from_secs(60)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provider_faults_do_not_break_invariants_or_dead_letter_anything() {
    let mut mock = mock_config();
    mock.faults = groupcast_rigs::mock::Faults {
        error_rate: 0.2,
        drop_rate: 0.1,
        rate_limit_per_sec: Some(40),
        retry_after_secs: 1,
        ..groupcast_rigs::mock::Faults::default()
    };
    let rig = Rig::start(4, test_config(), mock).await;
    let mut all = Vec::new();
    let mut expected = BTreeMap::new();
    let batches: Vec<String> = (0..3).map(|k| format!("faulty-{k}")).collect();
    for (k, b) in batches.iter().enumerate() {
        all.extend(shuffled_chunks(b, 10 + k as u32, 1_500, 100, 40 + k as u64));
        expected.insert(b.clone(), 1_500);
    }
    shuffle(&mut all, 7);
    append_chunks(&rig.store, &all).await.expect("append");
    rig.wait_reported(&batches, Duration::from_secs(120)).await;
    rig.verify(&batches).await;
    rig.check_ledger(&expected);
    let faults = rig.mock.ledger_summary().totals.faults;
    assert!(
        faults.errors > 0 && faults.drops > 0 && faults.rate_limited > 0,
        "faults were injected: {faults:?}"
    );
    assert_eq!(
        dead_letters(&rig.store).await,
        vec![],
        "nothing a retry could save is dead-lettered"
    );
    rig.stop().await;
}

/// `--rate-limit auto` (the default): the workers start unpaced against a
/// provider that takes 50 requests a second, learn a rate from its 429s
/// (300, then halved while the 429s go on) and keep to it together; the
/// batch ends exact, nothing is dead-lettered, and the rate they settle on
/// is one the provider accepts, not the lowest the halving could reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_learn_the_providers_rate_from_its_429s() {
    let mut mock = mock_config();
    mock.faults.rate_limit_per_sec = Some(50);
    mock.faults.retry_after_secs = 1;
    let config = groupcast::worker::WorkerConfig {
        rate_limit: groupcast::worker::RateLimit::Auto,
        ..test_config()
    };
    let rig = Rig::start(4, config, mock).await;
    let batch = "learns-the-rate".to_owned();
    append_chunks(&rig.store, &shuffled_chunks(&batch, 3, 4_000, 20, 5))
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(120))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 4_000)]));
    assert_eq!(dead_letters(&rig.store).await, vec![]);
    let faults = rig.mock.ledger_summary().totals.faults;
    assert!(
        faults.rate_limited > 0,
        "the provider pushed back: {faults:?}"
    );
    let learned = rig
        .store
        .learned_rate(&rig.store.keys.learned_rate())
        .await
        .expect("hget")
        .expect("the workers learned a rate from the 429s");
    assert!(
        (2..=50).contains(&learned),
        "the rate learned ({learned}/s) is one the provider (50/s) accepts, \
         reached without halving all the way down"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_send_run_by_two_workers_at_once_sends_once() {
    use groupcast::events::{ChunkLoaded, Event};
    use groupcast::store::batch::{Accepted, GroupRecord};
    use groupcast::worker::ops::{send_group, Outcome, WorkItem};
    use groupcast::worker::Ctx;

    let mut mock = mock_config();
    // Latency so that both workers pass the marker and the provider's
    // PENDING check before either one's send lands.
    mock.faults.latency_ms = 150;
    let rig = Rig::start(0, test_config(), mock).await;
    let batch = "twice";
    let log = rig.store.batch(batch);
    let chunk = groupcast::producer::cut(batch, &template(), recipients(3, 50), 50).remove(0);
    let Accepted::Assigned { gen: 0, .. } = log
        .accept(0, true, 50, &chunk.digest(), 1_000)
        .await
        .expect("accept")
    else {
        panic!("first chunk is assigned to generation 0")
    };
    let group = rig
        .provider
        .create_group(&BTreeMap::new())
        .await
        .expect("create");
    assert_eq!(
        log.record_group(0, &group.group_id).await.expect("record"),
        GroupRecord::Won
    );
    let msgs = groupcast::provider::add_body::messages(&chunk);
    rig.provider
        .add_messages(&group.group_id, &msgs)
        .await
        .expect("add");
    let loaded = ChunkLoaded {
        gen: 0,
        seq: 0,
        group_id: group.group_id.clone(),
        registered: 50,
        duplicates: 0,
        failed: vec![],
        given_up: None,
    };
    assert_eq!(
        log.loaded(&loaded).await.expect("loaded"),
        Some(true),
        "the generation is ready"
    );

    let item = WorkItem {
        batch: batch.into(),
        gen: 0,
        seq: None,
        group_id: None,
        attempt: 0,
        since: 0,
        poll_delay_ms: 0,
        cursor: None,
    };
    let a = Ctx::new(rig.store.clone(), rig.provider.clone(), rig.config.clone());
    let b = Ctx::new(rig.store.clone(), rig.provider.clone(), rig.config.clone());
    let (ra, rb) = tokio::join!(
        send_group::run(&a, Default::default(), &item),
        send_group::run(&b, Default::default(), &item)
    );
    assert_eq!(ra.expect("a"), Outcome::Done);
    assert_eq!(rb.expect("b"), Outcome::Done);

    let ledger = rig.mock.ledger_summary();
    let g = ledger
        .groups
        .iter()
        .find(|g| g.group_id == group.group_id)
        .expect("group in ledger");
    let statuses: Vec<u16> = g.send_calls.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "one send reached the provider as 200: {statuses:?}"
    );
    assert_eq!(
        statuses.len(),
        2,
        "both workers really raced to the provider: {statuses:?}"
    );
    let sends = log
        .events()
        .await
        .expect("events")
        .into_iter()
        .filter(|r| matches!(r.as_ref().map(|r| &r.event), Ok(Event::SendTriggered(_))))
        .count();
    assert_eq!(sends, 1, "one send event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_between_add_and_loaded_is_reclaimed_into_the_same_group() {
    use groupcast::events::Event;
    use groupcast::keys::LOADERS_GROUP;
    use groupcast::store::batch::{Accepted, GroupRecord};
    use groupcast::store::queue::read_group;

    let config = groupcast::worker::WorkerConfig {
        visibility_timeout: Duration::from_millis(500),
        ..test_config()
    };
    let mut rig = Rig::start(0, config, mock_config()).await;
    let batch = "killed";
    let chunk = groupcast::producer::cut(batch, &template(), recipients(4, 500), 500).remove(0);
    append_chunks(&rig.store, std::slice::from_ref(&chunk))
        .await
        .expect("append");
    let ingest = rig.store.keys.ingest(0);
    rig.store
        .ensure_group(&ingest, LOADERS_GROUP)
        .await
        .expect("group");

    // The doomed worker takes the entry, accepts the chunk, gets a group,
    // adds every message... and dies before its "loaded" event and its ack.
    let mut conn = rig.store.blocking().await.expect("conn");
    let taken = read_group(
        &mut conn,
        LOADERS_GROUP,
        "doomed-worker",
        std::slice::from_ref(&ingest),
        1,
        100,
    )
    .await
    .expect("read");
    assert_eq!(taken.len(), 1);
    let log = rig.store.batch(batch);
    assert!(matches!(
        log.accept(0, true, 500, &chunk.digest(), 1_000_000)
            .await
            .expect("accept"),
        Accepted::Assigned {
            gen: 0,
            group: None,
            ..
        }
    ));
    let fields = BTreeMap::from([
        ("batchId".to_string(), batch.to_string()),
        ("generation".to_string(), "0".to_string()),
    ]);
    let group = rig.provider.create_group(&fields).await.expect("create");
    assert_eq!(
        log.record_group(0, &group.group_id).await.expect("record"),
        GroupRecord::Won
    );
    let first = rig
        .provider
        .add_messages(
            &group.group_id,
            &groupcast::provider::add_body::messages(&chunk),
        )
        .await
        .expect("add");
    assert_eq!(first.len(), 500);

    // A live worker reclaims the entry after the visibility timeout.
    rig.add_worker().await;
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(30))
        .await;
    rig.verify(&[batch.to_string()]).await;
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 500)]));
    let ledger = rig.mock.ledger();
    let g = ledger
        .groups
        .iter()
        .find(|g| g.group_id == group.group_id)
        .expect("the same group");
    let dup = g
        .messages
        .iter()
        .filter(|m| m.status_code == "1026")
        .count();
    assert_eq!(
        dup, 500,
        "the re-add landed in the same group, answered 1026"
    );
    let loaded: Vec<_> = log
        .events()
        .await
        .expect("events")
        .into_iter()
        .filter_map(|r| match r.map(|r| r.event) {
            Ok(Event::ChunkLoaded(e)) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(loaded.len(), 1);
    assert_eq!((loaded[0].registered, loaded[0].duplicates), (500, 500));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_ingest_entries_are_dead_lettered_and_other_batches_are_unaffected() {
    use groupcast::events::ENVELOPE_VERSION;
    use groupcast::producer::{append_raw, ingest_fields};

    let rig = Rig::start(2, test_config(), mock_config()).await;
    let ingest = rig.store.keys.ingest(0);
    let raw = |fields: Vec<(&str, Vec<u8>)>| {
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Vec<_>>()
    };
    let fields_of = |c: &groupcast::events::Chunk| raw(ingest_fields(c).to_vec());

    // A batch that completes, then gets bad company.
    let base = groupcast::producer::cut("target", &template(), recipients(20, 400), 100);
    append_chunks(&rig.store, &base).await.expect("append");
    rig.wait_reported(&["target".to_string()], Duration::from_secs(30))
        .await;
    // A good batch in flight alongside the bad entries.
    let good = shuffled_chunks("bystander", 21, 2_000, 200, 3);
    append_chunks(&rig.store, &good).await.expect("append");

    append_raw(
        &rig.store,
        &ingest,
        &raw(vec![
            ("v", b"1".to_vec()),
            ("t", b"chunk".to_vec()),
            ("d", b"\xc1\xff garbage".to_vec()),
        ]),
    )
    .await
    .expect("raw");
    let mut v9 = fields_of(&base[0]);
    v9[0].1 = b"9".to_vec();
    append_raw(&rig.store, &ingest, &v9).await.expect("raw");
    let mut beyond = base[0].clone();
    beyond.seq = 7;
    beyond.last = false;
    append_raw(&rig.store, &ingest, &fields_of(&beyond))
        .await
        .expect("raw");
    // A batch whose last seq is 3, then a chunk 1 also flagged last.
    let unfinished = groupcast::producer::cut("unfinished", &template(), recipients(22, 40), 10);
    append_chunks(&rig.store, &[unfinished[0].clone(), unfinished[3].clone()])
        .await
        .expect("append");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while rig
        .store
        .batch("unfinished")
        .state()
        .await
        .expect("state")
        .int("seqs")
        < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "chunks 0 and 3 of `unfinished` were not accepted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut second_last = unfinished[1].clone();
    second_last.last = true;
    append_raw(&rig.store, &ingest, &fields_of(&second_last))
        .await
        .expect("raw");
    let mut conflicting = base[1].clone();
    conflicting.recipients = recipients(23, 100);
    append_raw(&rig.store, &ingest, &fields_of(&conflicting))
        .await
        .expect("raw");
    assert_eq!(ENVELOPE_VERSION, "1");

    rig.wait_reported(&["bystander".to_string()], Duration::from_secs(30))
        .await;
    // `target` has reported: its two late chunks are counted on it, not
    // dead-lettered.
    wait_until(
        Duration::from_secs(20),
        "target's two late chunks counted",
        || async {
            let st = rig.store.batch("target").state().await.expect("state");
            st.int(groupcast::projection::field::AFTER_END) == 2
        },
    )
    .await;
    // Bounded wait for the three dead letters.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let d = dead_letters(&rig.store).await;
        if d.len() >= 3 || std::time::Instant::now() > deadline {
            break d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reasons: Vec<&str> = letters.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(letters.len(), 3, "{reasons:#?}");
    for expected in [
        "undecodable chunk",
        "unknown envelope version \"9\"",
        "seq 1 is flagged last, but seq 3 already was",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(expected)),
            "no dead letter says {expected:?}: {reasons:#?}"
        );
    }
    rig.verify(&["target".to_string(), "bystander".to_string()])
        .await;
    rig.check_ledger(&BTreeMap::from([
        ("target".to_string(), 400),
        ("bystander".to_string(), 2_000),
    ]));
    // Refusals of a batch that has ended leave its record as it was;
    // rejections of a batch in flight are on its record.
    let st = rig.store.batch("target").state().await.expect("state");
    assert_eq!(st.int("rejected"), 0);
    assert_eq!(
        rig.store
            .batch("unfinished")
            .state()
            .await
            .expect("state")
            .int("rejected"),
        1
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_is_delivered_to_the_webhook_until_accepted() {
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    // A webhook that fails its first three calls.
    type Calls = Arc<Mutex<Vec<String>>>;
    async fn hook(State(calls): State<Calls>, headers: HeaderMap) -> StatusCode {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mut c = calls.lock().expect("lock");
        c.push(key);
        if c.len() <= 3 {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        }
    }
    let calls: Calls = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/reports", listener.local_addr().expect("addr"));
    let app = axum::Router::new()
        .route("/reports", post(hook))
        .with_state(calls.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The batch's report only: no delivery tracking, so no delivery report
    // (rigs/tests/delivery.rs and rigs/tests/security/webhooks.rs deliver that one).
    let config = groupcast::worker::WorkerConfig {
        report_webhook: Some(url),
        delivery_window: Duration::ZERO,
        ..test_config()
    };
    let rig = Rig::start(2, config, mock_config()).await;
    let batch = "webhook".to_string();
    append_chunks(&rig.store, &shuffled_chunks(&batch, 40, 500, 100, 9))
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    let log = rig.store.batch(&batch);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while log.state().await.expect("state").get("delivered").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "report never delivered; calls: {:?}",
            calls.lock().expect("lock")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let calls = calls.lock().expect("lock").clone();
    assert_eq!(
        calls.len(),
        4,
        "three refusals, then accepted once: {calls:?}"
    );
    assert!(calls.iter().all(|k| k == "webhook:report"), "{calls:?}");
    assert_eq!(
        log.state().await.expect("state").get("delivered"),
        Some("200")
    );
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.stop().await;
}

/// The maintenance trim skips a stream whose consumer group is as its last
/// trim left it (one `XINFO` instead of three commands), and trims again as
/// soon as anything was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_is_skipped_only_while_nothing_was_acknowledged() {
    use groupcast::keys::{Priority, LOADERS_GROUP};
    let (server, store) = store(1).await;
    let stream = store.keys.ingest_in(0, Priority::Normal);
    store.ensure_group(&stream, LOADERS_GROUP).await.unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for i in 0..3 {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("n")
            .arg(i)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let read: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(LOADERS_GROUP)
        .arg("c")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .unwrap();
    let ids: Vec<String> = groupcast::store::queue::parse_entries(match &read {
        redis::Value::Array(s) => match &s[0] {
            redis::Value::Array(parts) => &parts[1],
            other => panic!("{other:?}"),
        },
        redis::Value::Map(m) => &m[0].1,
        other => panic!("{other:?}"),
    })
    .into_iter()
    .map(|e| e.id)
    .collect();
    assert_eq!(ids.len(), 2);
    let len = |mut conn: redis::aio::MultiplexedConnection| {
        let stream = stream.clone();
        async move {
            redis::cmd("XLEN")
                .arg(&stream)
                .query_async::<u64>(&mut conn)
                .await
                .unwrap()
        }
    };
    let trims = |store: &groupcast::store::Store| {
        let store = store.clone();
        async move {
            let stats = store.info("commandstats").await.unwrap();
            stats
                .lines()
                .find_map(|l| l.strip_prefix("cmdstat_xtrim:calls="))
                .and_then(|l| l.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        }
    };

    // The first entry acknowledged, the second pending, the third unread.
    store
        .ack_all(&stream, LOADERS_GROUP, &ids[..1])
        .await
        .unwrap();
    let mark = store
        .trim_acknowledged_since(&stream, LOADERS_GROUP, None)
        .await
        .unwrap();
    assert!(mark.is_some());
    assert_eq!(len(conn.clone()).await, 2);
    let before = trims(&store).await;

    // Nothing acknowledged since: skipped.
    let again = store
        .trim_acknowledged_since(&stream, LOADERS_GROUP, mark.as_ref())
        .await
        .unwrap();
    assert_eq!(again, mark);
    assert_eq!(trims(&store).await, before);

    // The pending one acknowledged: trimmed, up to the unread one.
    store
        .ack_all(&stream, LOADERS_GROUP, &ids[1..2])
        .await
        .unwrap();
    let after = store
        .trim_acknowledged_since(&stream, LOADERS_GROUP, again.as_ref())
        .await
        .unwrap();
    assert_ne!(after, again);
    assert_eq!(trims(&store).await, before + 1);
    assert_eq!(len(conn.clone()).await, 1);
}

/// A batch's chunks that arrive together, before its first generation has a
/// group: the accept of the first asks for the group, and every chunk, the
/// first among them, waits in the process for it instead of being parked
/// (src/worker/group_wait.rs): none parks. 12 chunks read 4 at a time:
/// parked one by one, the first read alone parks 4; before the accept asked
/// for the group, the first one parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_that_arrive_before_the_group_wait_for_it_instead_of_parking() {
    let config = groupcast::worker::WorkerConfig {
        // A hold of 1 s (a quarter of the visibility timeout, at most 1 s):
        // room for a loaded machine to create the group.
        visibility_timeout: Duration::from_secs(8),
        ..test_config()
    };
    let batch = "together".to_string();
    let chunks = groupcast::producer::cut(&batch, &template(), recipients(91, 1_200), 100);
    assert_eq!(chunks.len(), 12);
    // Appended before the worker starts: its first read takes 4 at once.
    let (server, store) = store(1).await;
    append_chunks(&store, &chunks).await.expect("append");
    let rig = Rig::start_on(server, store, 1, config, mock_config()).await;
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 1_200)]));
    let parked = rig
        .store
        .batch(&batch)
        .events()
        .await
        .expect("events")
        .into_iter()
        .filter(|e| matches!(e, Ok(r) if r.event.type_name() == "chunk_parked"))
        .count();
    assert_eq!(parked, 0, "chunks parked");
    rig.stop().await;
}

/// One batch of one generation whose group the mock finishes
/// `complete_after` its send, polled with `poll_interval`: the server's
/// `ZADD` calls, which count the entries put in the delayed set (the send's
/// first poll, each poll retried through it) and the report's tombstone.
async fn delayed_entries_for_a_group_finished_after(
    batch: &str,
    complete_after: Duration,
    poll_interval: Duration,
) -> u64 {
    let config = groupcast::worker::WorkerConfig {
        poll_interval,
        ..test_config()
    };
    let mock = groupcast_rigs::mock::MockConfig {
        complete_after,
        ..mock_config()
    };
    let rig = Rig::start(1, config, mock).await;
    let batch = batch.to_string();
    let chunks = groupcast::producer::cut(&batch, &template(), recipients(92, 300), 100);
    append_chunks(&rig.store, &chunks).await.expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), 300)]));
    let zadds = command_calls(&rig.store, "zadd").await;
    rig.stop().await;
    zadds
}

/// A group the provider finishes within the polls' backoff is read again in
/// place, not through the delayed set. The mock finishes it 250 ms after
/// its send; the reads come 100 ms after the send, then 200 ms and 400 ms
/// later while those waits are under `--poll-interval` (here 2 s): the
/// send's first poll and the tombstone are the only entries. Through the
/// delayed set, the read at 100 ms would add a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_finished_within_the_polls_backoff_is_read_again_in_place() {
    let zadds = delayed_entries_for_a_group_finished_after(
        "polled",
        Duration::from_millis(250),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(
        zadds, 2,
        "entries put in the delayed set (the first poll, the tombstone)"
    );
}

/// Waits in place stop at 1 s whatever `--poll-interval` is (here 60 s), so
/// that a slow group still goes back through the delayed set, which stamps
/// the batch's heartbeat for the watchdog. The mock finishes the group
/// 2.5 s after its send: reads at 0.1, 0.3, 0.7 and 1.5 s in place, then
/// the next wait (1.6 s) goes through the delayed set: one more entry.
/// Without the cap, the read at 3.1 s came in place too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_in_place_stop_at_a_second_whatever_the_poll_interval() {
    let zadds = delayed_entries_for_a_group_finished_after(
        "polled-slowly",
        Duration::from_millis(2_500),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        zadds, 3,
        "entries put in the delayed set (the first poll, the poll after 1.5 s, the tombstone)"
    );
}

/// A streaming producer that learns its batch's end only after its last
/// chunk: every chunk `last: false` (shuffled, some twice), then a seal;
/// the seal may come before chunks. The batch ends as if its last chunk
/// had been flagged; a seal that contradicts it is refused, changing
/// nothing, and dead-lettered with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_sealed_after_its_chunks_ends_as_if_its_last_chunk_were_flagged() {
    use groupcast::producer::append_seal;
    let rig = Rig::start(4, test_config(), mock_config()).await;
    let batches: Vec<String> = vec!["streamed".into(), "sealed-first".into()];
    let mut expected = BTreeMap::new();
    for (k, b) in batches.iter().enumerate() {
        let mut chunks = shuffled_chunks(b, 20 + k as u32, 3_000, 250, 90 + k as u64);
        for c in &mut chunks {
            c.last = false;
        }
        let top = chunks.iter().map(|c| c.seq).max().expect("chunks");
        if k == 0 {
            append_chunks(&rig.store, &chunks).await.expect("append");
            append_seal(&rig.store, b, top).await.expect("seal");
        } else {
            // Sealed before any chunk arrives.
            append_seal(&rig.store, b, top).await.expect("seal");
            append_chunks(&rig.store, &chunks).await.expect("append");
        }
        expected.insert(b.clone(), 3_000);
    }
    rig.wait_reported(&batches, Duration::from_secs(90)).await;
    rig.verify(&batches).await;
    rig.check_ledger(&expected);
    for b in &batches {
        let p = rig.store.batch(b).state().await.expect("state");
        assert_eq!(p.report(), Some("completed"), "{b}");
    }
    // Another last seq for an ended batch, and for one that knows its end.
    append_seal(&rig.store, "streamed", 3).await.expect("seal");
    let open = "open-ended".to_string();
    let mut chunks = shuffled_chunks(&open, 30, 500, 250, 3);
    chunks.retain(|c| c.seq == 1);
    for c in &mut chunks {
        c.last = true;
    }
    append_chunks(&rig.store, &chunks[..1])
        .await
        .expect("append");
    let log = rig.store.batch(&open);
    wait_until(
        Duration::from_secs(30),
        "seq 1 accepted as last",
        || async { log.state().await.is_ok_and(|p| p.last_seq() == Some(1)) },
    )
    .await;
    append_seal(&rig.store, &open, 7).await.expect("seal");
    let mut want = vec![
        "seal refused: batch streamed was already reported (completed)".to_string(),
        "seal refused: batch open-ended already ends at seq 1, not 7".to_string(),
    ];
    want.sort();
    wait_until(Duration::from_secs(30), "two refused seals", || async {
        dead_letters(&rig.store).await.len() >= 2
    })
    .await;
    let mut got: Vec<String> = dead_letters(&rig.store)
        .await
        .into_iter()
        .map(|(_, reason)| reason)
        .collect();
    got.sort();
    assert_eq!(got, want);
    let p = rig.store.batch(&open).state().await.expect("state");
    assert_eq!(p.last_seq(), Some(1), "the refused seal changed nothing");
    rig.stop().await;
}
