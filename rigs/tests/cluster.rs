//! groupcast on a Redis Cluster: a private 3-master cluster
//! (`groupcast_rigs::redis_cluster`), batches spread over several shards, the same
//! end-to-end scenarios as tests/pipeline.rs, the default settings (the
//! `groupcast` binary with no `--shards`) using every master, a master killed
//! mid-run and restarted, and proof that no script call can cross slots.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use groupcast::cli::{CliError, RedisArgs};
use groupcast::events::{BatchStalled, ChunkLoaded, Event};
use groupcast::keys::{Keyspace, ShardCount, LOADERS_GROUP, OPERATORS_GROUP};
use groupcast::producer::append_chunks;
use groupcast::protocol::GivenUp;
use groupcast::store::batch::{
    Accepted, Appended, Completion, GenerationFailure, GroupRecord, Parked, SendGiveUp,
};
use groupcast::store::queue::{Alive, DelayedEntry};
use groupcast::store::scripts::SCRIPTS;
use groupcast::store::Store;
use groupcast::worker::limiter::Limiter;
use groupcast::worker::WorkerConfig;
use groupcast_rigs::redis_cluster::{hash_slot, RedisCluster};

/// Starts a private cluster, or fails the test saying what is missing.
fn cluster() -> RedisCluster {
    match RedisCluster::start() {
        Ok(c) => c,
        Err(e) => panic!("cluster tests need redis-server and redis-cli: {e}"),
    }
}

async fn store_on(cluster: &RedisCluster, shards: u32) -> Store {
    Store::connect(&cluster.url(), Keyspace::new("gcc", shards))
        .await
        .expect("connect to the private cluster")
}

/// The connection flags of a command run with `--shards` at `shards` and
/// everything else at its default.
fn redis_args(url: &str, prefix: &str, shards: ShardCount) -> RedisArgs {
    RedisArgs {
        url: url.to_string(),
        prefix: prefix.into(),
        shards,
        ca_file: None,
        client_cert_file: None,
        client_key_file: None,
    }
}

/// A store connected the way every `groupcast` command connects, with the
/// default `--shards auto`.
async fn default_store(cluster: &RedisCluster, prefix: &str) -> Store {
    redis_args(&cluster.url(), prefix, ShardCount::Auto)
        .connect()
        .await
        .expect("connect with the default settings")
}

/// Batch names `<prefix>-<i>`, `per_master` of them on each master.
fn batches_on_every_master(
    cluster: &RedisCluster,
    keys: &Keyspace,
    prefix: &str,
    per_master: usize,
) -> Vec<String> {
    let mut count = vec![0usize; cluster.len()];
    let mut out = Vec::new();
    for i in 0..10_000 {
        let b = format!("{prefix}-{i}");
        let owner = cluster
            .owner_of_key(&keys.batch(&b).state)
            .expect("slot owner");
        if count[owner] < per_master {
            count[owner] += 1;
            out.push(b);
        }
        if count.iter().all(|&n| n == per_master) {
            return out;
        }
    }
    panic!(
        "no batch names cover every master with {} shards",
        keys.shards()
    );
}

