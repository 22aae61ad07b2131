//! Child processes and their output (waited on without sleeping), servers,
//! input files, and waits on a batch: what every security test uses.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use groupcast::store::Store;
use groupcast_rigs::redis_server::{RedisServer, ServerOptions};

use crate::common::dead_letters;

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

// ---------------------------------------------------------------------------
// Child processes, their output, and waiting on it without sleeping.

/// Everything a child wrote to one of its pipes, and whether it closed.
#[derive(Clone, Default)]
pub struct Output(Arc<(Mutex<(String, bool)>, Condvar)>);

impl Output {
    fn collect(pipe: impl Read + Send + 'static) -> Output {
        let out = Output::default();
        let o = out.clone();
        std::thread::spawn(move || {
            let mut r = BufReader::new(pipe);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = r.read_until(b'\n', &mut line).unwrap_or(0);
                let (lock, cv) = &*o.0;
                let mut g = lock.lock().expect("lock");
                if n == 0 {
                    g.1 = true;
                    cv.notify_all();
                    return;
                }
                g.0.push_str(&String::from_utf8_lossy(&line));
                cv.notify_all();
            }
        });
        out
    }

    pub fn text(&self) -> String {
        self.0 .0.lock().expect("lock").0.clone()
    }

    /// Waits (bounded) until `pred` holds for the text so far, or the pipe closes.
    fn wait(&self, limit: Duration, pred: impl Fn(&str, bool) -> bool) -> bool {
        let (lock, cv) = &*self.0;
        let deadline = Instant::now() + limit;
        let mut g = lock.lock().expect("lock");
        loop {
            if pred(&g.0, g.1) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            g = cv.wait_timeout(g, deadline - now).expect("lock").0;
        }
    }

    /// The first line containing `needle`, waiting for it (bounded).
    pub fn line_with(&self, needle: &str, limit: Duration) -> Option<String> {
        self.wait(limit, |t, closed| t.contains(needle) || closed);
        self.text()
            .lines()
            .find(|l| l.contains(needle))
            .map(str::to_string)
    }

    fn closed(&self, limit: Duration) -> bool {
        self.wait(limit, |_, closed| closed)
    }
}

/// A running `groupcast` (or other) process, killed on drop.
pub struct Proc {
    child: Child,
    pub out: Output,
    pub err: Output,
    what: String,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let out = Output::collect(child.stdout.take().expect("stdout"));
        let err = Output::collect(child.stderr.take().expect("stderr"));
        Proc {
            child,
            out,
            err,
            what,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the process to end: both pipes close when it does.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        let closed = self.out.closed(limit) && self.err.closed(deadline - Instant::now());
        assert!(
            closed,
            "{} still running after {limit:?}; stderr:\n{}",
            self.what,
            self.err.text()
        );
        self.child.wait().expect("wait")
    }

    /// SIGTERM (the way an operator stops a worker), then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM {} failed", self.pid());
        self.wait_exit(Duration::from_secs(30))
    }

    /// The command line as `ps` shows it.
    pub fn cmdline(&self) -> String {
        std::fs::read(format!("/proc/{}/cmdline", self.pid()))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `groupcast ARGS` with only the given GROUPCAST_* variables (none inherited).
pub fn groupcast(args: &[&str], env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("GROUPCAST_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs a command to its end (bounded): exit status, stdout, stderr.
pub fn run(args: &[&str], env: &[(&str, String)]) -> (ExitStatus, String, String) {
    let mut p = Proc::spawn(groupcast(args, env));
    let status = p.wait_exit(Duration::from_secs(60));
    (status, p.out.text(), p.err.text())
}

pub fn run_ok(args: &[&str], env: &[(&str, String)]) -> String {
    let (status, out, err) = run(args, env);
    assert!(
        status.success(),
        "groupcast {args:?} failed ({status}):\nstdout: {out}\nstderr: {err}"
    );
    out + &err
}

// ---------------------------------------------------------------------------
// Servers and inputs.

pub fn server(args: &[&str], port: u16, ready_url: Option<String>) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        args: args.iter().map(|s| s.to_string()).collect(),
        port: Some(port),
        ready_url,
        ..ServerOptions::default()
    })
    .unwrap_or_else(|e| panic!("tests need a real redis-server: {e}"))
}

