//! The report webhook: every delivery signed as Standard Webhooks specifies
//! (checked with the specification's own Python library), one vocabulary of
//! field names in the webhook, the reports stream and the board's API, and
//! no token of the webhook's URL in anything groupcast prints.
//!
//! Needs `python3` with the PyPI package `standardwebhooks`
//! (`scripts/ensure-deps --tests`); without it the signing test fails and
//! says so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast_rigs::redis_server::free_port;
use serde_json::Value;

use crate::support::*;

/// One delivery as the receiver got it: its headers and its body's bytes.
#[derive(Debug, Clone)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Delivery {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Deliveries = Arc<Mutex<Vec<Delivery>>>;

/// A report receiver that refuses its first delivery (503) and accepts the
/// others: its URL and what it received.
async fn receiver() -> (String, Deliveries) {
    async fn hook(
        State(got): State<Deliveries>,
        headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> StatusCode {
        let mut got = got.lock().expect("lock");
        got.push(Delivery {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: body.to_vec(),
        });
        if got.len() == 1 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        }
    }
    let got = Deliveries::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let app = axum::Router::new()
        .route("/hook", post(hook))
        .with_state(got.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Fails (never skips) when Python or `standardwebhooks` is missing.
fn require_standardwebhooks() {
    let py = python();
    let out = std::process::Command::new(&py)
        .args(["-c", "import standardwebhooks"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{py}` ({e}): run scripts/ensure-deps --tests"));
    assert!(
        out.status.success(),
        "`{py}` lacks the PyPI package standardwebhooks: run scripts/ensure-deps --tests ({})",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the reference verifier says of `body` with `headers`, with `secret`
/// and its clock moved by `shift_s`: `ok <batch>` or `refused: <why>`.
fn verify(dir: &Path, d: &Delivery, body: &[u8], secret: &str, shift_s: i64) -> String {
    let body_file = dir.join("body");
    let headers_file = dir.join("headers.json");
    std::fs::write(&body_file, body).expect("write body");
    let headers: serde_json::Map<String, Value> = d
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    std::fs::write(&headers_file, Value::Object(headers).to_string()).expect("write headers");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/verify_webhook.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .arg(&body_file)
        .arg(&headers_file)
        .arg(secret)
        .arg(shift_s.to_string())
        .output()
        .expect("run the verifier");
    assert!(
        out.status.success(),
        "the verifier failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `groupcast submit`s batch `batch`: `n` recipients (set `k` of
/// [`recipients_file`]) in chunks of 50. Returns what it printed.
fn submit(dir: &Path, batch: &str, k: u64, n: u64, redis_url: &str) -> String {
    let r = recipients_file(dir, k, n);
    let t = template_file(dir);
    run_ok(
        &[
            "submit",
            "--batch",
            batch,
            "--recipients",
            &r,
            "--template",
            &t,
            "--chunk-size",
            "50",
        ],
        &[("GROUPCAST_REDIS_URL", redis_url.to_string())],
    )
}

fn secret(byte: u8) -> String {
    format!("whsec_{}", STANDARD.encode([byte; 32]))
}

/// Every key of a JSON object (and of the objects in its arrays).
fn keys_deep(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                out.insert(k.clone());
                if x.is_array() {
                    keys_deep(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys_deep(x, out)),
        _ => {}
    }
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The field names `schemas/events/batch_reported.schema.json` gives the
/// report.
fn schema_fields() -> BTreeSet<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas/events/batch_reported.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("json");
    keys(&schema["properties"])
}

/// The report of `batch` in the shard's reports stream, as JSON.
async fn stream_report(store: &Store, batch: &str) -> Value {
    store
        .entries(&store.keys.reports(store.keys.shard_of(batch)))
        .await
        .expect("the reports stream")
        .into_iter()
        .find(|e| e.text("batch").as_deref() == Some(batch) && !e.is_delivery_report())
        .and_then(|e| rmp_serde::from_slice::<Value>(e.get("d")?).ok())
        .unwrap_or_else(|| panic!("no report of {batch} in the reports stream"))
}

/// Waits (bounded) until the webhook accepted `batch`'s report.
async fn wait_delivered(store: &Store, batch: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while store
        .batch(batch)
        .appended(groupcast::projection::event_key::DELIVERED)
        .await
        .expect("state")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "{batch}'s report never delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until the webhook accepted `batch`'s delivery report.
async fn wait_delivery_report_delivered(store: &Store, batch: &str) {
    let key = groupcast::projection::event_key::DELIVERY_REPORT_DELIVERED;
    let deadline = Instant::now() + Duration::from_secs(60);
    while store
        .batch(batch)
        .appended(key)
        .await
        .expect("state")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "{batch}'s delivery report never delivered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_are_signed_as_standard_webhooks_specifies_and_named_as_everywhere() {
    require_standardwebhooks();
    let port = free_port().expect("port");
    let _server = server(&[], port, None);
    let redis_url = format!("redis://127.0.0.1:{port}/");
    let dir = tempfile::tempdir().expect("tempdir");
    let (hook_url, deliveries) = receiver().await;
    let (_mock, provider_url) = mock_provider(&[
        ("GROUPCAST_MOCK_API_KEY", "k".into()),
        ("GROUPCAST_MOCK_API_SECRET", "s".into()),
    ]);
    let metrics = format!("127.0.0.1:{}", free_port().expect("port"));
    let wargs = worker_args(&provider_url, &metrics);
    let (current, previous) = (secret(0x11), secret(0x22));
    let env = |secrets: String| {
        vec![
            ("GROUPCAST_REDIS_URL", redis_url.clone()),
            ("GROUPCAST_PROVIDER_API_KEY", "k".to_string()),
            ("GROUPCAST_PROVIDER_API_SECRET", "s".to_string()),
            ("GROUPCAST_REPORT_WEBHOOK", hook_url.clone()),
            ("GROUPCAST_WEBHOOK_SECRET", secrets),
        ]
    };

    // A secret not in the specification's form stops the worker at start,
    // saying what to write, without quoting it.
    let (status, out, err) = run(&wargs, &env("hunter2-not-a-whsec".into()));
    assert!(!status.success(), "started with a bad secret: {out}{err}");
    assert!(
        err.contains("whsec_") && err.contains("GROUPCAST_WEBHOOK_SECRET"),
        "{err}"
    );
    assert!(!(out + &err).contains("hunter2"), "the secret was quoted");

    // Two secrets, as while rotating: each delivery is signed with both.
    let mut worker = started_worker(&wargs, &env(format!("{current} {previous}")));
    let batch = "signed-1";
    submit(dir.path(), batch, 5, 120, &redis_url);
    let store = Store::connect(&redis_url, Keyspace::new("gc", 1))
        .await
        .expect("store");
    wait_delivered(&store, batch).await;
    wait_delivery_report_delivered(&store, batch).await;
    worker.terminate();

    // The delivery report, the batch's second: its own id, signed the same.
    let all = deliveries.lock().expect("lock").clone();
    let (got, second): (Vec<Delivery>, Vec<Delivery>) = all
        .into_iter()
        .partition(|d| d.header("webhook-id") == Some("signed-1:report"));
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(second[0].header("webhook-id"), Some("signed-1:delivery"));
    let delivery: Value = serde_json::from_slice(&second[0].body).expect("json");
    assert_eq!(delivery["report"], "delivery");
    assert_eq!(delivery["delivered"], 120);
    for s in [&current, &previous] {
        assert_eq!(
            verify(dir.path(), &second[0], &second[0].body, s, 0),
            format!("ok {batch}")
        );
    }
    assert_eq!(got.len(), 2, "one refused, one accepted: {got:?}");
    // The same id on the retry (a receiver dedupes on it), a fresh timestamp
    // per attempt, one `v1,` signature per secret.
    let ids: BTreeSet<_> = got.iter().map(|d| d.header("webhook-id")).collect();
    assert_eq!(ids, BTreeSet::from([Some("signed-1:report")]), "{got:?}");
    for d in &got {
        let sigs = d.header("webhook-signature").unwrap_or_default();
        assert_eq!(
            sigs.split(' ').filter(|s| s.starts_with("v1,")).count(),
            2,
            "{sigs}"
        );
        assert!(d
            .header("webhook-timestamp")
            .is_some_and(|t| t.parse::<u64>().is_ok()));
        assert_eq!(d.header("content-type"), Some("application/json"));
    }
    let accepted = &got[1];
    let body = accepted.body.clone();
    let ok = format!("ok {batch}");
    for s in [&current, &previous] {
        assert_eq!(verify(dir.path(), accepted, &body, s, 0), ok);
    }
    assert_eq!(verify(dir.path(), &got[0], &got[0].body, &current, 0), ok);
    // What a receiver must refuse.
    let mut tampered = body.clone();
    let at = String::from_utf8_lossy(&body)
        .find("\"registered\":120")
        .expect("registered in the body");
    tampered[at + "\"registered\":".len()] = b'9';
    for (what, b, s, shift) in [
        ("a tampered body", &tampered, &current, 0),
        ("a wrong secret", &body, &secret(0x33), 0),
        ("a clock 6 minutes ahead", &body, &current, 360),
        ("a clock 6 minutes behind", &body, &current, -360),
    ] {
        let said = verify(dir.path(), accepted, b, s, shift);
        assert!(said.starts_with("refused: "), "{what} was accepted: {said}");
    }

    // One vocabulary: the webhook's body carries every field of the
    // `batch_reported` event under its name there; the reports stream and
    // the board's API name them the same; all snake_case.
    let hooked: Value = serde_json::from_slice(&body).expect("json body");
    let schema = schema_fields();
    let streamed = stream_report(&store, batch).await;
    let (_board, board_url) = board(&redis_url);
    let page: Value =
        serde_json::from_str(&get_text(&board_url, &format!("/api/batches/{batch}")).await)
            .expect("json");
    let mut boarded = keys(&page["report"]);
    assert!(boarded.remove("time_ms"), "{page}");
    let hooked_fields = keys(&hooked);
    let missing: Vec<_> = schema.difference(&hooked_fields).collect();
    assert!(
        missing.is_empty(),
        "the webhook lacks {missing:?}: {hooked}"
    );
    assert!(keys(&streamed).is_subset(&schema), "{streamed}");
    // (A count that is 0 may be absent from the stream: the schema says so.)
    assert!(boarded.is_subset(&schema), "{page}");
    for (field, value) in streamed.as_object().into_iter().flatten() {
        assert_eq!(&hooked[field], value, "{field}: webhook vs reports stream");
        assert_eq!(
            &page["report"][field], value,
            "{field}: board vs reports stream"
        );
    }
    let mut all = BTreeSet::new();
    keys_deep(&hooked, &mut all);
    let camel: Vec<_> = all
        .iter()
        .filter(|k| {
            !k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect();
    assert!(camel.is_empty(), "not snake_case: {camel:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_of_the_webhooks_url_appears_in_any_output() {
    const TOKEN: &str = "SEKRET123";
    const PASSWORD: &str = "PASSW0RD-hook";
    let port = free_port().expect("port");
    let _server = server(&[], port, None);
    let redis_url = format!("redis://127.0.0.1:{port}/");
    let dir = tempfile::tempdir().expect("tempdir");
    let (_mock, provider_url) = mock_provider(&[
        ("GROUPCAST_MOCK_API_KEY", "k".into()),
        ("GROUPCAST_MOCK_API_SECRET", "s".into()),
    ]);
    // Nothing listens there: every delivery fails with reqwest's error,
    // which names the URL, until the report is dead-lettered.
    let closed = free_port().expect("port");
    let hook_url = format!("http://ops:{PASSWORD}@127.0.0.1:{closed}/hook?token={TOKEN}");
    let metrics = format!("127.0.0.1:{}", free_port().expect("port"));
    let mut wargs = vec!["--log-format", "json"];
    wargs.extend(worker_args(&provider_url, &metrics));
    wargs.extend(["--report-retry-for", "1s"]);
    let cli_env = vec![("GROUPCAST_REDIS_URL", redis_url.clone())];
    let mut worker_env = cli_env.clone();
    worker_env.extend([
        ("GROUPCAST_LOG", "debug".to_string()),
        ("GROUPCAST_PROVIDER_API_KEY", "k".to_string()),
        ("GROUPCAST_PROVIDER_API_SECRET", "s".to_string()),
        ("GROUPCAST_REPORT_WEBHOOK", hook_url),
    ]);
    let mut worker = started_worker(&wargs, &worker_env);
    let batch = "redacted-1";
    let mut seen = submit(dir.path(), batch, 6, 40, &redis_url);
    let store = Store::connect(&redis_url, Keyspace::new("gc", 1))
        .await
        .expect("store");
    wait_reported(&store, batch, Duration::from_secs(60)).await;
    wait_dead_letters(&store, 1).await;

    let (mut board_proc, board_url) = board(&redis_url);
    let mut outputs = Vec::new();
    for args in [
        vec!["dlq", "list"],
        vec!["dlq", "list", "--json"],
        vec!["status"],
        vec!["status", batch, "--json"],
        vec!["audit", batch],
        vec!["audit", batch, "--json"],
    ] {
        outputs.push((format!("groupcast {args:?}"), run_ok(&args, &cli_env)));
    }
    for path in [
        "/api/overview".to_string(),
        "/api/dlq".to_string(),
        format!("/api/batches/{batch}"),
        format!("/api/batches/{batch}/events"),
    ] {
        outputs.push((
            format!("the board's {path}"),
            get_text(&board_url, &path).await,
        ));
    }
    worker.terminate();
    board_proc.terminate();
    outputs.push((
        "the worker's log".into(),
        worker.out.text() + &worker.err.text(),
    ));
    outputs.push((
        "the board's log".into(),
        board_proc.out.text() + &board_proc.err.text(),
    ));

    // The error path ran and names where it failed, without the secrets.
    // (reqwest sends the userinfo as an Authorization header, and leaves it
    // out of the URL its errors name.)
    let redacted = format!("127.0.0.1:{closed}/hook?***");
    let dlq = &outputs[1].1;
    assert!(
        dlq.contains("report webhook unreachable") && dlq.contains(&redacted),
        "{dlq}"
    );
    let log = &outputs[outputs.len() - 2].1;
    assert!(
        log.contains("retry later") && log.contains(&redacted),
        "{log}"
    );
    for (what, text) in &outputs {
        for secret in [TOKEN, PASSWORD] {
            assert!(!text.contains(secret), "{what} holds {secret}: {text}");
        }
        seen.push_str(text);
    }
    assert!(seen.contains(batch), "nothing read?");
}