/// One plain connection to a node, bypassing the cluster routing.
fn node_conn(cluster: &RedisCluster, i: usize) -> redis::Connection {
    redis::Client::open(cluster.node_url(i).expect("node"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("connect to node")
}

/// Asserts that each batch's state lives on the master our slot arithmetic
/// says (the node answers EXISTS for it directly), that every master holds
/// some, and that `CLUSTER KEYSLOT` agrees with `hash_slot`.
fn assert_batches_on_every_master(cluster: &RedisCluster, store: &Store, batches: &[String]) {
    let mut masters = BTreeSet::new();
    let mut probe = node_conn(cluster, 0);
    for b in batches {
        let key = store.keys.batch(b).state;
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut probe)
            .expect("CLUSTER KEYSLOT");
        assert_eq!(slot, hash_slot(key.as_bytes()), "slot of {key}");
        let owner = cluster.owner_of_slot(slot).expect("owner");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut node_conn(cluster, owner))
            .expect("EXISTS on the owner");
        assert!(exists, "{key} is not on node {owner}, its slot's owner");
        masters.insert(owner);
    }
    assert_eq!(
        masters.len(),
        cluster.len(),
        "batches landed on masters {masters:?} only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shuffled_duplicated_batches_on_six_shards_of_three_masters() {
    let started = Instant::now();
    let cluster = cluster();
    let store = store_on(&cluster, 6).await;
    let names = batches_on_every_master(&cluster, &store.keys, "ccamp", 3);
    let shards: BTreeSet<u32> = names.iter().map(|b| store.keys.shard_of(b)).collect();
    let batches: Vec<(String, usize)> = names
        .iter()
        .enumerate()
        .map(|(k, b)| (b.clone(), 1_000 + 250 * k))
        .collect();
    let rig = Rig::start_on(cluster, store, 8, test_config(), mock_config()).await;
    scenarios::shuffled_duplicated_batches(&rig, &batches, 150, Duration::from_secs(120)).await;
    assert_batches_on_every_master(&rig.server, &rig.store, &names);
    assert!(shards.len() >= 3, "batches on shards {shards:?}");
    // replay --all finds every batch, whichever master holds it.
    let found = groupcast::cli::replay::all_batches(&rig.store)
        .await
        .expect("scan every master");
    assert_eq!(
        found.into_iter().collect::<BTreeSet<_>>(),
        names.iter().cloned().collect::<BTreeSet<_>>()
    );
    rig.stop().await;
    eprintln!(
        "{} batches on the cluster in {:?}",
        names.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cap_rollover_on_a_cluster() {
    let cluster = cluster();
    let store = store_on(&cluster, 6).await;
    let config = WorkerConfig {
        group_cap: 1_000,
        ..test_config()
    };
    let rig = Rig::start_on(cluster, store, 4, config, mock_config()).await;
    scenarios::cap_rollover(&rig, "rollover", Duration::from_secs(120)).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_mid_run_and_restarted_loses_nothing() {
    let cluster = cluster();
    // The default settings: one shard per master, none moved.
    let store = default_store(&cluster, "gcc").await;
    assert_eq!(store.keys.shards(), 3);
    let names = batches_on_every_master(&cluster, &store.keys, "crash", 3);
    // The victim also holds the shared rate limiter's key: while it is down,
    // no provider call on any master can go. The limit (150 requests/s for
    // some 400 requests) keeps the run going for a few seconds.
    let victim = cluster
        .owner_of_key(&store.keys.limiter())
        .expect("limiter owner");
    let on_victim: Vec<String> = names
        .iter()
        .filter(|b| cluster.owner_of_key(&store.keys.batch(b).state).ok() == Some(victim))
        .cloned()
        .collect();
    let config = WorkerConfig {
        rate_limit: groupcast::worker::RateLimit::PerSecond(150),
        rate_burst: 10,
        ..test_config()
    };
    // Workers start once everything is appended, so that the kill below
    // lands while every batch is still in flight.
    let mut rig = Rig::start_on(cluster, store, 0, config, mock_config()).await;
    let mut all = Vec::new();
    let mut expected = BTreeMap::new();
    for (k, b) in names.iter().enumerate() {
        all.extend(shuffled_chunks(b, 30 + k as u32, 3_000, 150, 7 + k as u64));
        expected.insert(b.clone(), 3_000);
    }
    shuffle(&mut all, 3);
    append_chunks(&rig.store, &all).await.expect("append");
    for _ in 0..4 {
        rig.add_worker().await;
    }

    // Kill the victim while one of its batches is loading (some recipients
    // registered, no report yet).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (mut loading, mut reported) = (0, 0);
        for b in &on_victim {
            let st = rig.store.batch(b).state().await.expect("state");
            if st.get("report").is_some() {
                reported += 1;
            } else if st.int("registered") > 0 {
                loading += 1;
            }
        }
        if loading > 0 {
            break;
        }
        assert!(
            reported < on_victim.len(),
            "the victim's batches all reported before the kill"
        );
        assert!(
            Instant::now() < deadline,
            "no progress on the victim's batches"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rig.server.kill(victim).expect("kill");
    // Down long enough for every worker to hit it (reads, scripts, the
    // limiter), shorter than the cluster's node timeout (5 s).
    let down = Instant::now();
    let probe = redis::Client::open(rig.server.node_url(victim).expect("url")).expect("client");
    assert!(
        probe
            .get_connection_with_timeout(Duration::from_millis(200))
            .is_err(),
        "the victim still answers"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.server.restart(victim).expect("restart");
    eprintln!("node {victim} was down for {:?}", down.elapsed());

    rig.wait_reported(&names, Duration::from_secs(180)).await;
    rig.verify(&names).await;
    rig.check_ledger(&expected);
    assert!(
        dead_letters(&rig.store).await.is_empty(),
        "{:?}",
        dead_letters(&rig.store).await
    );
    assert_batches_on_every_master(&rig.server, &rig.store, &names);
    rig.stop_workers().await;
}

/// Every script, and the keys each call site passes it (mirroring
/// src/store/batch.rs, src/store/queue.rs and src/store/coord.rs), for a
/// batch on `shard`: the key lists whose slots must agree.
fn script_calls(keys: &Keyspace, batch: &str) -> Vec<(&'static str, Vec<String>)> {
    let k = keys.batch(batch);
    let s = k.shard;
    let settling = vec![
        k.state.clone(),
        k.events.clone(),
        k.work.clone(),
        k.active.clone(),
        k.reports.clone(),
        k.numbers.clone(),
        k.reported.clone(),
    ];
    vec![
        // The scripts that can end a batch share settle.lua's keys.
        ("accept", settling.clone()),
        ("reject", settling.clone()),
        ("close", settling.clone()),
        ("seal", settling.clone()),
        ("cancel", settling.clone()),
        ("claim_send", settling.clone()),
        ("loaded", settling.clone()),
        ("completed", settling.clone()),
        ("give_up_send", settling.clone()),
        ("fail_generation", {
            let mut keys = settling;
            keys.push(k.parked(3));
            keys
        }),
        (
            "park",
            vec![
                k.state.clone(),
                k.events.clone(),
                k.parked(0),
                k.work.clone(),
            ],
        ),
        (
            "record_group",
            vec![
                k.state.clone(),
                k.events.clone(),
                k.parked(7),
                k.work.clone(),
            ],
        ),
        (
            "sent",
            vec![k.state.clone(), k.events.clone(), k.delayed.clone()],
        ),
        ("append", vec![k.state.clone(), k.events.clone()]),
        // consumer.rs: a dead letter of either source stream of the shard,
        // and (under `everysec`) one waiting on the handling's last event.
        ("dead_letter", vec![keys.dead_letters(s), keys.ingest(s)]),
        ("dead_letter", vec![keys.dead_letters(s), keys.work(s)]),
        (
            "dead_letter after an event",
            vec![keys.dead_letters(s), keys.ingest(s), k.state.clone()],
        ),
        // consumer.rs: acknowledgements waiting on their handlings' last
        // events (batches of the shard).
        ("ack_recorded", vec![keys.ingest(s), k.state.clone()]),
        ("ack_recorded", vec![keys.work(s), k.state.clone()]),
        ("retry_later", vec![keys.delayed(s), keys.ingest(s)]),
        ("retry_later", vec![keys.delayed(s), keys.work(s)]),
        (
            "retry_later with a heartbeat",
            vec![keys.delayed(s), keys.work(s), k.state.clone()],
        ),
        (
            "retry_later with a heartbeat",
            vec![keys.delayed(s), keys.ingest(s), k.state.clone()],
        ),
        ("renew_lease", vec![keys.work(s)]),
        ("renew_lease", vec![keys.ingest(s)]),
        ("restore", vec![k.state.clone(), k.events.clone()]),
        ("note", vec![k.state.clone()]),
        // store/delivery.rs.
        (
            "track_page",
            vec![
                k.state.clone(),
                k.events.clone(),
                k.results.clone(),
                k.delivery.clone(),
            ],
        ),
        (
            "delivered",
            vec![
                k.state.clone(),
                k.events.clone(),
                k.work.clone(),
                k.reports.clone(),
                k.results.clone(),
                k.delivery.clone(),
            ],
        ),
        ("promote", vec![keys.delayed(s), keys.work(s)]),
        ("rate_limit", vec![keys.limiter()]),
        ("learn_rate", vec![keys.learned_rate()]),
        // watchdog.rs.
        ("lease", vec![keys.watchdog_lock()]),
        ("release", vec![keys.watchdog_lock()]),
        ("stalled", vec![k.state.clone(), k.events.clone()]),
    ]
}

#[test]
fn every_script_call_keeps_its_keys_on_one_slot() {
    // Every script in streams/scripts is covered (a new one must be added).
    let listed: BTreeSet<&str> = script_calls(&Keyspace::new("gc", 1), "b")
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../streams/scripts");
    for e in std::fs::read_dir(dir).expect("scripts dir") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if let Some(script) = name.strip_suffix(".lua") {
            if script != "prelude" && script != "settle" {
                assert!(listed.contains(script), "{script}.lua has no slot check");
            }
        }
    }
    // No script is written inline in src: all are files, checked above.
    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../src"
    ))];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).expect("src dir") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .expect("relative")
                .to_string_lossy()
                .into_owned();
            let n = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .matches("Script::new(")
                .count();
            // store/scripts/mod.rs builds the streams/scripts files, checked above.
            if n > 0 && rel != "src/store/scripts/mod.rs" {
                found.push((rel, n));
            }
        }
    }
    assert_eq!(
        found,
        Vec::<(String, usize)>::new(),
        "inline scripts: make them files in streams/scripts, loaded by src/store/scripts/mod.rs"
    );
    // Many shard counts, batches on every shard, several prefixes.
    for prefix in ["gc", "tenant-a", "x"] {
        for shards in [1, 3, 6, 16, 64] {
            let keys = Keyspace::new(prefix, shards);
            let mut seen = BTreeSet::new();
            for i in 0..2_000 {
                let b = format!("batch-{i}");
                if !seen.insert(keys.shard_of(&b)) {
                    continue;
                }
                for (script, call) in script_calls(&keys, &b) {
                    let slots: BTreeSet<u16> =
                        call.iter().map(|k| hash_slot(k.as_bytes())).collect();
                    assert_eq!(slots.len(), 1, "{script} with {call:?}: slots {slots:?}");
                }
            }
            assert_eq!(seen.len() as u32, shards);
        }
    }
}

