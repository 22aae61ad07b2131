//! `groupcast serve`'s HTTP API (`/v1`) against real redis-server processes,
//! real workers and the mock provider: a 100,000-recipient batch fed only
//! through HTTP (JSON, CSV and MessagePack chunks, out of order, some
//! twice); the tokens, scopes and cross-site refusals, and the audit naming
//! the token; backpressure at the bound and after it; the body limit; every
//! problem of a bad CSV chunk; a seq's conflicting and identical repeats.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use groupcast::cli::board::Board;
use groupcast::cli::serve::tokens::Tokens;
use groupcast::cli::serve::{router, Front, RETRY_AFTER};
use groupcast::events::Event;
use groupcast::store::batch::BatchPolicy;
use groupcast::store::Store;
use serde_json::{json, Value};

const OPS: &str = "ops-secret-0123456789abcdef0123456789";
const FEEDER: &str = "feeder-secret-0123456789abcdef012345";
const READER: &str = "reader-secret-0123456789abcdef012345";

/// A server of the API on loopback, on `store`.
struct Api {
    base: String,
    http: reqwest::Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves the API (and the board) on `store`, with these tokens, bound and
/// body limit.
async fn serve(store: &Store, max_unread: u64, max_body: usize) -> Api {
    serve_with_timeout(store, max_unread, max_body, Duration::from_secs(20)).await
}

/// [`serve`] with a request timeout.
async fn serve_with_timeout(
    store: &Store,
    max_unread: u64,
    max_body: usize,
    timeout: Duration,
) -> Api {
    let tokens = Tokens::parse(
        "tokens",
        &format!(
            "# test tokens\nops-oncall ingest,operate,read {OPS}\nfeeder ingest {FEEDER}\nreader read {READER}\n"
        ),
    )
    .expect("tokens");
    let policy = BatchPolicy::for_operator(Duration::from_secs(3600));
    let board = Board {
        store: store.clone(),
        token: None,
        stall_after: Duration::from_secs(300),
        reported: 10,
        policy,
    };
    let front = Front {
        store: store.clone(),
        tokens,
        max_unread,
        retry_after: RETRY_AFTER,
        keep: Duration::from_secs(3600),
        policy,
    };
    let app = router(Arc::new(board), Arc::new(front), max_body, timeout);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Api {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        task,
    }
}

/// An answer: status, headers, body as JSON (`Null` when not JSON).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn problem_type(&self) -> &str {
        self.body["type"].as_str().unwrap_or("")
    }

    /// Asserts a problem of `slug` with `status`, as problem+json.
    fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        assert_eq!(self.problem_type(), format!("urn:groupcast:problem:{slug}"));
        assert_eq!(self.body["status"], status);
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
    }
}

impl Api {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        secret: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(s) = secret {
            req = req.bearer_auth(s);
        }
        if let Some((kind, bytes)) = body {
            req = req.header("content-type", kind).body(bytes);
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        let res = req.send().await.expect("request");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let bytes = res.bytes().await.expect("body");
        Answer {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    async fn create(&self, secret: &str, batch: &str) -> Answer {
        let t = template();
        let k = t.kakao_options.expect("kakao");
        let body = json!({
            "batch": batch,
            "template": {"type": t.kind, "from": t.from, "text": t.text,
                         "kakaoOptions": {"pfId": k.pf_id, "templateId": k.template_id}},
        });
        self.send(
            reqwest::Method::POST,
            "/v1/batches",
            Some(secret),
            Some(("application/json", body.to_string().into_bytes())),
            &[],
        )
        .await
    }

    async fn put(&self, batch: &str, seq: u32, query: &str, kind: &str, body: Vec<u8>) -> Answer {
        self.send(
            reqwest::Method::PUT,
            &format!("/v1/batches/{batch}/chunks/{seq}{query}"),
            Some(FEEDER),
            Some((kind, body)),
            &[],
        )
        .await
    }
}

/// A JSON chunk body of `recipients`.
fn json_body(recipients: &[groupcast::events::Recipient], last: bool) -> Vec<u8> {
    let list: Vec<Value> = recipients
        .iter()
        .map(|r| json!({"to": r.to, "vars": r.vars}))
        .collect();
    json!({"recipients": list, "last": last})
        .to_string()
        .into_bytes()
}

/// A CSV chunk body of `recipients` (the template's two variables).
fn csv_body(recipients: &[groupcast::events::Recipient]) -> Vec<u8> {
    let mut s = String::from("to,name,order\n");
    for r in recipients {
        s.push_str(&format!(
            "{},{},{}\n",
            r.to, r.vars["name"], r.vars["order"]
        ));
    }
    s.into_bytes()
}

/// Redis's `used_memory`, in bytes.
async fn used_memory(store: &Store) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut store.raw_conn())
        .await
        .expect("info");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory")
}

