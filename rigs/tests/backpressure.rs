//! Backpressure: a producer pauses while the ingest stream holds its bound of
//! unread chunks, and goes on as the workers read them, so that Redis holds
//! the work in flight, not the whole input. The library producer and
//! `groupcast submit`, each with no worker running first (the producer must
//! stop at the bound), then with one (it must finish).

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use groupcast::keys::LOADERS_GROUP;
use groupcast::producer::Producer;

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_library_producer_stops_at_the_bound_and_resumes_as_workers_read() {
    const BOUND: u64 = 6;
    let mut mock = mock_config();
    // A slow provider: the worker drains the stream over many producer looks.
    mock.faults.latency_ms = 20;
    let mut rig = Rig::start(0, test_config(), mock).await;
    let batch = "bounded";
    let chunks = groupcast::producer::cut(batch, &template(), recipients(70, 1_500), 50);
    assert_eq!(chunks.len(), 30);
    let ingest = rig.store.keys.ingest(rig.store.keys.shard_of(batch));

    // Looks at the stream that found no room, and the most unread chunks
    // any of them saw.
    let refused = Arc::new(AtomicU64::new(0));
    let most_seen = Arc::new(AtomicU64::new(0));
    let (r, m) = (refused.clone(), most_seen.clone());
    let mut producer = Producer::new(rig.store.clone())
        .max_unread(BOUND)
        .on_wait(move |w| {
            r.fetch_add(1, Ordering::SeqCst);
            m.fetch_max(w.unread, Ordering::SeqCst);
        });
    let producing = tokio::spawn(async move {
        let ids = producer.append(&chunks).await.expect("append");
        (ids.len(), producer.waited())
    });

    // No worker: the producer appends the bound and then only looks.
    wait_until(Duration::from_secs(10), "three refused looks", || {
        let refused = refused.clone();
        async move { refused.load(Ordering::SeqCst) >= 3 }
    })
    .await;
    assert_eq!(
        rig.store.stream_len(&ingest).await.expect("xlen"),
        BOUND,
        "the producer stops at the bound"
    );
    assert!(!producing.is_finished(), "the producer is still waiting");

    // A worker reads: the producer goes on, never past the bound, and the
    // batch completes.
    rig.add_worker().await;
    let mut most_unread = 0;
    while !producing.is_finished() {
        let unread = rig
            .store
            .unread(&ingest, LOADERS_GROUP)
            .await
            .expect("unread");
        most_unread = most_unread.max(unread);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (appended, waited) = producing.await.expect("producer task");
    assert_eq!(appended, 30);
    assert!(waited > Duration::ZERO, "the producer waited");
    assert!(
        most_unread <= BOUND,
        "{most_unread} chunks unread at once, over the bound {BOUND}"
    );
    assert!(
        most_seen.load(Ordering::SeqCst) <= BOUND,
        "the producer saw more than the bound unread"
    );
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(60))
        .await;
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submit_waits_for_the_workers_at_the_bound() {
    const BOUND: u64 = 4;
    let mut rig = Rig::start(0, test_config(), mock_config()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("people.csv");
    let mut text = String::from("to,name\n");
    for i in 0..400 {
        text.push_str(&format!("010{i:08},Kim{i}\n"));
    }
    std::fs::write(&csv, text).expect("write csv");
    let template = dir.path().join("t.json");
    std::fs::write(
        &template,
        r##"{"type": "SMS", "from": "0212345678", "text": "#{name}, hello"}"##,
    )
    .expect("write template");

    let mut submit = Command::new(BIN)
        .args(["submit", "--batch", "waits", "--chunk-size", "20"])
        .args(["--max-unread-chunks", &BOUND.to_string(), "--json"])
        .arg("--recipients")
        .arg(&csv)
        .arg("--template")
        .arg(&template)
        .env("GROUPCAST_REDIS_URL", rig.store.target.redacted())
        .env("GROUPCAST_PREFIX", rig.store.keys.prefix())
        .env_remove("GROUPCAST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run groupcast submit");

    // It says it waits (after a while with no room), and it has appended
    // exactly the bound.
    let stderr = submit.stderr.take().expect("stderr");
    let said = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stderr).read_line(&mut line).map(|_| line)
    });
    let said = tokio::time::timeout(Duration::from_secs(20), said)
        .await
        .expect("submit says it waits")
        .expect("stderr reader")
        .expect("read stderr");
    assert!(
        said.contains("waiting") && said.contains(&format!("{BOUND} chunks unread")),
        "{said}"
    );
    let ingest = rig.store.keys.ingest(0);
    assert_eq!(rig.store.stream_len(&ingest).await.expect("xlen"), BOUND);
    assert!(
        submit.try_wait().expect("try_wait").is_none(),
        "still waiting"
    );

    rig.add_worker().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = submit.try_wait().expect("try_wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "submit did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let out = submit.wait_with_output().expect("output");
    assert!(status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["recipients"], 400);
    assert_eq!(v["chunks"], 20);
    rig.wait_reported(&["waits".to_string()], Duration::from_secs(60))
        .await;
    rig.verify(&["waits".to_string()]).await;
    rig.stop().await;
}
