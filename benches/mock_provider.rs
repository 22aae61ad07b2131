//! Throughput of the mock provider's add endpoint.
//!
//! `cargo bench --bench mock_provider` (release). Four client tasks, each on
//! its own keep-alive connection and its own group, add 10,000-message
//! requests until `BENCH_MESSAGES` (default 2,000,000) messages are in.
//! Three runs, one line each:
//!
//! - `client`: through [`ProviderClient`] against an in-process mock: the
//!   real path, but the client's JSON encoding and result decoding share the
//!   machine's two cores and the same runtime with the mock, so this
//!   understates the mock;
//! - `raw`: pre-encoded, pre-signed bodies against an in-process mock: the
//!   client does almost nothing, so this is close to the mock alone;
//! - `raw-child`: the same against the mock in a child process (this binary
//!   re-executed), so client and server do not share a runtime.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::provider::{
    auth, Message, MessageType, ProviderClient, ProviderConfig, MAX_MESSAGES_PER_REQUEST,
};
use groupcast_rigs::mock::{self, MockConfig};

const TASKS: usize = 4;
const SERVE_ENV: &str = "GROUPCAST_BENCH_SERVE";

fn total_messages() -> usize {
    std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000)
}

fn mock_config() -> MockConfig {
    MockConfig {
        cap: u64::MAX,
        ..MockConfig::default()
    }
}

fn message(n: usize) -> Message {
    Message {
        to: format!("010{n:08}"),
        from: "0212345678".into(),
        r#type: MessageType::Ata,
        text: "[groupcast] Hello Kim, your order 12345 has shipped.".into(),
        kakao_options: Some(groupcast::provider::KakaoOptions {
            pf_id: "KA01PF0000000000000000000000".into(),
            template_id: "KA01TP0000000000000000000000".into(),
            variables: [("#{name}".to_owned(), "Kim".to_owned())].into(),
        }),
    }
}

/// Messages of request `r` of task `t`: disjoint numbers everywhere.
fn batch(t: usize, r: usize, per_task: usize) -> Vec<Message> {
    let start = t * per_task + r * MAX_MESSAGES_PER_REQUEST;
    (start..start + MAX_MESSAGES_PER_REQUEST)
        .map(message)
        .collect()
}

fn client(base_url: &str) -> ProviderClient {
    let cfg = MockConfig::default();
    ProviderClient::new(ProviderConfig {
        base_url: base_url.to_owned(),
        api_key: cfg.api_key,
        api_secret: cfg.api_secret,
        request_timeout: Duration::from_secs(120),
        ..ProviderConfig::default()
    })
    .expect("client")
}

fn report(mode: &str, messages: usize, elapsed: Duration) {
    println!(
        "mock_provider mode={mode} messages={messages} tasks={TASKS} batch={MAX_MESSAGES_PER_REQUEST} \
         elapsed={:.2}s messages/s={:.0}",
        elapsed.as_secs_f64(),
        messages as f64 / elapsed.as_secs_f64()
    );
}

async fn run_client(base_url: &str, requests_per_task: usize) -> (usize, Duration) {
    let per_task = requests_per_task * MAX_MESSAGES_PER_REQUEST;
    let mut tasks = Vec::new();
    // Each task gets its own client, hence its own connection.
    let mut prepared = Vec::new();
    for t in 0..TASKS {
        let c = client(base_url);
        let g = c.create_group(&BTreeMap::new()).await.expect("create");
        prepared.push((c, g.group_id, t));
    }
    let started = Instant::now();
    for (c, group_id, t) in prepared {
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            for r in 0..requests_per_task {
                // Building the messages is on the clock (keeping it off
                // would need every message in memory at once); it is cheap
                // next to the JSON work.
                let msgs = batch(t, r, per_task);
                let regs = c.add_messages(&group_id, &msgs).await.expect("add");
                n += regs.len();
            }
            n
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("task");
    }
    (n, started.elapsed())
}

async fn run_raw(base_url: &str, requests_per_task: usize) -> (usize, Duration) {
    let per_task = requests_per_task * MAX_MESSAGES_PER_REQUEST;
    let cfg = MockConfig::default();
    let c = client(base_url);
    let mut prepared = Vec::new();
    for t in 0..TASKS {
        let g = c.create_group(&BTreeMap::new()).await.expect("create");
        let bodies: Vec<(String, Vec<u8>)> = (0..requests_per_task)
            .map(|r| {
                let body =
                    serde_json::to_vec(&serde_json::json!({ "messages": batch(t, r, per_task) }))
                        .expect("encode");
                let authz = auth::authorization(
                    &cfg.api_key,
                    &cfg.api_secret,
                    &auth::now_date(),
                    &auth::new_salt(),
                );
                (authz, body)
            })
            .collect();
        prepared.push((g.group_id, bodies));
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (group_id, bodies) in prepared {
        let http = reqwest::Client::new();
        let url = format!("{base_url}/messages/v4/groups/{group_id}/messages");
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            for (authz, body) in bodies {
                let resp = http
                    .put(&url)
                    .header("Authorization", authz)
                    .header("Content-Type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("send");
                assert!(resp.status().is_success(), "{}", resp.status());
                let bytes = resp.bytes().await.expect("body");
                assert!(bytes.len() > MAX_MESSAGES_PER_REQUEST * 50);
                n += MAX_MESSAGES_PER_REQUEST;
            }
            n
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("task");
    }
    (n, started.elapsed())
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    if std::env::var_os(SERVE_ENV).is_some() {
        // Child mode: serve on a free port, tell the parent which, run until killed.
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            println!("{}", listener.local_addr().expect("addr"));
            mock::serve(listener, mock_config()).await.expect("serve");
        });
        return;
    }

    let total = total_messages();
    let requests_per_task = total.div_ceil(TASKS * MAX_MESSAGES_PER_REQUEST).max(1);
    let messages = requests_per_task * TASKS * MAX_MESSAGES_PER_REQUEST;

    rt.block_on(async {
        for mode in ["client", "raw"] {
            let m = mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
                .await
                .expect("start");
            let (n, elapsed) = if mode == "client" {
                run_client(&m.base_url(), requests_per_task).await
            } else {
                run_raw(&m.base_url(), requests_per_task).await
            };
            let s = m.ledger_summary();
            assert_eq!(n, messages);
            assert_eq!(
                s.totals.registered, messages as u64,
                "every message registered"
            );
            assert!(s.duplicate_registrations.is_empty());
            report(mode, n, elapsed);
            m.shutdown().await.expect("shutdown");
        }
    });

    // Out of process: this binary again, in serve mode.
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = std::process::Command::new(exe)
        .env(SERVE_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn child mock");
    let addr = {
        use std::io::BufRead;
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("child address");
        line.trim().to_owned()
    };
    let (n, elapsed) = rt.block_on(run_raw(&format!("http://{addr}"), requests_per_task));
    report("raw-child", n, elapsed);
    let _ = child.kill();
    let _ = child.wait();
}