async fn ingest_len(store: &Store, batch: &str) -> u64 {
    let stream = store.keys.ingest(store.keys.shard_of(batch));
    store.stream_len(&stream).await.expect("xlen")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_100_000_fed_only_through_http_reports_and_reaches_everyone_once() {
    const N: usize = 100_000;
    const SIZE: usize = 2_500;
    let rig = Rig::start(2, test_config(), mock_config()).await;
    let api = serve(&rig.store, 64, 16 << 20).await;
    let batch = "http-100k";
    let created = api.create(FEEDER, batch).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(api.create(FEEDER, batch).await.status, 200, "same again");

    let all = recipients(7, N);
    let chunks: Vec<&[groupcast::events::Recipient]> = all.chunks(SIZE).collect();
    let last_seq = chunks.len() as u32 - 1;
    // Every seq, then every third again, out of order; each in one of the
    // three bodies by its seq. No chunk says it is the last: the batch is
    // sealed after them, as a streaming producer does.
    let mut order: Vec<u32> = (0..=last_seq).chain((0..=last_seq).step_by(3)).collect();
    shuffle(&mut order, 31);
    let mut repeats = 0;
    for seq in order {
        let part = chunks[seq as usize];
        let last = false;
        let (query, kind, body) = match seq % 3 {
            0 => ("", "application/json", json_body(part, last)),
            1 => (
                if last { "?last=true" } else { "" },
                "text/csv",
                csv_body(part),
            ),
            _ => {
                let chunk = groupcast::events::Chunk {
                    batch: batch.into(),
                    seq,
                    last,
                    template: template(),
                    options: Default::default(),
                    recipients: part.to_vec(),
                };
                ("", "application/msgpack", chunk.encode())
            }
        };
        // The workers keep up, or the API says when to come back.
        let deadline = Instant::now() + Duration::from_secs(60);
        let answer = loop {
            let a = api.put(batch, seq, query, kind, body.clone()).await;
            if a.status != 429 {
                break a;
            }
            assert!(Instant::now() < deadline, "still 429 after a minute");
            let wait: u64 = a.headers["retry-after"]
                .to_str()
                .expect("ascii")
                .parse()
                .expect("seconds");
            tokio::time::sleep(Duration::from_secs(wait)).await;
        };
        assert_eq!(answer.status, 202, "seq {seq}: {}", answer.body);
        assert_eq!(answer.body["recipients"], SIZE, "seq {seq}");
        repeats += usize::from(answer.body["repeat"] == true);
    }
    assert_eq!(
        repeats,
        (last_seq as usize / 3) + 1,
        "every repeat taken as one"
    );
    let seal_path = format!("/v1/batches/{batch}/seal");
    let seal = |last: u32| {
        api.send(
            reqwest::Method::POST,
            &seal_path,
            Some(FEEDER),
            Some((
                "application/json",
                json!({ "last": last }).to_string().into_bytes(),
            )),
            &[],
        )
    };
    let sealed = seal(last_seq).await;
    assert_eq!(sealed.status, 200, "{}", sealed.body);
    assert_eq!(sealed.body, json!({"sealed": batch, "last": last_seq}));
    assert_eq!(seal(last_seq).await.status, 200, "the same seal again");
    // Another last seq changes nothing (the batch may have reported already).
    let other = seal(last_seq + 5).await;
    assert_eq!(other.status, 409, "{}", other.body);
    assert!(
        other.problem_type().ends_with(":last-conflict")
            || other.problem_type().ends_with(":batch-ended"),
        "{}",
        other.body
    );

    rig.wait_reported(&[batch.to_string()], Duration::from_secs(120))
        .await;
    let report = api
        .send(
            reqwest::Method::GET,
            &format!("/v1/batches/{batch}/report"),
            Some(READER),
            None,
            &[],
        )
        .await;
    assert_eq!(report.status, 200, "{}", report.body);
    let r = &report.body["report"];
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["registered"], N as u64, "{r}");
    assert_eq!(r["chunks"], u64::from(last_seq) + 1, "{r}");
    assert_eq!(r["rejected"], 0, "{r}");
    let status = api
        .send(
            reqwest::Method::GET,
            &format!("/v1/batches/{batch}"),
            Some(READER),
            None,
            &[],
        )
        .await;
    assert_eq!(status.body["report"], "completed", "{}", status.body);
    assert_eq!(status.body["missingSeqCount"], 0, "{}", status.body);
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), N)]));
    rig.verify(&[batch.to_string()]).await;
    assert!(dead_letters(&rig.store).await.is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_token_with_the_scope_from_no_other_site_may_act_and_the_audit_names_it() {
    let (_server, store) = store(1).await;
    let api = serve(&store, 64, 1 << 20).await;
    let batch = "access";
    let post = reqwest::Method::POST;
    let cancel = format!("/v1/batches/{batch}/cancel");
    let reason = Some(("application/json", br#"{"reason": "wrong list"}"#.to_vec()));

    // Without a token, with a wrong one, with one lacking the scope.
    let none = api
        .send(post.clone(), &cancel, None, reason.clone(), &[])
        .await;
    none.assert_problem(401, "unauthorized");
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    let wrong = "ops-secret-0123456789abcdef0123456780";
    api.send(post.clone(), &cancel, Some(wrong), reason.clone(), &[])
        .await
        .assert_problem(401, "unauthorized");
    let scoped = api
        .send(post.clone(), &cancel, Some(FEEDER), reason.clone(), &[])
        .await;
    scoped.assert_problem(403, "forbidden");
    assert!(scoped.body["detail"]
        .as_str()
        .unwrap_or("")
        .contains("operate"));
    api.create(READER, batch)
        .await
        .assert_problem(403, "forbidden");
    // The right token from a browser on another site.
    for header in [
        ("origin", "https://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ] {
        api.send(post.clone(), &cancel, Some(OPS), reason.clone(), &[header])
            .await
            .assert_problem(403, "cross-site");
    }
    assert!(
        store
            .batch(batch)
            .events()
            .await
            .expect("events")
            .is_empty(),
        "nothing was done"
    );

    // The right one acts, and the batch's audit names it.
    let done = api
        .send(post.clone(), &cancel, Some(OPS), reason, &[])
        .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(
        done.body["reason"],
        "cancelled by token ops-oncall: wrong list"
    );
    let events = store.batch(batch).events().await.expect("events");
    let recorded = events.iter().flatten().find_map(|r| match &r.event {
        Event::BatchCancelled(e) => Some(e.reason.clone()),
        _ => None,
    });
    assert_eq!(
        recorded.as_deref(),
        Some("cancelled by token ops-oncall: wrong list")
    );
    // Reading needs `read`, which the feeder lacks and the reader has.
    let path = format!("/v1/batches/{batch}");
    api.send(reqwest::Method::GET, &path, Some(FEEDER), None, &[])
        .await
        .assert_problem(403, "forbidden");
    let read = api
        .send(reqwest::Method::GET, &path, Some(READER), None, &[])
        .await;
    assert_eq!(read.status, 200, "{}", read.body);
    assert_eq!(read.body["report"], "cancelled", "{}", read.body);
    // An ended batch takes no more chunks.
    api.create(FEEDER, batch)
        .await
        .assert_problem(409, "batch-ended");
    // The document needs no token and covers the routes.
    let doc = api
        .send(reqwest::Method::GET, "/v1/openapi.json", None, None, &[])
        .await;
    assert_eq!(doc.body["openapi"], "3.1.0");
    assert!(doc.body["paths"]["/v1/batches/{id}/chunks/{seq}"]["put"].is_object());
    api.send(reqwest::Method::GET, "/v1/nowhere", Some(OPS), None, &[])
        .await
        .assert_problem(404, "not-found");
    api.send(reqwest::Method::DELETE, "/v1/batches", Some(OPS), None, &[])
        .await
        .assert_problem(405, "method-not-allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_worker_the_api_answers_429_at_the_bound_and_takes_chunks_again_once_one_reads() {
    const BOUND: u64 = 4;
    let mut rig = Rig::start(0, test_config(), mock_config()).await;
    let api = serve(&rig.store, BOUND, 1 << 20).await;
    let batch = "pressed";
    assert_eq!(api.create(FEEDER, batch).await.status, 201);
    let all = recipients(3, 60);
    let parts: Vec<_> = all.chunks(10).collect();
    for seq in 0..BOUND as u32 {
        let a = api
            .put(
                batch,
                seq,
                "",
                "application/json",
                json_body(parts[seq as usize], false),
            )
            .await;
        assert_eq!(a.status, 202, "{}", a.body);
    }
    let refused = api
        .put(batch, 4, "", "application/json", json_body(parts[4], false))
        .await;
    refused.assert_problem(429, "backpressure");
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(refused.body["retryAfter"], 1);
    assert_eq!(
        ingest_len(&rig.store, batch).await,
        BOUND,
        "nothing appended past the bound"
    );
    // A producer that keeps pushing big chunks (50 of 10,000 recipients,
    // about 25 MB in all) grows Redis by nothing: the ceiling is the bound's
    // chunks, already in.
    let before = used_memory(&rig.store).await;
    let big = recipients(4, 10_000);
    for seq in 10..60 {
        let a = api
            .put(batch, seq, "", "application/json", json_body(&big, false))
            .await;
        a.assert_problem(429, "backpressure");
    }
    let after = used_memory(&rig.store).await;
    assert!(
        after < before + 1_000_000,
        "Redis grew from {before} to {after} bytes while every chunk was refused"
    );
    assert_eq!(ingest_len(&rig.store, batch).await, BOUND);

    // A worker reads: the API takes chunks again.
    rig.add_worker().await;
    for seq in [4u32, 5] {
        let body = json_body(parts[seq as usize], seq == 5);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let a = api
                .put(batch, seq, "", "application/json", body.clone())
                .await;
            if a.status == 202 {
                break;
            }
            a.assert_problem(429, "backpressure");
            assert!(Instant::now() < deadline, "seq {seq} never taken again");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    rig.wait_reported(&[batch.to_string()], Duration::from_secs(30))
        .await;
    rig.check_ledger(&BTreeMap::from([(batch.to_string(), 60)]));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_with_413_before_anything_is_appended() {
    let (_server, store) = store(1).await;
    let api = serve(&store, 64, 64 * 1024).await;
    let batch = "large";
    assert_eq!(api.create(FEEDER, batch).await.status, 201);
    let big = csv_body(&recipients(1, 3_000));
    assert!(big.len() > 64 * 1024, "{} bytes", big.len());
    api.put(batch, 0, "", "text/csv", big)
        .await
        .assert_problem(413, "body-too-large");
    assert_eq!(ingest_len(&store, batch).await, 0);
    let small = csv_body(&recipients(1, 100));
    assert_eq!(api.put(batch, 0, "", "text/csv", small).await.status, 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_csv_chunk_is_refused_at_once_with_every_problem_by_row_and_field() {
    let (_server, store) = store(1).await;
    let api = serve(&store, 64, 1 << 20).await;
    let batch = "bad-csv";
    assert_eq!(api.create(FEEDER, batch).await.status, 201);
    let csv = "to,name,order\n\
               010-1234-5678,김민준,A1\n\
               not-a-number,이서연,A2\n\
               01034567890,,A3\n\
               01045678901,박지호\n\
               0105678,최,A5\n";
    let a = api
        .put(batch, 0, "?last=true", "text/csv", csv.as_bytes().to_vec())
        .await;
    a.assert_problem(422, "invalid-chunk");
    let errors = a.body["errors"].as_array().expect("errors");
    let at: Vec<(u64, &str)> = errors
        .iter()
        .map(|e| {
            (
                e["row"].as_u64().unwrap_or(0),
                e["field"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert!(at.contains(&(3, "to")), "{at:?}");
    assert!(at.contains(&(6, "to")), "{at:?}");
    assert!(
        at.iter().any(|(row, _)| *row == 5),
        "the short row is named: {at:?}"
    );
    assert!(errors.len() >= 3, "{}", a.body);
    assert!(errors.iter().all(|e| e["reason"].is_string()));
    assert_eq!(ingest_len(&store, batch).await, 0, "nothing appended");
    // A JSON chunk's problems likewise, by index.
    let bad = json!({"recipients": [{"to": "01012345678", "vars": {"name": "a", "order": "1"}},
                                    {"to": "12", "vars": {"name": "b"}}]});
    let j = api
        .put(
            batch,
            0,
            "",
            "application/json",
            bad.to_string().into_bytes(),
        )
        .await;
    j.assert_problem(422, "invalid-chunk");
    let fields: Vec<&str> = j.body["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["field"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(fields.len(), 2, "{}", j.body);
    assert!(
        fields.contains(&"to") && fields.contains(&"order"),
        "{fields:?}"
    );
    // Another media type, a chunk of a batch never created.
    api.put(batch, 0, "", "text/plain", b"x".to_vec())
        .await
        .assert_problem(415, "unsupported-media-type");
    api.put(
        "never-created",
        0,
        "",
        "application/json",
        json_body(&recipients(1, 1), true),
    )
    .await
    .assert_problem(404, "batch-not-created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_repeated_with_the_same_content_is_taken_and_with_other_content_refused() {
    let (_server, store) = store(1).await;
    let api = serve(&store, 64, 1 << 20).await;
    let batch = "repeats";
    assert_eq!(api.create(FEEDER, batch).await.status, 201);
    let first = recipients(2, 5);
    let other = recipients(4, 5);
    let a = api
        .put(batch, 0, "", "application/json", json_body(&first, false))
        .await;
    assert_eq!(
        (a.status, a.body["repeat"].clone()),
        (202, json!(false)),
        "{}",
        a.body
    );
    // The same content, as CSV this time: the same chunk.
    let again = api.put(batch, 0, "", "text/csv", csv_body(&first)).await;
    assert_eq!(again.status, 202, "{}", again.body);
    assert_eq!(again.body["repeat"], true);
    assert_eq!(again.body["digest"], a.body["digest"]);
    let conflict = api
        .put(batch, 0, "", "application/json", json_body(&other, false))
        .await;
    conflict.assert_problem(409, "seq-conflict");
    // The repeat was appended again (the workers take it once); the
    // conflicting content never.
    assert_eq!(ingest_len(&store, batch).await, 2);
    // A MessagePack chunk whose seq is not the path's.
    let chunk = groupcast::events::Chunk {
        batch: batch.into(),
        seq: 9,
        last: false,
        template: template(),
        options: Default::default(),
        recipients: other,
    };
    let m = api
        .put(batch, 1, "", "application/msgpack", chunk.encode())
        .await;
    m.assert_problem(422, "invalid-chunk");
    assert_eq!(m.body["errors"][0]["field"], "seq");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_its_body_is_answered_503_at_the_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_server, store) = store(1).await;
    let api = serve_with_timeout(&store, 64, 1 << 20, Duration::from_millis(500)).await;
    let batch = "slow";
    assert_eq!(api.create(FEEDER, batch).await.status, 201);
    let addr = api.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    // A body of 1,000 bytes announced, 10 sent, then nothing.
    let head = format!(
        "PUT /v1/batches/{batch}/chunks/0 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {FEEDER}\r\n\
         Content-Type: text/csv\r\nContent-Length: 1000\r\n\r\nto,name,or"
    );
    conn.write_all(head.as_bytes()).await.expect("write");
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        // The answer, up to the end of its JSON body.
        while !answer.ends_with(b"}") {
            let n = conn.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(read.is_ok(), "no answer in 10 s");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("urn:groupcast:problem:timeout"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ingest_len(&store, batch).await, 0);
}
