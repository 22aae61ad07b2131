//! The board in a real headless browser (Debian's `chromium`) against real
//! workers and a real redis-server: the overview with a finished batch and
//! a batch missing a chunk, the stuck batch's page naming the missing seq,
//! the dead letters listing an undecodable entry, and an action refused
//! without the token and performed with it. Screenshots are saved under
//! `target/board-screenshots/` for people to look at.
//!
//! Needs `chromium` (Debian: `apt-get install chromium`, or
//! `scripts/ensure-deps --tests`); without it the test fails and says so.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use groupcast::producer::{append_chunks, append_raw, cut};

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");
const TOKEN: &str = "board-test-token-5f1c";

fn require_chromium() {
    if let Err(e) = Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        panic!(
            "`chromium` is needed by this test and cannot be run ({e}): \
             apt-get install chromium (or scripts/ensure-deps --tests)"
        );
    }
}

/// Runs headless chromium on `url` with `extra` arguments, in a fresh
/// profile; returns its stdout.
fn chromium(url: &str, extra: &[String]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn dump_dom(url: &str) -> String {
    chromium(url, &["--dump-dom".to_string()])
}

fn screenshot(url: &str, path: &Path) {
    let _ = std::fs::remove_file(path);
    chromium(
        url,
        &[
            format!("--screenshot={}", path.display()),
            "--window-size=1400,900".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    );
    let png = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        png.starts_with(b"\x89PNG"),
        "{} is not a PNG",
        path.display()
    );
}

/// The `<tr>` of the overview whose `data-batch` is `batch`.
fn row_of<'a>(dom: &'a str, batch: &str) -> &'a str {
    let at = dom
        .find(&format!("data-batch=\"{batch}\""))
        .unwrap_or_else(|| panic!("no row for batch {batch} in the overview:\n{dom}"));
    let end = dom[at..].find("</tr>").map_or(dom.len(), |e| at + e);
    &dom[at..end]
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A `groupcast board` process; killed on drop.
struct BoardProcess {
    child: Child,
    base: String,
}

