//! A producer in another language, written from `schemas/README.md` alone
//! (`tests/python/producer.py`), feeds real workers: its batch must go
//! through exactly as a Rust producer's would, and its malformed entries must
//! end in the dead letters with reasons naming the problem.
//!
//! Needs `python3` with the packages `redis` and `msgpack`
//! (`pip install redis msgpack`); without them these tests fail, saying so.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use groupcast::events::{Chunk, Event};
use groupcast::keys::{shard_of, Keyspace};
use groupcast::store::queue::{parse_entries, Entry};
use groupcast::store::Store;
use serde_json::Value;

const PIP: &str = "pip install redis msgpack";

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn producer_py() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/producer.py")
}

/// Fails (never skips) when Python or its packages are missing.
fn require_python() {
    let py = python();
    let out = std::process::Command::new(&py)
        .args(["-c", "import redis, msgpack"])
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{py}` ({e}): these tests need Python 3 with its packages: {PIP}")
        });
    assert!(
        out.status.success(),
        "`{py}` lacks the producer's packages; install them with: {PIP}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the producer (bounded), without blocking the workers' runtime.
async fn run_producer(args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(producer_py()).args(args).kill_on_drop(true);
    match tokio::time::timeout(Duration::from_secs(120), cmd.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("cannot run the Python producer ({e}); {PIP}"),
        Err(_) => panic!("the Python producer did not finish within 120 s"),
    }
}

async fn dead_letter_entries(store: &Store) -> Vec<Entry> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg(store.keys.dead_letters(0))
        .arg("-")
        .arg("+")
        .query_async(&mut store.raw_conn())
        .await
        .expect("xrange");
    parse_entries(&v)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_producer_feeds_the_pipeline_and_its_bad_entries_are_dead_lettered() {
    require_python();
    let rig = Rig::start(4, test_config(), mock_config()).await;
    let batch = "py-batch".to_string();
    let (recipients, size) = (2_500usize, 200usize);
    let url = rig.server.url();
    let (recipients_arg, size_arg) = (recipients.to_string(), size.to_string());
    let out = run_producer(&[
        "--redis",
        &url,
        "--prefix",
        rig.store.keys.prefix(),
        // No --shards: the producer reads (here: records) the deployment's
        // count, 1 on a single server, as the workers do.
        "--batch",
        &batch,
        "--recipients",
        &recipients_arg,
        "--chunk-size",
        &size_arg,
        "--seed",
        "11",
        "--malformed",
        // Options in the ingest format: a send_at already past goes at once.
        "--send-at",
        "2026-01-01T09:00:00+09:00",
        "--priority",
        "normal",
    ])
    .await;
    assert!(
        out.status.success(),
        "the Python producer failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "the producer's summary is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let chunks = recipients.div_ceil(size);
    let last = chunks - 1;
    assert_eq!(summary["stream"], rig.store.keys.ingest(0).as_str());
    assert_eq!(summary["chunks"], chunks);
    assert!(summary["repeated"].as_u64().is_some_and(|n| n > 0));

    // The good batch goes through, whatever else was on the stream.
    let batches = vec![batch.clone()];
    rig.wait_reported(&batches, Duration::from_secs(60)).await;
    rig.verify(&batches).await;
    rig.check_ledger(&BTreeMap::from([(batch.clone(), recipients)]));
    let st = rig.store.batch(&batch).state().await.expect("state");
    // 2026-01-01T00:00:00Z, as the batch's options, from the Python encoder.
    assert_eq!(st.get("opts"), Some("1767225600000|normal|"));
    // The refused entries of this batch count against its outcome when they
    // arrived before the report (after it, they are refused as chunks of a
    // reported batch): either way every recipient was registered.
    let outcome = if st.int("rejected") > 0 {
        "partial"
    } else {
        "completed"
    };
    assert_eq!(st.get("report"), Some(outcome));
    assert_eq!(st.int("seqs"), chunks as i64);
    assert_eq!(st.int("recipients"), recipients as i64);
    assert_eq!(st.int("registered"), recipients as i64);

    // Each malformed entry is dead-lettered once, with a reason naming its
    // problem and the original fields unchanged; nothing else is.
    let expected: BTreeMap<&str, String> = BTreeMap::from([
        (
            "garbage",
            "undecodable chunk: malformed chunk payload".to_string(),
        ),
        (
            "unknown_version",
            "unknown envelope version \"2\" (this worker reads version 1)".to_string(),
        ),
        (
            "invalid_chunk",
            "recipient 0 has no value for placeholder #{order}".to_string(),
        ),
        (
            "beyond_last",
            format!("seq {} is beyond the last seq {last}", last + 1),
        ),
        (
            "conflict",
            format!("seq {last} was already accepted with other content"),
        ),
    ]);
    let malformed = summary["malformed"].as_array().expect("malformed entries");
    let kinds: BTreeSet<&str> = malformed
        .iter()
        .filter_map(|m| m["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        expected.keys().copied().collect(),
        "the producer's malformed entries"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let dlq = loop {
        let dlq = dead_letter_entries(&rig.store).await;
        if dlq.len() >= malformed.len() || Instant::now() > deadline {
            break dlq;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reasons: Vec<String> = dlq
        .iter()
        .map(|e| e.text("reason").unwrap_or_default())
        .collect();
    assert_eq!(dlq.len(), malformed.len(), "dead letters: {reasons:#?}");
    for m in malformed {
        let kind = m["kind"].as_str().expect("kind");
        let id = m["id"].as_str().expect("id");
        let dl = dlq
            .iter()
            .find(|e| e.text("entry").as_deref() == Some(id))
            .unwrap_or_else(|| {
                panic!("{kind} entry {id} is not in the dead letters: {reasons:#?}")
            });
        let reason = dl.text("reason").unwrap_or_default();
        assert!(
            reason.contains(&expected[kind]),
            "{kind}: reason {reason:?} does not say {:?}",
            expected[kind]
        );
        assert_eq!(dl.text("source"), Some(rig.store.keys.ingest(0)), "{kind}");
        assert_eq!(dl.text("deliveries").as_deref(), Some("1"), "{kind}");
        assert!(dl.text("consumer").is_some_and(|c| !c.is_empty()), "{kind}");
        assert_eq!(dl.text("f:v").as_deref(), m["v"].as_str(), "{kind}: f:v");
        assert_eq!(dl.text("f:t").as_deref(), m["t"].as_str(), "{kind}: f:t");
        assert_eq!(
            dl.get("f:d").map(hex).as_deref(),
            m["d_hex"].as_str(),
            "{kind}: f:d is not the bytes the producer wrote"
        );
    }

    // The refusals that could be tied to the batch are in its log too.
    let rejected: BTreeSet<String> = rig
        .store
        .batch(&batch)
        .events()
        .await
        .expect("events")
        .into_iter()
        .filter_map(|r| match r.expect("every event decodes").event {
            Event::InputRejected(e) => Some(e.reason),
            _ => None,
        })
        .collect();
    assert_eq!(rejected.len(), 3, "{rejected:?}");
    for kind in ["invalid_chunk", "beyond_last", "conflict"] {
        assert!(
            rejected.iter().any(|r| r.contains(&expected[kind])),
            "no input_rejected event says {:?}: {rejected:?}",
            expected[kind]
        );
    }
    // And the producer's good chunks are what a Rust producer writes.
    let unknown = dlq
        .iter()
        .find(|e| e.text("f:v").as_deref() == Some("2"))
        .expect("the unknown version's dead letter");
    let chunk = Chunk::decode(unknown.get("f:d").expect("f:d")).expect("a chunk");
    chunk.validate().expect("a valid chunk");
    assert_eq!((chunk.batch.as_str(), chunk.seq), (batch.as_str(), 0));
    rig.stop().await;
}

#[tokio::test]
async fn the_python_producer_computes_groupcasts_shard() {
    require_python();
    for batch in ["a", "b1", "camp-2026.11_29", "py-batch", &"z".repeat(128)] {
        for shards in [1u32, 4, 16, 1000] {
            let out = run_producer(&[
                "--batch",
                batch,
                "--shards",
                &shards.to_string(),
                "--print-shard",
            ])
            .await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                shard_of(batch, shards).to_string(),
                "shard of {batch:?} among {shards}"
            );
        }
    }
    // And the stream key, hash tag included.
    for batch in ["a", "b1", "camp-2026.11_29"] {
        for shards in [1u32, 3, 4, 6, 16, 1000] {
            let out = run_producer(&[
                "--batch",
                batch,
                "--prefix",
                "gc",
                "--shards",
                &shards.to_string(),
                "--print-stream",
            ])
            .await;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let keys = Keyspace::new("gc", shards);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                keys.ingest(keys.shard_of(batch)),
                "stream of {batch:?} among {shards}"
            );
        }
    }
}

#[tokio::test]
async fn the_python_producer_refuses_what_groupcast_would_refuse() {
    require_python();
    for (args, says) in [
        (
            &["--batch", "b1", "--chunk-size", "10001"][..],
            "at most 10000 recipients per chunk",
        ),
        (
            &["--batch", "camp{7}"][..],
            "batch id has the character '{'",
        ),
        (&["--batch", &"b".repeat(129)][..], "longer than 128 bytes"),
    ] {
        let out = run_producer(args).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says),
            "{args:?}: {err:?} does not say {says:?}"
        );
    }
}