/// Runs every script through its real call site, for a batch on every shard
/// of the cluster.
async fn run_every_script(store: &Store, round: u32) {
    let limiter = Limiter::new(
        store.clone(),
        groupcast::worker::RateLimit::PerSecond(100_000),
        1_000,
        10,
    );
    for shard in 0..store.keys.shards() {
        let b = (0..)
            .map(|i| format!("scripted-{round}-{i}"))
            .find(|b| store.keys.shard_of(b) == shard)
            .expect("a batch on the shard");
        let log = store.batch(&b);
        let k = &log.keys;
        assert_eq!(
            log.seal(0).await.expect("seal"),
            groupcast::store::batch::Sealing::Sealed(0)
        );
        let accepted = log.accept(0, true, 2, "d0", 1_000).await.expect("accept");
        assert_eq!(
            accepted,
            Accepted::Assigned {
                gen: 0,
                group: None,
                duplicates: vec![]
            }
        );
        assert_eq!(
            log.park(0, 0, b"chunk").await.expect("park"),
            Parked::Parked
        );
        assert_eq!(
            log.record_group(0, "G1").await.expect("record_group"),
            GroupRecord::Won
        );
        // A give-up racing the create that won: nothing given up.
        assert_eq!(
            log.fail_generation(0, "create refused: 403")
                .await
                .expect("fail_generation"),
            GenerationFailure::HasGroup("G1".into())
        );
        let loaded = ChunkLoaded {
            gen: 0,
            seq: 0,
            group_id: "G1".into(),
            registered: 2,
            duplicates: 0,
            failed: Vec::new(),
            given_up: None,
        };
        assert_eq!(log.loaded(&loaded).await.expect("loaded"), Some(true));
        assert!(log
            .sent(0, "G1", "sent", 60_000, b"poll")
            .await
            .expect("sent"));
        // A send given up after it was recorded: nothing given up.
        assert_eq!(
            log.give_up_send(0, GivenUp::Send, "send refused: 403", "G1")
                .await
                .expect("give_up_send"),
            SendGiveUp::Sent
        );
        assert_eq!(
            log.completed(0, "G1", "COMPLETE", 2, 0)
                .await
                .expect("completed"),
            Completion::Reported
        );
        // Delivery tracking of the group, and the delivery report.
        let page = groupcast::store::delivery::PageCounts {
            delivered: 2,
            ..Default::default()
        };
        assert!(log
            .track_page(0, "G1", "", &page, Duration::from_secs(60), &[])
            .await
            .expect("track_page"));
        assert_eq!(
            log.delivered(Some(0), "G1", false, Duration::from_secs(60))
                .await
                .expect("delivered"),
            groupcast::store::delivery::BatchDelivery::Decided
        );
        let stall = Event::BatchStalled(BatchStalled {
            quiet_since_ms: 1,
            quiet_for_ms: 2,
        });
        assert!(matches!(
            log.append("stalled/1", &stall).await.expect("append"),
            Appended::New(_)
        ));
        // The work plumbing of the shard.
        let (ingest, work) = (store.keys.ingest(shard), store.keys.work(shard));
        store
            .ensure_group(&ingest, LOADERS_GROUP)
            .await
            .expect("group");
        store
            .ensure_group(&work, OPERATORS_GROUP)
            .await
            .expect("group");
        let id = store
            .append_entry(&ingest, &[("v".into(), b"0".to_vec())])
            .await
            .expect("xadd");
        store
            .dead_letter(
                &store.keys.dead_letters(shard),
                &ingest,
                LOADERS_GROUP,
                &id,
                &[("reason".into(), b"test".to_vec())],
                None,
            )
            .await
            .expect("dead_letter");
        // Waiting on an event the batch does not have: nothing written,
        // the entries stay pending (both scripts run on the batch's master).
        let missing = groupcast::store::durability::witness::LastAppended {
            state: k.state.clone(),
            key: "never".into(),
            id: "0-1".into(),
        };
        let left = store
            .dead_letter(
                &store.keys.dead_letters(shard),
                &ingest,
                LOADERS_GROUP,
                &id,
                &[("reason".into(), b"test".to_vec())],
                Some(&missing),
            )
            .await
            .expect("dead_letter after an event");
        assert_eq!(left, None);
        let kept = store
            .ack_recorded(&work, OPERATORS_GROUP, &[("0-1".into(), Some(missing))])
            .await
            .expect("ack_recorded");
        assert_eq!(kept, vec!["0-1".to_string()]);
        let entry = DelayedEntry {
            op: "send".into(),
            d: b"item".to_vec(),
            c: None,
            lane: Default::default(),
        };
        store
            .retry_later(
                &k.delayed,
                &work,
                OPERATORS_GROUP,
                "0-1",
                0,
                &entry,
                None,
                None,
            )
            .await
            .expect("retry_later");
        // A different member: the delayed set keeps one score per member.
        let later = DelayedEntry {
            d: b"item-2".to_vec(),
            ..entry.clone()
        };
        store
            .retry_later(
                &k.delayed,
                &work,
                OPERATORS_GROUP,
                "0-2",
                60_000,
                &later,
                Some(Alive::now(&k.state)),
                None,
            )
            .await
            .expect("retry_later with a heartbeat");
        store
            .renew_lease(&work, OPERATORS_GROUP, "nobody", "0-1")
            .await
            .expect("renew_lease");
        assert!(matches!(
            log.rebuild(3).await.expect("restore"),
            groupcast::store::batch::Rebuilt::Replaced { .. }
        ));
        // This retry is due at once (by the node's clock, as promote reads
        // it); the poll sent() scheduled is a minute away.
        assert_eq!(store.promote(shard, 10).await.expect("promote"), 1);
    }
    limiter.acquire(1).await.expect("rate_limit");
    let learned = store
        .learn_rate(
            &store.keys.learned_rate(),
            &groupcast::worker::limiter::LEARNING,
        )
        .await
        .expect("learn_rate");
    // The first 429 sets the first rate; a later round may have halved it.
    assert!((1..=groupcast::worker::WorkerConfig::RATE_AFTER_PUSHBACK).contains(&learned));
}