impl Drop for BoardProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_board(redis_url: &str, token: Option<&str>) -> BoardProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut cmd = Command::new(BIN);
    cmd.args(["board", "--stall-after", "1s", "--prefix", "gct"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--redis")
        .arg(redis_url)
        .env_remove("GROUPCAST_BOARD_TOKEN")
        .env_remove("GROUPCAST_BOARD_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(t) = token {
        cmd.env("GROUPCAST_BOARD_TOKEN", t);
    }
    let board = BoardProcess {
        child: cmd.spawn().expect("spawn the board"),
        base: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    wait_json(
        &http,
        &format!("{}/api/overview", board.base),
        "the board",
        |_| true,
    )
    .await;
    board
}

/// Polls a JSON URL until `ok` holds for its body (bounded); returns it.
async fn wait_json(
    http: &reqwest::Client,
    url: &str,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    loop {
        if let Ok(r) = http.get(url).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                if ok(&v) {
                    return v;
                }
                last = v.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 30s; last {last}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/board-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_board_shows_batches_a_missing_seq_and_dead_letters_and_acts_only_with_the_token() {
    require_chromium();
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    // A batch that finishes.
    let done = "spring-sale".to_string();
    append_chunks(&rig.store, &shuffled_chunks(&done, 1, 600, 200, 3))
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&done), Duration::from_secs(30))
        .await;
    // A batch whose chunk 1 never comes.
    let stuck = "stuck-batch".to_string();
    let mut chunks = cut(&stuck, &template(), recipients(5, 300), 100);
    assert_eq!(chunks.len(), 3);
    chunks.remove(1);
    append_chunks(&rig.store, &chunks).await.expect("append");
    // An ingest entry that is not a chunk at all.
    let ingest = rig.store.keys.ingest(0);
    let garbage = vec![
        ("v".to_string(), b"1".to_vec()),
        ("t".to_string(), b"chunk".to_vec()),
        ("d".to_string(), b"\xc1 not msgpack".to_vec()),
    ];
    append_raw(&rig.store, &ingest, &garbage)
        .await
        .expect("raw");

    let board = start_board(&url, Some(TOKEN)).await;
    let http = reqwest::Client::new();
    let api = |p: &str| format!("{}{p}", board.base);
    // Wait until the API agrees with what we set up, so that the browser
    // renders a settled state.
    wait_json(
        &http,
        &api("/api/overview"),
        "the stuck batch stalled",
        |v| {
            v["batches"].as_array().is_some_and(|b| {
                b.iter()
                    .any(|b| b["batch"] == stuck.as_str() && b["state"] == "stalled")
                    && b.iter()
                        .any(|b| b["batch"] == done.as_str() && b["state"] == "reported")
            })
        },
    )
    .await;
    let dlq = wait_json(&http, &api("/api/dlq"), "the dead letter", |v| {
        v["deadLetters"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;
    let letter = dlq["deadLetters"][0].clone();
    let letter_id = letter["id"].as_str().expect("id").to_string();
    let reason = letter["reason"].as_str().expect("reason").to_string();
    assert!(!reason.is_empty(), "{letter}");

    // The overview: the finished batch reported completed, the stuck one
    // stalled with 2 of 3 chunks.
    let dom = dump_dom(&api("/"));
    let row = row_of(&dom, &done);
    assert!(
        row.contains("reported") && row.contains("completed"),
        "{row}"
    );
    let row = row_of(&dom, &stuck);
    assert!(row.contains("stalled") && row.contains("2/3"), "{row}");
    assert!(dom.contains("id=\"streams\""), "no stream health:\n{dom}");
    screenshot(&api("/"), &shots().join("overview.png"));

    // The stuck batch's page names the missing seq.
    let page = api(&format!("/batches/{stuck}"));
    let dom = dump_dom(&page);
    assert!(
        dom.contains("Missing seqs (not accepted yet): 1<"),
        "the stuck batch's page does not name seq 1:\n{dom}"
    );
    assert!(
        dom.contains("id=\"timeline\"") && dom.contains("chunk_assigned"),
        "{dom}"
    );
    screenshot(&page, &shots().join("batch.png"));

    // The dead letters list the undecodable entry with its reason.
    let dom = dump_dom(&api("/dlq"));
    assert!(
        dom.contains(&letter_id) && dom.contains(&escape(&reason)),
        "the dead-letter page lacks {letter_id} ({reason}):\n{dom}"
    );
    screenshot(&api("/dlq"), &shots().join("dlq.png"));

    // Actions: refused without the token, with a wrong one, from another
    // origin or without the board's header; each refusal changes nothing.
    let redrive = api(&format!("/api/dlq/{letter_id}/redrive"));
    let still_there = async || {
        let v: serde_json::Value = http
            .get(api("/api/dlq"))
            .send()
            .await
            .expect("dlq")
            .json()
            .await
            .expect("json");
        v["deadLetters"]
            .as_array()
            .is_some_and(|d| d.iter().any(|l| l["id"] == letter_id.as_str()))
    };
    for (what, req, status) in [
        (
            "no token",
            http.post(&redrive).header("X-Groupcast-Board", "1"),
            401,
        ),
        (
            "a wrong token",
            http.post(&redrive)
                .header("X-Groupcast-Board", "1")
                .bearer_auth("guess"),
            401,
        ),
        (
            "another origin",
            http.post(&redrive)
                .header("X-Groupcast-Board", "1")
                .header("Origin", "https://evil.example")
                .bearer_auth(TOKEN),
            403,
        ),
        (
            "no board header",
            http.post(&redrive).bearer_auth(TOKEN),
            403,
        ),
    ] {
        let r = req.send().await.expect("post");
        assert_eq!(r.status().as_u16(), status, "{what}");
        assert!(
            still_there().await,
            "a refused redrive ({what}) changed something"
        );
    }
    // A read-only board (no token configured) refuses even the right token.
    let read_only = start_board(&url, None).await;
    let r = http
        .post(format!("{}/api/dlq/{letter_id}/redrive", read_only.base))
        .header("X-Groupcast-Board", "1")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 403);
    assert!(still_there().await, "the read-only board changed something");
    // With the token, as the page sends it: performed.
    let r = http
        .post(&redrive)
        .header("X-Groupcast-Board", "1")
        .header("Origin", board.base.clone())
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    assert!(
        !still_there().await,
        "the redriven dead letter is still there"
    );
    rig.stop().await;
}

/// The report panel of a batch with failures renders each value as text
/// (the failures by reason as "code: count" items), never as
/// `[object HTMLElement]` or `[object Object]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_report_panel_of_a_batch_with_failures_renders_the_failures() {
    require_chromium();
    // The mock refuses (`1000`) every recipient beyond 4 in a group; the
    // workers do not know that cap, so 6 of the 10 recipients fail.
    let mock = groupcast_rigs::mock::MockConfig {
        cap: 4,
        ..mock_config()
    };
    let rig = Rig::start(1, test_config(), mock).await;
    let batch = "partly-refused".to_string();
    append_chunks(&rig.store, &cut(&batch, &template(), recipients(7, 10), 5))
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    let board = start_board(&rig.server.url(), None).await;
    let page = format!("{}/batches/{batch}", board.base);
    let dom = dump_dom(&page);
    assert!(
        !dom.contains("[object"),
        "the batch page renders an object as text:\n{dom}"
    );
    let at = dom
        .find("id=\"report\"")
        .unwrap_or_else(|| panic!("no report panel:\n{dom}"));
    let report = &dom[at..at + dom[at..].find("</dl>").unwrap_or(dom.len() - at)];
    for shown in [
        "<dt>outcome</dt><dd>partial</dd>",
        "<dt>failed</dt><dd>6</dd>",
        "<li>1000: 6</li>",
    ] {
        assert!(
            report.contains(shown),
            "the report lacks {shown}:\n{report}"
        );
    }
    screenshot(&page, &shots().join("batch-failures.png"));
    rig.stop().await;
}

/// The batch page's Close and Cancel buttons, and the actions behind them:
/// refused without the token, from another origin or without the board's
/// header (nothing changes), performed with it; a read-only board shows the
/// buttons disabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_board_closes_and_cancels_a_batch_only_with_the_token() {
    require_chromium();
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    // Two batches whose seq 1 never comes.
    let (to_cancel, to_close) = ("cancel-me", "close-me");
    for (k, b) in [to_cancel, to_close].iter().enumerate() {
        let mut chunks = cut(b, &template(), recipients(20 + k as u32, 300), 100);
        chunks.remove(1);
        append_chunks(&rig.store, &chunks).await.expect("append");
        let log = rig.store.batch(b);
        wait_until(Duration::from_secs(30), "two chunks loaded", || {
            let log = log.clone();
            async move { log.state().await.is_ok_and(|s| s.int("g:0:l") == 2) }
        })
        .await;
    }
    let board = start_board(&url, Some(TOKEN)).await;
    let http = reqwest::Client::new();
    let api = |p: &str| format!("{}{p}", board.base);
    let dom = dump_dom(&api(&format!("/batches/{to_cancel}")));
    assert!(
        dom.contains("id=\"cancel\"") && dom.contains("id=\"close\""),
        "the batch page has no Close and Cancel buttons:\n{dom}"
    );
    let cancel = api(&format!(
        "/api/batches/{to_cancel}/cancel?reason=wrong%20coupon"
    ));
    for (what, req, status) in [
        (
            "no token",
            http.post(&cancel).header("X-Groupcast-Board", "1"),
            401,
        ),
        (
            "another origin",
            http.post(&cancel)
                .header("X-Groupcast-Board", "1")
                .header("Origin", "https://evil.example")
                .bearer_auth(TOKEN),
            403,
        ),
        (
            "no board header",
            http.post(&cancel).bearer_auth(TOKEN),
            403,
        ),
    ] {
        let r = req.send().await.expect("post");
        assert_eq!(r.status().as_u16(), status, "{what}");
        let st = rig.store.batch(to_cancel).state().await.expect("state");
        assert!(
            st.cancelled().is_none(),
            "a refused cancel ({what}) cancelled"
        );
    }
    let r = http
        .post(&cancel)
        .header("X-Groupcast-Board", "1")
        .header("Origin", board.base.clone())
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["stopped"], 1, "{v}");
    assert_eq!(v["reason"], "wrong coupon", "{v}");
    let r = http
        .post(api(&format!("/api/batches/{to_close}/close")))
        .header("X-Groupcast-Board", "1")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["missing"], 1, "{v}");
    rig.wait_reported(
        &[to_cancel.to_string(), to_close.to_string()],
        Duration::from_secs(30),
    )
    .await;
    for (b, outcome) in [(to_cancel, "cancelled"), (to_close, "partial")] {
        let st = rig.store.batch(b).state().await.expect("state");
        assert_eq!(st.report(), Some(outcome), "{b}");
    }
    // Cancelling again answers the same; a batch reported otherwise has
    // nothing to cancel (409).
    let r = http
        .post(&cancel)
        .header("X-Groupcast-Board", "1")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(
        r.status().as_u16(),
        200,
        "cancelling again answers the same"
    );
    let r = http
        .post(api(&format!("/api/batches/{to_close}/cancel")))
        .header("X-Groupcast-Board", "1")
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 409);
    // A read-only board: the buttons are there, disabled.
    let stuck = "stuck-read-only";
    let mut chunks = cut(stuck, &template(), recipients(22, 300), 100);
    chunks.remove(1);
    append_chunks(&rig.store, &chunks).await.expect("append");
    let read_only = start_board(&url, None).await;
    wait_json(
        &http,
        &format!("{}/api/batches/{stuck}", read_only.base),
        "the read-only board sees the batch",
        |v| v["chunks"] == 2,
    )
    .await;
    let dom = dump_dom(&format!("{}/batches/{stuck}", read_only.base));
    let button = dom
        .find("id=\"cancel\"")
        .map(|at| &dom[dom[..at].rfind('<').unwrap_or(0)..at + 40])
        .unwrap_or_else(|| panic!("no Cancel button on a read-only board:\n{dom}"));
    assert!(button.contains("disabled"), "{button}");
    rig.stop().await;
}

