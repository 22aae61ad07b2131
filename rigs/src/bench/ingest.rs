//! `groupcast bench --ingest`: ingest alone, no worker. The workload's
//! chunks go in three times, each into batches of their own: through the
//! stream path (the [`Producer`], as `submit` appends), and through
//! `groupcast serve`'s `PUT /v1/batches/{id}/chunks/{seq}` with MessagePack
//! and with JSON bodies, from `--concurrency` clients. The bodies are built
//! before the clock starts (a producer's own encoding is not the server's
//! cost). Prints recipients per second of each path, one JSON line. With no
//! worker reading, the front door runs without its unread-chunk bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::workload::{bench_template, Plan};
use super::BenchArgs;
use crate::redis_server::RedisServer;
use groupcast::cli::serve::tokens::Tokens;
use groupcast::cli::serve::{api_router, Front, RETRY_AFTER};
use groupcast::cli::CliError;
use groupcast::events::Chunk;
use groupcast::keys::Keyspace;
use groupcast::producer::Producer;
use groupcast::store::batch::BatchPolicy;
use groupcast::store::Store;

/// The token the bench's clients present.
const SECRET: &str = "bench-ingest-secret-0123456789abcdef";

/// Runs the ingest comparison.
pub(super) async fn run(args: &BenchArgs, plan: &Plan) -> Result<(), CliError> {
    let server = RedisServer::start().map_err(|e| CliError::Usage(e.to_string()))?;
    let store = Store::connect(&server.url(), Keyspace::new("bench", 1)).await?;
    let clients = args.concurrency.max(1);
    let total = plan.total_recipients();

    let chunks = all_chunks(plan, "stream");
    let started = Instant::now();
    let mut producer = Producer::new(store.clone()).max_unread(0);
    producer.append(&chunks).await?;
    let stream = started.elapsed();
    drop(chunks);

    let base = start_front(&store).await?;
    let http = reqwest::Client::new();
    let mut per_second = Vec::new();
    for format in ["msgpack", "json"] {
        let chunks = all_chunks(plan, &format!("http-{format}"));
        for b in 0..plan.batches {
            create_batch(&http, &base, &format!("http-{format}-{b}")).await?;
        }
        let bodies: Vec<(String, Vec<u8>)> = chunks
            .iter()
            .map(|c| {
                let path = format!("{base}/v1/batches/{}/chunks/{}", c.batch, c.seq);
                (path, body(c, format))
            })
            .collect();
        drop(chunks);
        let took = put_all(&http, bodies, format, clients).await?;
        per_second.push(total as f64 / took.as_secs_f64());
    }
    let rate = |d: Duration| (total as f64 / d.as_secs_f64()).round();
    println!(
        "{}",
        json!({
            "bench": "ingest",
            "workload": plan.name,
            "recipients": total,
            "chunk_size": plan.chunk_size,
            "clients": clients,
            "stream_recipients_per_second": rate(stream),
            "http_msgpack_recipients_per_second": per_second[0].round(),
            "http_json_recipients_per_second": per_second[1].round(),
        })
    );
    drop(server);
    Ok(())
}

/// Every chunk of the plan's batches, named `<prefix>-<b>`.
fn all_chunks(plan: &Plan, prefix: &str) -> Vec<Chunk> {
    let template = bench_template();
    let mut chunks = Vec::new();
    for b in 0..plan.batches {
        let batch = format!("{prefix}-{b}");
        for from in plan.append_starts() {
            chunks.extend(plan.append_chunks(&template, b, &batch, from));
        }
    }
    chunks
}

/// A chunk's PUT body in `format`.
fn body(c: &Chunk, format: &str) -> Vec<u8> {
    if format == "msgpack" {
        return c.encode();
    }
    let recipients: Vec<_> = c
        .recipients
        .iter()
        .map(|r| json!({"to": r.to, "vars": r.vars}))
        .collect();
    json!({"recipients": recipients, "last": c.last})
        .to_string()
        .into_bytes()
}

/// Serves the API on a free loopback port; returns its base URL (the
/// server lives as long as the runtime).
async fn start_front(store: &Store) -> Result<String, CliError> {
    let failed = |e: std::io::Error| CliError::Failed(format!("the API: {e}"));
    let tokens = Tokens::parse("bench", &format!("bench ingest,read {SECRET}\n"))
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let front = Front {
        store: store.clone(),
        tokens,
        max_unread: 0,
        retry_after: RETRY_AFTER,
        keep: Duration::from_secs(3600),
        policy: BatchPolicy::for_operator(Duration::from_secs(3600)),
    };
    let app = api_router(
        Arc::new(front),
        groupcast::events::chunk::MAX_CHUNK_BYTES + 64 * 1024,
        Duration::from_secs(60),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(failed)?;
    let addr = listener.local_addr().map_err(failed)?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the bench's API stopped");
        }
    });
    Ok(format!("http://{addr}"))
}

/// `POST /v1/batches` with the bench's template.
async fn create_batch(http: &reqwest::Client, base: &str, batch: &str) -> Result<(), CliError> {
    let t = bench_template();
    let res = http
        .post(format!("{base}/v1/batches"))
        .bearer_auth(SECRET)
        .json(
            &json!({"batch": batch, "template": {"type": t.kind, "from": t.from, "text": t.text}}),
        )
        .send()
        .await
        .map_err(|e| CliError::Failed(format!("create {batch}: {e}")))?;
    if !res.status().is_success() {
        let text = res.text().await.unwrap_or_default();
        return Err(CliError::Failed(format!("create {batch}: {text}")));
    }
    Ok(())
}

/// PUTs every body from `clients` concurrent clients; how long it took.
async fn put_all(
    http: &reqwest::Client,
    bodies: Vec<(String, Vec<u8>)>,
    format: &str,
    clients: usize,
) -> Result<Duration, CliError> {
    let kind = if format == "msgpack" {
        "application/msgpack"
    } else {
        "application/json"
    };
    let queue = Arc::new(std::sync::Mutex::new(bodies));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, queue) = (http.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().ok().and_then(|mut q| q.pop());
                let Some((url, body)) = next else {
                    return Ok(());
                };
                let res = http
                    .put(&url)
                    .bearer_auth(SECRET)
                    .header("content-type", kind)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| format!("PUT {url}: {e}"))?;
                if res.status().as_u16() != 202 {
                    let status = res.status();
                    let text = res.text().await.unwrap_or_default();
                    return Err(format!("PUT {url}: {status} {text}"));
                }
            }
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| CliError::Failed(format!("a client stopped: {e}")))?
            .map_err(CliError::Failed)?;
    }
    Ok(started.elapsed())
}