/// A provider client for contexts that never call the provider.
fn unreachable_provider() -> groupcast::provider::ProviderClient {
    groupcast::provider::ProviderClient::new(groupcast::provider::ProviderConfig {
        base_url: "http://127.0.0.1:9".into(),
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        ..groupcast::provider::ProviderConfig::default()
    })
    .expect("provider client")
}

/// How many `TIME` commands node `i` has answered.
fn time_calls(cluster: &RedisCluster, i: usize) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut node_conn(cluster, i))
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_time:")?
                .split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_durability_wait_reads_the_clock_of_the_batchs_master() {
    // Entry ids carry the clock of the master that appended them: the wait
    // must compare with that master's clock, never with another's.
    let cluster = cluster();
    let store = store_on(&cluster, 6).await;
    let stall = Event::BatchStalled(BatchStalled {
        quiet_since_ms: 1,
        quiet_for_ms: 2,
    });
    for b in batches_on_every_master(&cluster, &store.keys, "clock", 2) {
        let log = store.batch(&b);
        let Appended::New(id) = log.append("stalled/1", &stall).await.expect("append") else {
            panic!("{b}: appended before");
        };
        let owner = cluster.owner_of_key(&log.keys.events).expect("owner");
        let before: Vec<u64> = (0..cluster.len())
            .map(|n| time_calls(&cluster, n))
            .collect();
        let wait = groupcast::worker::ops::durability_wait(&log, Duration::from_secs(60), &[&id])
            .await
            .expect("durability wait");
        // Just appended: nearly the whole minute is left to wait.
        assert!(
            wait.is_some_and(|w| w > Duration::from_secs(50)),
            "{b}: {wait:?}"
        );
        let asked: Vec<u64> = (0..cluster.len())
            .map(|n| time_calls(&cluster, n) - before[n])
            .collect();
        let expected: Vec<u64> = (0..cluster.len()).map(|n| u64::from(n == owner)).collect();
        assert_eq!(
            asked, expected,
            "{b}: TIME per node (its master is {owner})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_runs_on_the_cluster_and_reloads_after_a_flush() {
    let cluster = cluster();
    let store = store_on(&cluster, 6).await;
    // Fresh nodes: every first EVALSHA answers NOSCRIPT and is loaded.
    run_every_script(&store, 0).await;
    let shas = [
        SCRIPTS.accept.get_hash(),
        SCRIPTS.park.get_hash(),
        SCRIPTS.record_group.get_hash(),
        SCRIPTS.loaded.get_hash(),
        SCRIPTS.sent.get_hash(),
        SCRIPTS.completed.get_hash(),
        SCRIPTS.append.get_hash(),
        SCRIPTS.dead_letter.get_hash(),
        SCRIPTS.ack_recorded.get_hash(),
        SCRIPTS.retry_later.get_hash(),
        SCRIPTS.promote.get_hash(),
    ];
    // Every master that owns a shard has every batch script.
    let owners: BTreeSet<usize> = (0..6)
        .map(|s| cluster.owner_of_key(&store.keys.work(s)).expect("owner"))
        .collect();
    for &node in &owners {
        let exists: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&shas[..])
            .query(&mut node_conn(&cluster, node))
            .expect("SCRIPT EXISTS");
        assert!(exists.iter().all(|e| *e), "node {node}: {exists:?}");
    }
    // Forget every script everywhere: the next calls load them again.
    for node in 0..cluster.len() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut node_conn(&cluster, node))
            .expect("SCRIPT FLUSH");
    }
    run_every_script(&store, 1).await;

    // The watchdog's scripts (lease, stall, release) and the per-shard clock:
    // one long-quiet batch on every shard.
    let mut quiet = BTreeSet::new();
    for shard in 0..6 {
        let b = (0..)
            .map(|i| format!("quiet-{i}"))
            .find(|b| store.keys.shard_of(b) == shard)
            .expect("a batch on the shard");
        let log = store.batch(&b);
        log.accept(0, false, 1, "d", 1_000).await.expect("accept");
        let _: () = redis::cmd("HSET")
            .arg(&log.keys.state)
            .arg("hb")
            .arg(1)
            .query_async(&mut store.raw_conn())
            .await
            .expect("age the heartbeat");
        quiet.insert(b);
    }
    let provider = unreachable_provider();
    let ctx = groupcast::worker::Ctx::new(store.clone(), provider, test_config());
    let report = groupcast::worker::watchdog::scan(&ctx)
        .await
        .expect("scan")
        .expect("the lease");
    assert_eq!(
        report.newly_stalled.into_iter().collect::<BTreeSet<_>>(),
        quiet
    );
    groupcast::worker::watchdog::release(&ctx)
        .await
        .expect("release");

    // A call whose keys do cross slots is refused by the cluster: the slot
    // check above is what keeps this from ever happening.
    let a = store.keys.batch("scripted-0-0");
    let other = (0..6)
        .map(|s| store.keys.work(s))
        .find(|w| hash_slot(w.as_bytes()) != hash_slot(a.state.as_bytes()))
        .expect("another slot");
    let err = SCRIPTS
        .append
        .key(&a.state)
        .key(&other)
        .arg("scripted-0-0")
        .invoke_async::<redis::Value>(&mut store.raw_conn())
        .await
        .expect_err("cross-slot keys");
    assert_eq!(err.code(), Some("CROSSSLOT"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_read_neither_times_out_nor_stalls_other_commands() {
    let cluster = cluster();
    let store = store_on(&cluster, 3).await;
    let work = store.keys.work(0);
    store
        .ensure_group(&work, OPERATORS_GROUP)
        .await
        .expect("group");
    let mut blocking = store.blocking().await.expect("blocking connection");
    let streams = [work.clone()];
    let read = tokio::spawn(async move {
        let t = Instant::now();
        let r = groupcast::store::queue::read_group(
            &mut blocking,
            OPERATORS_GROUP,
            "c1",
            &streams,
            10,
            1_500,
        )
        .await;
        (r.map(|v| v.len()), t.elapsed())
    });
    // Meanwhile, commands on the shared connection (the same node included)
    // answer at once.
    let t = Instant::now();
    for i in 0..50 {
        let _: String = redis::cmd("SET")
            .arg(format!("{{s0}}:probe:{i}"))
            .arg(i)
            .query_async(&mut store.raw_conn())
            .await
            .expect("set");
    }
    assert!(
        t.elapsed() < Duration::from_millis(1_000),
        "{:?}",
        t.elapsed()
    );
    let (got, took) = read.await.expect("join");
    assert_eq!(got.expect("blocking read"), 0);
    // It waited its whole BLOCK, past redis-rs' 500 ms default timeout.
    assert!(took >= Duration::from_millis(1_400), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_check_reads_every_master() {
    use groupcast::cli::worker::check_server;
    use groupcast::worker::durability::Durability;
    let cluster = cluster();
    let store = store_on(&cluster, 3).await;
    // The harness runs noeviction and appendfsync always on every node.
    assert!(check_server(&store, Durability::Always).await.is_empty());
    // One master weaker than the others is named.
    let port = cluster.ports()[2];
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut node_conn(&cluster, 2))
        .expect("config set");
    let warnings = check_server(&store, Durability::Always).await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&format!(":{port}")) && warnings[0].contains("allkeys-lru"),
        "{warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_redriven_on_every_shard() {
    use groupcast::cli::dlq::{run, DlqAction, DlqArgs, Selection};
    let cluster = cluster();
    let store = store_on(&cluster, 6).await;
    // One dead letter per shard, from its ingest stream (the redrive puts it
    // back and deletes the letter in one MULTI/EXEC: two keys, one slot).
    for shard in 0..6 {
        let ingest = store.keys.ingest(shard);
        store
            .ensure_group(&ingest, LOADERS_GROUP)
            .await
            .expect("group");
        let fields = vec![
            ("reason".to_string(), b"test".to_vec()),
            ("source".to_string(), ingest.as_bytes().to_vec()),
            ("f:v".to_string(), b"1".to_vec()),
            ("f:t".to_string(), b"chunk".to_vec()),
        ];
        store
            .dead_letter(
                &store.keys.dead_letters(shard),
                &ingest,
                LOADERS_GROUP,
                "0-1",
                &fields,
                None,
            )
            .await
            .expect("dead letter");
    }
    assert_eq!(dead_letters(&store).await.len(), 6);
    run(DlqArgs {
        redis: redis_args(&cluster.url(), "gcc", ShardCount::Fixed(6)),
        // The letters hold no payload (a redrive cannot help them): forced.
        action: DlqAction::Redrive {
            select: Selection {
                all: true,
                yes: true,
                ..Selection::default()
            },
            force: true,
        },
    })
    .await
    .expect("redrive");
    assert!(dead_letters(&store).await.is_empty());
    for shard in 0..6 {
        let len: u64 = redis::cmd("XLEN")
            .arg(store.keys.ingest(shard))
            .query_async(&mut store.raw_conn())
            .await
            .expect("xlen");
        assert_eq!(len, 1, "shard {shard}'s ingest stream");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_follow_ask_and_moved_while_a_shard_moves_to_another_master() {
    let cluster = cluster();
    // Connected before the move: its slot map goes stale.
    let store = store_on(&cluster, 3).await;
    let mut conn = store.raw_conn();
    let work = store.keys.work(1);
    let slot = hash_slot(work.as_bytes());
    let to = (cluster.owner_of_slot(slot).expect("owner") + 1) % cluster.len();
    let from = cluster
        .begin_slot_move(slot, to)
        .expect("begin")
        .expect("a move");
    // Mid-move: the old owner answers -ASK for this (absent) key.
    let mut direct = node_conn(&cluster, from);
    let asked: redis::RedisResult<String> = redis::cmd("XADD")
        .arg(&work)
        .arg("*")
        .arg("f")
        .arg("direct")
        .query(&mut direct);
    let err = asked.expect_err("the old owner redirects");
    assert_eq!(err.code(), Some("ASK"), "{err}");
    // The cluster connection follows it (ASKING, then the command).
    let _: String = redis::cmd("XADD")
        .arg(&work)
        .arg("*")
        .arg("f")
        .arg("asked")
        .query_async(&mut conn)
        .await
        .expect("XADD follows ASK");
    // Only the keyless half of a move: the key stays where ASK put it.
    cluster.finish_slot_move(slot, from, to).expect("finish");
    // Now the old owner answers -MOVED, which the connection follows too.
    let _: String = redis::cmd("XADD")
        .arg(&work)
        .arg("*")
        .arg("f")
        .arg("moved")
        .query_async(&mut conn)
        .await
        .expect("XADD follows MOVED");
    let len: u64 = redis::cmd("XLEN")
        .arg(&work)
        .query(&mut node_conn(&cluster, to))
        .expect("XLEN on the new owner");
    assert_eq!(len, 2);
    assert_eq!(cluster.owner_of_key(&work).expect("owner"), to);
    // Scripts follow as well (EVALSHA routed by its first key).
    store.promote(1, 10).await.expect("promote after the move");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_shard_count_puts_one_shard_on_each_master_without_moves() {
    let cluster = cluster();
    let store = default_store(&cluster, "gcd").await;
    assert_eq!(store.keys.shards(), cluster.len() as u32);
    // Recorded for every later process of the deployment.
    let recorded: Option<String> = redis::cmd("GET")
        .arg("gcd:shards")
        .query_async(&mut store.raw_conn())
        .await
        .expect("GET");
    assert_eq!(recorded.as_deref(), Some("3"));
    // Shard k's keys are on master k (the order `--cluster create` gave
    // them their slices), with no slot moved.
    let owners: Vec<usize> = (0..store.keys.shards())
        .map(|k| cluster.owner_of_key(&store.keys.work(k)).expect("owner"))
        .collect();
    assert_eq!(owners, [0, 1, 2]);
    // Twice as many shards would be two per master.
    let keys = Keyspace::new("gcd", 6);
    let owners: Vec<usize> = (0..6)
        .map(|k| cluster.owner_of_key(&keys.work(k)).expect("owner"))
        .collect();
    assert_eq!(owners, [0, 0, 1, 1, 2, 2]);

    // Another process with the default reads the record; one asking for
    // the same count explicitly agrees.
    let again = default_store(&cluster, "gcd").await;
    assert_eq!(again.keys, store.keys);
    let same = redis_args(&cluster.url(), "gcd", ShardCount::Fixed(3))
        .connect()
        .await
        .expect("the recorded count, given explicitly");
    assert_eq!(same.keys, store.keys);
    // One asking for another count is refused, saying what to do.
    match redis_args(&cluster.url(), "gcd", ShardCount::Fixed(6))
        .connect()
        .await
    {
        Err(CliError::Usage(why)) => {
            assert!(why.contains("uses 3 shard(s)"), "{why}");
            assert!(why.contains("redis-cli SET gcd:shards 6"), "{why}");
            assert!(why.contains("drain"), "{why}");
        }
        Ok(_) => panic!("--shards 6 accepted on a deployment of 3"),
        Err(e) => panic!("not a usage error: {e}"),
    }
    // An explicit count on a new deployment (another prefix) is recorded.
    let six = redis_args(&cluster.url(), "gce", ShardCount::Fixed(6))
        .connect()
        .await
        .expect("a new deployment of 6");
    assert_eq!(six.keys.shards(), 6);
    assert_eq!(default_store(&cluster, "gce").await.keys.shards(), 6);
    // A deployment from before the record (one shard, `{s0}`) keeps its
    // keys: `auto` records 1 for it.
    let _: String = redis::cmd("XADD")
        .arg("gco:{s0}:ingest")
        .arg("*")
        .arg("v")
        .arg("1")
        .query_async(&mut store.raw_conn())
        .await
        .expect("XADD");
    let old = default_store(&cluster, "gco").await;
    assert_eq!(old.keys.shards(), 1);
    assert_eq!(old.keys.ingest(0), "gco:{s0}:ingest");
}

/// Runs `groupcast` with the deployment's URL and prefix in the environment.
fn groupcast_cmd(url: &str, prefix: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_groupcast"));
    cmd.env("GROUPCAST_REDIS_URL", url)
        .env("GROUPCAST_PREFIX", prefix)
        .env_remove("GROUPCAST_SHARDS")
        .env_remove("GROUPCAST_LOG");
    cmd
}

/// Kills a child process on drop (a failed assertion must not leave a
/// worker running).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_workers_and_submit_put_batches_on_every_master() {
    let cluster = cluster();
    let url = cluster.url();
    let prefix = "gcu";
    // Batch names that the default count puts on every master (the count
    // is computed here the way the binary does, and checked below).
    let keys = Keyspace::new(prefix, cluster.len() as u32);
    let names = batches_on_every_master(&cluster, &keys, "user", 2);
    // The test's own view, connected before any process recorded a count.
    let store = Store::connect(&url, keys.clone()).await.expect("connect");
    let rig = Rig::start_on(cluster, store, 0, test_config(), mock_config()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    // Two workers with no tuning flags (only no metrics port, which two
    // processes on one machine cannot share).
    let workers: Vec<Child> = (0..2)
        .map(|i| {
            let log = std::fs::File::create(dir.path().join(format!("worker-{i}.log")))
                .expect("log file");
            Child(
                groupcast_cmd(&url, prefix)
                    .args(["worker", "--metrics-listen", "off"])
                    .env("GROUPCAST_PROVIDER_URL", rig.mock.base_url())
                    .env("GROUPCAST_PROVIDER_API_KEY", KEY)
                    .env("GROUPCAST_PROVIDER_API_SECRET", SECRET)
                    .env("GROUPCAST_LOG", "info")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("spawn worker"),
            )
        })
        .collect();
    let template = dir.path().join("t.json");
    std::fs::write(
        &template,
        r##"{"type": "ATA", "from": "0212345678", "text": "#{name}", "kakaoOptions": {"pfId": "PF", "templateId": "T"}}"##,
    )
    .expect("template");
    let mut expected = BTreeMap::new();
    for (k, b) in names.iter().enumerate() {
        let n = 400 + 100 * k;
        let mut csv = String::from("to,name\n");
        for i in 0..n {
            csv.push_str(&format!("010{:04}{:04},N{i}\n", 1_000 + k, i));
        }
        let file = dir.path().join(format!("{b}.csv"));
        std::fs::write(&file, csv).expect("csv");
        let out = groupcast_cmd(&url, prefix)
            .args(["submit", "--batch", b, "--chunk-size", "100", "--template"])
            .arg(&template)
            .arg("--recipients")
            .arg(&file)
            .output()
            .expect("run submit");
        assert!(
            out.status.success(),
            "submit {b}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        expected.insert(b.clone(), n);
    }
    // The processes recorded one shard per master for the deployment.
    let recorded: Option<String> = redis::cmd("GET")
        .arg(keys.shard_count())
        .query_async(&mut rig.store.raw_conn())
        .await
        .expect("GET");
    assert_eq!(recorded.as_deref(), Some("3"));
    rig.wait_reported(&names, Duration::from_secs(120)).await;
    rig.verify(&names).await;
    rig.check_ledger(&expected);
    assert!(dead_letters(&rig.store).await.is_empty());
    assert_batches_on_every_master(&rig.server, &rig.store, &names);
    drop(workers);
}