/// The batch page's results download: refused without the token, the
/// stored outcomes as CSV with it (numbers in full only when asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_results_download_needs_the_token_and_lists_who_failed() {
    let mock = groupcast_rigs::mock::MockConfig {
        cap: 4,
        ..mock_config()
    };
    let rig = Rig::start(1, test_config(), mock).await;
    let batch = "download-me".to_string();
    append_chunks(&rig.store, &cut(&batch, &template(), recipients(8, 10), 5))
        .await
        .expect("append");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(30))
        .await;
    // Its delivery results in (the export reads what tracking wrote).
    let log = rig.store.batch(&batch);
    wait_until(Duration::from_secs(30), "the delivery report", || async {
        log.read(&[groupcast::projection::field::DL_REPORT.into()])
            .await
            .is_ok_and(|p| p.get(groupcast::projection::field::DL_REPORT).is_some())
    })
    .await;
    let board = start_board(&rig.server.url(), Some("s3cret")).await;
    let url = format!("{}/api/batches/{batch}/results", board.base);
    let http = reqwest::Client::new();
    let refused = http
        .get(&url)
        .header("X-Groupcast-Board", "1")
        .send()
        .await
        .expect("get");
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let get = |q: &str| {
        http.get(format!("{url}{q}"))
            .header("X-Groupcast-Board", "1")
            .header("Authorization", "Bearer s3cret")
            .send()
    };
    let csv = get("").await.expect("get").text().await.expect("body");
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(rows.len(), 6, "{csv}");
    assert!(
        rows.iter()
            .all(|r| r.contains("****") && r.contains(",failed,registration,1000,")),
        "{csv}"
    );
    let full = get("?show_numbers=1&format=jsonl")
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    let numbers: Vec<String> = full
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["number"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(numbers.len(), 6);
    assert!(
        numbers.iter().all(|n| n.len() == 11 && !n.contains('*')),
        "{numbers:?}"
    );
    rig.stop().await;
}