pub fn template_file(dir: &Path) -> String {
    let p = dir.join("template.json");
    std::fs::write(
        &p,
        r#"{"type": "SMS", "from": "0212345678", "text": "Hi #{name}, your code is #{code}"}"#,
    )
    .expect("write");
    p.display().to_string()
}

pub fn recipients_file(dir: &Path, k: u64, n: u64) -> String {
    let p = dir.join(format!("recipients-{k}.csv"));
    let mut s = String::from("to,name,code\n");
    for i in 0..n {
        s.push_str(&format!("010{:08},Kim{i},C{i}\n", k * 1_000_000 + i));
    }
    std::fs::write(&p, s).expect("write");
    p.display().to_string()
}

/// Waits (bounded) for a batch's report.
pub async fn wait_reported(store: &Store, batch: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let st = store.batch(batch).state().await.expect("state");
        if st.get("report").is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "batch {batch} did not report within {limit:?}; dead letters: {:?}",
            dead_letters(store).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until there are `n` dead letters.
pub async fn wait_dead_letters(store: &Store, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let letters = dead_letters(store).await;
        if letters.len() >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} dead letters, expected {n}: {letters:?}",
            letters.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Worker flags for quick tests (timings as in `common::test_config`).
pub fn worker_args<'a>(provider_url: &'a str, metrics: &'a str) -> Vec<&'a str> {
    vec![
        "worker",
        "--provider-url",
        provider_url,
        "--metrics-listen",
        metrics,
        "--rate-limit",
        "0",
        "--backoff-base",
        "20ms",
        "--backoff-max",
        "300ms",
        "--poll-interval",
        "30ms",
        "--visibility-timeout",
        "2s",
        "--durability",
        "none",
    ]
}

// ---------------------------------------------------------------------------
// The processes of a deployment, started as a user starts them.

/// The mock provider on a free port, with its credentials from `env`
/// (`GROUPCAST_MOCK_API_KEY` / `_SECRET`, or their `_FILE` variants): the
/// process and its base URL.
pub fn mock_provider(env: &[(&str, String)]) -> (Proc, String) {
    let mock = Proc::spawn(groupcast(
        &[
            "mock-provider",
            "--listen",
            "127.0.0.1:0",
            "--complete-after-ms",
            "30",
        ],
        env,
    ));
    let url = url_in(&mock.out, "listening on http://", "mock provider", &mock);
    (mock, url)
}

/// A read-only board on a free port: the process and its base URL.
pub fn board(redis_url: &str) -> (Proc, String) {
    let board = Proc::spawn(groupcast(
        &["board", "--listen", "127.0.0.1:0"],
        &[("GROUPCAST_REDIS_URL", redis_url.to_string())],
    ));
    let url = url_in(&board.err, "board at http://", "board", &board);
    (board, url.trim_end_matches('/').to_string())
}

/// The `http://` URL on the first line of `pipe` that holds `needle`.
fn url_in(pipe: &Output, needle: &str, what: &str, p: &Proc) -> String {
    let line = pipe
        .line_with(needle, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{what} did not start: {}", p.err.text()));
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string()
}

/// A worker, once it said it started.
pub fn started_worker(args: &[&str], env: &[(&str, String)]) -> Proc {
    let worker = Proc::spawn(groupcast(args, env));
    assert!(
        worker
            .err
            .line_with("worker started", Duration::from_secs(30))
            .is_some(),
        "worker did not start: {}",
        worker.err.text()
    );
    worker
}

/// `GET base + path` as text (bounded).
pub async fn get_text(base: &str, path: &str) -> String {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    client
        .get(format!("{base}{path}"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .text()
        .await
        .expect("body")
}
