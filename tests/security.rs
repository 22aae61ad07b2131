//! Security: Redis AUTH (password and a least-privilege ACL user), TLS
//! (verified with a CA file, refused with a wrong one, client certificates),
//! secrets that never leave the environment, and loopback-only listeners.
//!
//! Every test runs against a real `redis-server` it starts, and most run the
//! built `groupcast` binary as a user would. TLS tests make their own CA with
//! the `openssl` command-line tool.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use common::*;
use groupcast::cli::{Cli, Command as CliCommand};
use groupcast::keys::Keyspace;
use groupcast::redis_server::{free_port, RedisServer, ServerOptions};
use groupcast::store::{ClientTlsConfig, Store, TlsCertificates};

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

// ---------------------------------------------------------------------------
// Child processes, their output, and waiting on it without sleeping.

/// Everything a child wrote to one of its pipes, and whether it closed.
#[derive(Clone, Default)]
struct Output(Arc<(Mutex<(String, bool)>, Condvar)>);

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

    fn text(&self) -> String {
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
    fn line_with(&self, needle: &str, limit: Duration) -> Option<String> {
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
struct Proc {
    child: Child,
    out: Output,
    err: Output,
    what: String,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
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

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the process to end: both pipes close when it does.
    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
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
    fn terminate(&mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -TERM {} failed", self.pid());
        self.wait_exit(Duration::from_secs(30))
    }

    /// The command line as `ps` shows it.
    fn cmdline(&self) -> String {
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
fn groupcast(args: &[&str], env: &[(&str, String)]) -> Command {
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
fn run(args: &[&str], env: &[(&str, String)]) -> (ExitStatus, String, String) {
    let mut p = Proc::spawn(groupcast(args, env));
    let status = p.wait_exit(Duration::from_secs(60));
    (status, p.out.text(), p.err.text())
}

fn run_ok(args: &[&str], env: &[(&str, String)]) -> String {
    let (status, out, err) = run(args, env);
    assert!(
        status.success(),
        "groupcast {args:?} failed ({status}):\nstdout: {out}\nstderr: {err}"
    );
    out + &err
}

// ---------------------------------------------------------------------------
// Servers, certificates, inputs.

fn server(args: &[&str], port: u16, ready_url: Option<String>) -> RedisServer {
    RedisServer::start_with(ServerOptions {
        args: args.iter().map(|s| s.to_string()).collect(),
        port: Some(port),
        ready_url,
        ..ServerOptions::default()
    })
    .unwrap_or_else(|e| panic!("tests need a real redis-server: {e}"))
}

/// A CA, a server certificate for 127.0.0.1/localhost, a client certificate,
/// and an unrelated CA, made with the `openssl` tool.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "the TLS tests need the `openssl` command-line tool ({e}): \
                 install it with `sudo apt-get install openssl`"
            )
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    for ca in ["ca", "wrong-ca"] {
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2"];
        args.extend(ec);
        let (key, crt, subj) = (
            format!("{ca}.key"),
            format!("{ca}.crt"),
            format!("/CN=groupcast test {ca}"),
        );
        args.extend([
            "-keyout",
            &key,
            "-out",
            &crt,
            "-subj",
            &subj,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(d, &args);
    }
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write");
    std::fs::write(
        d.join("client.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("write");
    for (who, cn) in [("server", "localhost"), ("client", "groupcast-worker")] {
        let mut args = vec!["req", "-nodes"];
        args.extend(ec);
        let (key, csr, subj) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("/CN={cn}"),
        );
        args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(d, &args);
        let (crt, ext) = (format!("{who}.crt"), format!("{who}.ext"));
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
        );
    }
    Pki { dir }
}

/// A redis-server speaking TLS on `tls_port` (and plain on `plain` if given).
fn tls_server(pki: &Pki, auth_clients: &str, plain: Option<u16>) -> (RedisServer, u16) {
    let tls_port = free_port().expect("port");
    let (cert, key, ca) = (
        pki.arg("server.crt"),
        pki.arg("server.key"),
        pki.arg("ca.crt"),
    );
    let tls_port_s = tls_port.to_string();
    let mut args = vec![
        "--tls-port",
        &tls_port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        auth_clients,
    ];
    let server = match plain {
        Some(p) => server(&args, p, None),
        None => {
            // TLS only: the plain port is turned off, so readiness is a TLS PING.
            args.extend(["--port", "0"]);
            server(
                &args,
                tls_port,
                Some(format!("rediss://127.0.0.1:{tls_port}/#insecure")),
            )
        }
    };
    (server, tls_port)
}

fn template_file(dir: &Path) -> String {
    let p = dir.join("template.json");
    std::fs::write(
        &p,
        r#"{"type": "SMS", "from": "0212345678", "text": "Hi #{name}, your code is #{code}"}"#,
    )
    .expect("write");
    p.display().to_string()
}

fn recipients_file(dir: &Path, k: u64, n: u64) -> String {
    let p = dir.join(format!("recipients-{k}.csv"));
    let mut s = String::from("to,name,code\n");
    for i in 0..n {
        s.push_str(&format!("010{:08},Kim{i},C{i}\n", k * 1_000_000 + i));
    }
    std::fs::write(&p, s).expect("write");
    p.display().to_string()
}

/// Waits (bounded) for a batch's report.
async fn wait_reported(store: &Store, batch: &str, limit: Duration) {
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
async fn wait_dead_letters(store: &Store, n: usize) {
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
fn worker_args<'a>(provider_url: &'a str, metrics: &'a str) -> Vec<&'a str> {
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
// TLS.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verified_with_the_ca_file_carries_a_whole_batch() {
    let pki = pki();
    let (server, port) = tls_server(&pki, "no", None);
    let url = format!("rediss://127.0.0.1:{port}/");
    let ca = std::fs::read(pki.path("ca.crt")).expect("ca");
    let store = Store::connect_with_tls(
        &url,
        Keyspace::new("gct", 1),
        Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        }),
    )
    .await
    .expect("a server whose certificate our CA signed is trusted");

    // The whole pipeline over TLS, blocking reads included.
    let mock = groupcast::mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock");
    let provider = provider_for(&mock);
    let mut rig = Rig {
        server,
        store,
        mock,
        provider,
        workers: Vec::new(),
        config: test_config(),
    };
    rig.add_worker().await;
    let batch = "tls-batch".to_string();
    let chunks = groupcast::producer::cut(&batch, &template(), recipients(1, 250), 100);
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append over TLS");
    rig.wait_reported(std::slice::from_ref(&batch), Duration::from_secs(60))
        .await;
    rig.verify(std::slice::from_ref(&batch)).await;

    // The CLI, with the CA from GROUPCAST_REDIS_CA_FILE.
    let env = [
        ("GROUPCAST_REDIS_URL", url.clone()),
        ("GROUPCAST_PREFIX", "gct".to_string()),
        ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
    ];
    let out = run_ok(&["status", &batch, "--json"], &env);
    assert!(out.contains("\"report\""), "{out}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_wrong_ca_or_none_is_refused() {
    let pki = pki();
    let (_server, port) = tls_server(&pki, "no", None);
    let url = format!("rediss://127.0.0.1:{port}/");

    // A CA that did not sign the server's certificate, and no CA at all (the
    // system's trust store does not know our test CA): both refused.
    for ca in [Some(pki.arg("wrong-ca.crt")), None] {
        let mut env = vec![("GROUPCAST_REDIS_URL", url.clone())];
        if let Some(ca) = &ca {
            env.push(("GROUPCAST_REDIS_CA_FILE", ca.clone()));
        }
        let (status, _, err) = run(&["status"], &env);
        assert_eq!(status.code(), Some(1), "CA {ca:?} was accepted: {err}");
        assert!(
            err.contains("TLS handshake failed") && err.contains("GROUPCAST_REDIS_CA_FILE"),
            "the message should say the TLS handshake failed and name GROUPCAST_REDIS_CA_FILE: {err}"
        );
        assert!(
            err.contains(&format!("rediss://127.0.0.1:{port}/")),
            "{err}"
        );
    }

    // In process too: the wrong CA is an error, not a connection.
    let wrong = std::fs::read(pki.path("wrong-ca.crt")).expect("ca");
    let r = Store::connect_with_tls(
        &url,
        Keyspace::new("gct", 1),
        Some(TlsCertificates {
            client_tls: None,
            root_cert: Some(wrong),
        }),
    )
    .await;
    assert!(r.is_err(), "a server signed by another CA was trusted");

    // A CA file with a plain URL is a mistake, said as such.
    let (status, _, err) = run(
        &["status"],
        &[
            ("GROUPCAST_REDIS_URL", format!("redis://127.0.0.1:{port}/")),
            ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
        ],
    );
    assert!(!status.success());
    assert!(err.contains("needs a rediss://"), "{err}");

    // A CA file that cannot be read is named.
    let (status, _, err) = run(
        &["status"],
        &[
            ("GROUPCAST_REDIS_URL", url.clone()),
            ("GROUPCAST_REDIS_CA_FILE", "/nonexistent/ca.pem".into()),
        ],
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("GROUPCAST_REDIS_CA_FILE=/nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates_when_the_server_asks_for_them() {
    let pki = pki();
    let plain = free_port().expect("port");
    let (_server, port) = tls_server(&pki, "yes", Some(plain));
    let base = vec![
        ("GROUPCAST_REDIS_URL", format!("rediss://127.0.0.1:{port}/")),
        ("GROUPCAST_REDIS_CA_FILE", pki.arg("ca.crt")),
    ];
    let mut with_cert = base.clone();
    with_cert.push(("GROUPCAST_REDIS_CLIENT_CERT_FILE", pki.arg("client.crt")));
    with_cert.push(("GROUPCAST_REDIS_CLIENT_KEY_FILE", pki.arg("client.key")));
    run_ok(&["status"], &with_cert);

    let (status, _, err) = run(&["status"], &base);
    assert_eq!(status.code(), Some(1), "no client certificate, yet: {err}");
    assert!(
        err.contains("GROUPCAST_REDIS_CLIENT_CERT_FILE"),
        "the message should name the client certificate variables: {err}"
    );

    // In process, the same.
    let certs = TlsCertificates {
        root_cert: Some(std::fs::read(pki.path("ca.crt")).expect("ca")),
        client_tls: Some(ClientTlsConfig {
            client_cert: std::fs::read(pki.path("client.crt")).expect("crt"),
            client_key: std::fs::read(pki.path("client.key")).expect("key"),
        }),
    };
    let store = Store::connect_with_tls(
        &format!("rediss://127.0.0.1:{port}/"),
        Keyspace::new("gct", 1),
        Some(certs),
    )
    .await
    .expect("mutual TLS");
    let pong: String = redis::cmd("PING")
        .query_async(&mut store.raw_conn())
        .await
        .expect("ping");
    assert_eq!(pong, "PONG");
}

// ---------------------------------------------------------------------------
// AUTH: a password, and a least-privilege ACL user.

/// Provider settings for a worker that must fail before calling anyone.
fn dummy_provider() -> Vec<(&'static str, String)> {
    vec![
        ("GROUPCAST_PROVIDER_API_KEY", "unused-key".into()),
        ("GROUPCAST_PROVIDER_API_SECRET", "unused-secret".into()),
    ]
}

fn assert_refused(what: &str, status: ExitStatus, err: &str, secrets: &[&str]) {
    assert!(
        !status.success(),
        "{what}: the worker started with bad credentials"
    );
    assert!(
        err.contains("credentials were refused"),
        "{what}: stderr should say the credentials were refused: {err}"
    );
    for var in ["GROUPCAST_REDIS_USERNAME", "GROUPCAST_REDIS_PASSWORD"] {
        assert!(err.contains(var), "{what}: stderr should name {var}: {err}");
    }
    for s in secrets {
        assert!(!err.contains(s), "{what}: stderr shows the password: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_wrong_credentials_fails_at_start_and_says_so() {
    let port = free_port().expect("port");
    let right = "right-Pw-7c1f";
    let _server = server(
        &["--requirepass", right],
        port,
        Some(format!("redis://:{right}@127.0.0.1:{port}/")),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong_file = dir.path().join("pw");
    std::fs::write(&wrong_file, "wrong-Pw-from-file-93ab\n").expect("write");
    let right_file = dir.path().join("right");
    std::fs::write(&right_file, format!("{right}\n")).expect("write");
    let url = format!("redis://127.0.0.1:{port}/");
    let args = worker_args("http://127.0.0.1:9", "off");
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        (
            "wrong password",
            vec![("GROUPCAST_REDIS_PASSWORD", "wrong-Pw-4d2e".into())],
        ),
        (
            "wrong password file",
            vec![(
                "GROUPCAST_REDIS_PASSWORD_FILE",
                wrong_file.display().to_string(),
            )],
        ),
        ("no password", vec![]),
        (
            "unknown user",
            vec![
                ("GROUPCAST_REDIS_USERNAME", "nobody".into()),
                ("GROUPCAST_REDIS_PASSWORD", right.into()),
            ],
        ),
    ];
    for (what, creds) in cases {
        let mut env = dummy_provider();
        env.push(("GROUPCAST_REDIS_URL", url.clone()));
        env.extend(creds);
        let started = Instant::now();
        let (status, _, err) = run(&args, &env);
        assert_refused(
            what,
            status,
            &err,
            &["wrong-Pw-4d2e", "wrong-Pw-from-file-93ab", right],
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: took {:?}",
            started.elapsed()
        );
    }

    // The right password, from a file: accepted.
    run_ok(
        &["status"],
        &[
            ("GROUPCAST_REDIS_URL", url.clone()),
            (
                "GROUPCAST_REDIS_PASSWORD_FILE",
                right_file.display().to_string(),
            ),
        ],
    );
}

/// The ACL rule documented in docs/security.md, for prefix `gc`: the
/// commands groupcast sends (and its scripts call), on its own keys only.
const ACL_COMMANDS: &str = "+ping +time \
    +xadd +xreadgroup +xack +xgroup|create +xautoclaim +xpending +xrange +xrevrange +xlen +xinfo|groups +xtrim +xdel \
    +hget +hmget +hgetall +hset +hmset +hincrby +hexists \
    +sadd +srem +smembers +scard \
    +zadd +zrange +zrangebyscore +zrem +zcard +exists \
    +get +set +del +expire +pexpire +pttl \
    +evalsha +script|load +scan +multi +exec";

fn acl_user_args(user: &str, password: &str, prefix: &str) -> Vec<String> {
    let mut args = vec![
        "--user".to_string(),
        user.to_string(),
        "on".to_string(),
        format!(">{password}"),
        "resetkeys".to_string(),
        format!("~{prefix}:*"),
        "resetchannels".to_string(),
        "-@all".to_string(),
    ];
    args.extend(ACL_COMMANDS.split_whitespace().map(str::to_string));
    args
}

#[test]
fn the_documented_acl_rule_is_the_tested_one() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md"))
        .expect("docs/security.md");
    let start = doc
        .find("user groupcast on")
        .expect("the rule in docs/security.md");
    let end = start + doc[start..].find("```").expect("end of the rule");
    let documented: std::collections::BTreeSet<&str> = doc[start..end]
        .split_whitespace()
        .filter(|t| t.starts_with('+') || t.starts_with('-') || t.starts_with('~'))
        .collect();
    let mut tested: std::collections::BTreeSet<&str> = ACL_COMMANDS.split_whitespace().collect();
    tested.extend(["-@all", "~gc:*"]);
    assert_eq!(
        documented, tested,
        "docs/security.md and ACL_COMMANDS differ"
    );
}

/// `ACL LOG` as (reason, object, username) triples.
async fn acl_log(admin: &Store) -> Vec<(String, String, String)> {
    let v: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1000)
        .query_async(&mut admin.raw_conn())
        .await
        .expect("acl log");
    v.iter()
        .map(|entry| {
            let items: Vec<String> = match entry {
                redis::Value::Array(a) => a
                    .iter()
                    .map(|x| redis::from_redis_value_ref::<String>(x).unwrap_or_default())
                    .collect(),
                redis::Value::Map(m) => m
                    .iter()
                    .flat_map(|(k, v)| [k, v])
                    .map(|x| redis::from_redis_value_ref::<String>(x).unwrap_or_default())
                    .collect(),
                _ => Vec::new(),
            };
            let get = |name: &str| {
                items
                    .chunks(2)
                    .find(|kv| kv[0] == name)
                    .and_then(|kv| kv.get(1).cloned())
                    .unwrap_or_default()
            };
            (get("reason"), get("object"), get("username"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_the_least_commands_runs_everything() {
    let port = free_port().expect("port");
    let admin_pw = "admin-Pw-51aa";
    let app_pw = "app-Pw-0c9d";
    let mut args: Vec<String> = [
        "--user",
        "default",
        "off",
        "--user",
        "admin",
        "on",
        &format!(">{admin_pw}"),
        "~*",
        "&*",
        "+@all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(acl_user_args("app", app_pw, "gc"));
    let _server = RedisServer::start_with(ServerOptions {
        args,
        port: Some(port),
        ready_url: Some(format!("redis://admin:{admin_pw}@127.0.0.1:{port}/")),
        ..ServerOptions::default()
    })
    .expect("redis-server with ACL users");
    let admin = Store::connect(
        &format!("redis://admin:{admin_pw}@127.0.0.1:{port}/"),
        Keyspace::new("gc", 1),
    )
    .await
    .expect("admin");
    let _: () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query_async(&mut admin.raw_conn())
        .await
        .expect("reset");

    let mock = groupcast::mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock");
    let provider_url = mock.base_url();
    let env = vec![
        ("GROUPCAST_REDIS_URL", format!("redis://127.0.0.1:{port}/")),
        ("GROUPCAST_REDIS_USERNAME", "app".to_string()),
        ("GROUPCAST_REDIS_PASSWORD", app_pw.to_string()),
        ("GROUPCAST_PROVIDER_API_KEY", KEY.to_string()),
        ("GROUPCAST_PROVIDER_API_SECRET", SECRET.to_string()),
    ];
    let mut wargs = worker_args(&provider_url, "off");
    let last = wargs.len() - 1;
    wargs[last] = "everysec";
    // A rate limit, so that the shared limiter's script runs too.
    let at = wargs
        .iter()
        .position(|a| *a == "--rate-limit")
        .expect("flag")
        + 1;
    wargs[at] = "100000";
    let mut worker = Proc::spawn(groupcast(&wargs, &env));
    assert!(
        worker
            .err
            .line_with("worker started", Duration::from_secs(30))
            .is_some(),
        "the worker did not start as the ACL user: {}",
        worker.err.text()
    );
    // CONFIG GET is not granted: the worker says it could not check, and runs.
    let err = worker.err.text();
    assert!(
        err.contains("cannot read maxmemory-policy") && err.contains("durability not checked"),
        "the worker should warn that it could not read the server's settings: {err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let t = template_file(dir.path());
    let r = recipients_file(dir.path(), 3, 500);
    run_ok(
        &[
            "submit",
            "--batch",
            "acl-1",
            "--recipients",
            &r,
            "--template",
            &t,
            "--chunk-size",
            "100",
        ],
        &env,
    );
    // Bad entries, so that the dead-letter and reject paths run as the ACL
    // user too: one undecodable, one a chunk of a batch that fails validation.
    let mut empty = groupcast::producer::cut("acl-bad", &template(), recipients(5, 1), 1);
    empty[0].recipients.clear();
    groupcast::producer::append_chunks(&admin, &empty)
        .await
        .expect("append");
    groupcast::producer::append_raw(
        &admin,
        &admin.keys.ingest(0),
        &[
            ("v".into(), b"1".to_vec()),
            ("t".into(), b"chunk".to_vec()),
            ("d".into(), b"\xc1".to_vec()),
        ],
    )
    .await
    .expect("append");
    wait_reported(&admin, "acl-1", Duration::from_secs(60)).await;
    wait_dead_letters(&admin, 2).await;

    // Every read-side command, as the ACL user.
    run_ok(&["status"], &env);
    run_ok(&["status", "acl-1", "--json"], &env);
    run_ok(&["audit", "acl-1"], &env);
    run_ok(&["replay", "--all", "--verify"], &env);
    run_ok(&["replay", "--batch", "acl-1"], &env);
    run_ok(&["verify", "acl-1", "--provider-url", &provider_url], &env);
    let list = run_ok(&["dlq", "list", "--json"], &env);
    let id = list
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| panic!("no dead letter listed: {list}"));
    run_ok(&["dlq", "show", &id], &env);
    run_ok(&["dlq", "redrive", &id], &env);
    // The redriven entry is dead-lettered again by the worker.
    wait_dead_letters(&admin, 2).await;

    worker.terminate();

    // Reclaiming a crashed consumer's entries and trimming the streams run
    // on timers too slow for this test: run them here, as the ACL user.
    let app = Store::connect(
        &format!("redis://app:{app_pw}@127.0.0.1:{port}/"),
        Keyspace::new("gc", 1),
    )
    .await
    .expect("app user");
    let ingest = app.keys.ingest(0);
    groupcast::producer::append_raw(&app, &ingest, &[("v".into(), b"1".to_vec())])
        .await
        .expect("append");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(groupcast::keys::LOADERS_GROUP)
        .arg("crashed-consumer")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&ingest)
        .arg(">")
        .query_async(&mut app.raw_conn())
        .await
        .expect("read");
    let (claimed, _) = app
        .reclaim(&ingest, groupcast::keys::LOADERS_GROUP, "rescuer", 0, 10)
        .await
        .expect("reclaim as the ACL user");
    assert_eq!(claimed.len(), 1);
    groupcast::worker::maintenance::trim_all(&app)
        .await
        .expect("trim as the ACL user");

    let denied: Vec<_> = acl_log(&admin)
        .await
        .into_iter()
        .filter(|(_, object, _)| !matches!(object.as_str(), "config|get" | "client|setinfo"))
        .collect();
    assert!(
        denied.is_empty(),
        "the ACL user was denied (reason, object, user): {denied:?}\nworker stderr:\n{}",
        worker.err.text()
    );
    assert!(
        !worker.err.text().contains("NOPERM"),
        "{}",
        worker.err.text()
    );

    // The same user with a wrong password: refused, with the clear message.
    let mut bad = env.clone();
    bad[2].1 = "app-wrong-Pw".into();
    let (status, _, err) = run(&worker_args(&provider_url, "off"), &bad);
    assert_refused("ACL user, wrong password", status, &err, &["app-wrong-Pw"]);
}

// ---------------------------------------------------------------------------
// Secrets stay in the environment.

const REDIS_PW: &str = "rpw-Zq8Kx3Lm9Vt2";
const PROVIDER_KEY: &str = "pk-Hy7Wd4Rn1Qs6";
const PROVIDER_SECRET: &str = "ps-Jc5Ug8Eb3Ma0";

fn assert_clean(what: &str, text: &str) {
    for s in [REDIS_PW, PROVIDER_KEY, PROVIDER_SECRET] {
        if let Some(at) = text.find(s) {
            let from = text[..at]
                .char_indices()
                .rev()
                .nth(200)
                .map(|(i, _)| i)
                .unwrap_or(0);
            panic!(
                "{what} contains a secret: …{}…",
                &text[from..(at + s.len()).min(text.len())]
            );
        }
    }
}

/// Every value stored under the server's keys, as text.
async fn everything_in_redis(admin: &Store) -> String {
    let mut conn = admin.raw_conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("keys");
    let mut all = String::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .expect("type");
        let cmd = match kind.as_str() {
            "stream" => redis::cmd("XRANGE").arg(&k).arg("-").arg("+").clone(),
            "hash" => redis::cmd("HGETALL").arg(&k).clone(),
            "set" => redis::cmd("SMEMBERS").arg(&k).clone(),
            "zset" => redis::cmd("ZRANGE").arg(&k).arg(0).arg(-1).clone(),
            _ => redis::cmd("GET").arg(&k).clone(),
        };
        let v: redis::Value = cmd.query_async(&mut conn).await.expect("read");
        all.push_str(&k);
        all.push_str(&format!("{v:?}"));
    }
    assert!(all.contains("secrets-1"), "nothing read from redis?");
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_logs_errors_metrics_audit_or_redis() {
    let port = free_port().expect("port");
    let _server = server(
        &["--requirepass", REDIS_PW],
        port,
        Some(format!("redis://:{REDIS_PW}@127.0.0.1:{port}/")),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, value: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{value}\n")).expect("write");
        p.display().to_string()
    };
    let redis_pw_file = file("redis-pw", REDIS_PW);
    let key_file = file("api-key", PROVIDER_KEY);
    let secret_file = file("api-secret", PROVIDER_SECRET);

    // The mock provider, with its credentials from files.
    let mut mock = Proc::spawn(groupcast(
        &[
            "mock-provider",
            "--listen",
            "127.0.0.1:0",
            "--complete-after-ms",
            "30",
        ],
        &[
            ("GROUPCAST_MOCK_API_KEY_FILE", key_file.clone()),
            ("GROUPCAST_MOCK_API_SECRET_FILE", secret_file.clone()),
        ],
    ));
    let line = mock
        .out
        .line_with("listening on http://", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("mock provider did not start: {}", mock.err.text()));
    let provider_url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("url")
        .to_string();

    // A worker at debug level with JSON logs; the Redis password and the
    // provider secret from files, the provider key from the environment.
    let metrics_port = free_port().expect("port");
    let metrics = format!("127.0.0.1:{metrics_port}");
    let url = format!("redis://127.0.0.1:{port}/");
    let mut wargs = vec!["--log-format", "json"];
    wargs.extend(worker_args(&provider_url, &metrics));
    let worker_env = vec![
        ("GROUPCAST_LOG", "debug".to_string()),
        ("GROUPCAST_REDIS_URL", url.clone()),
        ("GROUPCAST_REDIS_PASSWORD_FILE", redis_pw_file.clone()),
        ("GROUPCAST_PROVIDER_API_KEY", PROVIDER_KEY.to_string()),
        ("GROUPCAST_PROVIDER_API_SECRET_FILE", secret_file.clone()),
    ];
    let mut worker = Proc::spawn(groupcast(&wargs, &worker_env));
    assert!(
        worker
            .err
            .line_with("worker started", Duration::from_secs(30))
            .is_some(),
        "worker did not start: {}",
        worker.err.text()
    );
    assert!(
        worker.err.text().contains("metrics at http://127.0.0.1:"),
        "{}",
        worker.err.text()
    );
    // What `ps` shows.
    assert_clean("the worker's command line", &worker.cmdline());
    assert_clean("the mock provider's command line", &mock.cmdline());

    // A batch (the password from the environment this time), and a bad entry.
    let cli_env = vec![
        ("GROUPCAST_REDIS_URL", url.clone()),
        ("GROUPCAST_REDIS_PASSWORD", REDIS_PW.to_string()),
        ("GROUPCAST_LOG", "debug".to_string()),
        ("GROUPCAST_LOG_FORMAT", "json".to_string()),
    ];
    let t = template_file(dir.path());
    let r = recipients_file(dir.path(), 4, 300);
    let mut seen = String::new();
    seen += &run_ok(
        &[
            "submit",
            "--batch",
            "secrets-1",
            "--recipients",
            &r,
            "--template",
            &t,
            "--chunk-size",
            "100",
        ],
        &cli_env,
    );
    let admin = Store::connect(
        &format!("redis://:{REDIS_PW}@127.0.0.1:{port}/"),
        Keyspace::new("gc", 1),
    )
    .await
    .expect("admin");
    groupcast::producer::append_raw(
        &admin,
        &admin.keys.ingest(0),
        &[
            ("v".into(), b"1".to_vec()),
            ("t".into(), b"chunk".to_vec()),
            ("d".into(), b"\xc1 not msgpack".to_vec()),
        ],
    )
    .await
    .expect("append");
    wait_reported(&admin, "secrets-1", Duration::from_secs(60)).await;
    wait_dead_letters(&admin, 1).await;

    // Everything a user can read.
    let metrics_text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics_text.contains("groupcast_chunks_total"),
        "{metrics_text}"
    );
    assert_clean("/metrics", &metrics_text);
    let mut verify_env = cli_env.clone();
    verify_env.push(("GROUPCAST_PROVIDER_API_KEY_FILE", key_file.clone()));
    verify_env.push(("GROUPCAST_PROVIDER_API_SECRET_FILE", secret_file.clone()));
    for args in [
        vec!["audit", "secrets-1"],
        vec!["audit", "secrets-1", "--json", "--show-numbers"],
        vec!["status"],
        vec!["status", "secrets-1", "--json"],
        vec!["dlq", "list", "--json"],
        vec!["replay", "--all", "--verify"],
    ] {
        let out = run_ok(&args, &cli_env);
        assert_clean(&format!("groupcast {args:?}"), &out);
        seen += &out;
    }
    let out = run_ok(
        &["verify", "secrets-1", "--provider-url", &provider_url],
        &verify_env,
    );
    assert_clean("groupcast verify", &out);
    let list = run_ok(&["dlq", "list", "--json"], &cli_env);
    let id = list
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_string))
        })
        .unwrap_or_else(|| panic!("no dead letter listed: {list}"));
    let out = run_ok(&["dlq", "show", &id, "--json"], &cli_env);
    assert!(out.contains("malformed chunk payload"), "{out}");
    assert_clean("groupcast dlq show", &out);
    assert_clean(
        "what groupcast stored in redis",
        &everything_in_redis(&admin).await,
    );

    // Failed connections: the URL in the message is redacted, whatever
    // carried the password.
    let closed = free_port().expect("port");
    for (what, args, env) in [
        (
            "password in --redis, nothing listening",
            vec![
                "status".to_string(),
                "--redis".to_string(),
                format!("redis://app:{REDIS_PW}@127.0.0.1:{closed}/"),
            ],
            vec![],
        ),
        (
            "password in GROUPCAST_REDIS_URL, nothing listening",
            vec!["status".to_string()],
            vec![(
                "GROUPCAST_REDIS_URL",
                format!("redis://:{REDIS_PW}@127.0.0.1:{closed}/"),
            )],
        ),
        (
            "password in the URL without a scheme",
            vec!["status".to_string()],
            vec![(
                "GROUPCAST_REDIS_URL",
                format!("app:{REDIS_PW}@127.0.0.1:{closed}"),
            )],
        ),
        (
            "right password in GROUPCAST_REDIS_PASSWORD, nothing listening",
            vec!["status".to_string()],
            vec![
                (
                    "GROUPCAST_REDIS_URL",
                    format!("redis://127.0.0.1:{closed}/"),
                ),
                ("GROUPCAST_REDIS_PASSWORD", REDIS_PW.to_string()),
            ],
        ),
        (
            "wrong user, right password",
            vec!["status".to_string()],
            vec![
                ("GROUPCAST_REDIS_URL", url.clone()),
                ("GROUPCAST_REDIS_USERNAME", "nobody".into()),
                ("GROUPCAST_REDIS_PASSWORD", REDIS_PW.to_string()),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, out, err) = run(&args, &env);
        assert!(!status.success(), "{what}: succeeded");
        assert!(
            err.contains("cannot use redis at") || err.contains("cannot"),
            "{what}: {err}"
        );
        assert_clean(what, &(out + &err));
    }

    // Stop the worker and the mock; read all they wrote.
    worker.terminate();
    mock.terminate();
    let worker_logs = worker.out.text() + &worker.err.text();
    assert!(
        worker_logs.contains("\"level\":\"DEBUG\""),
        "the worker should have logged at debug level"
    );
    assert_clean("the worker's output", &worker_logs);
    assert_clean(
        "the mock provider's output",
        &(mock.out.text() + &mock.err.text()),
    );
    assert_clean("the CLI's output", &seen);
}

// ---------------------------------------------------------------------------
// Listeners.

fn loopback(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .is_ok_and(|a| a.ip().is_loopback())
}

#[test]
fn listeners_bind_to_loopback_unless_told_otherwise() {
    for var in ["GROUPCAST_METRICS_LISTEN", "GROUPCAST_MOCK_LISTEN"] {
        assert!(
            std::env::var_os(var).is_none(),
            "unset {var} to run this test: it checks the built-in defaults"
        );
    }
    let cli = Cli::try_parse_from(["groupcast", "worker"]).expect("parse");
    let CliCommand::Worker(w) = cli.command else {
        panic!("not a worker command")
    };
    assert!(
        loopback(&w.worker.metrics_listen),
        "--metrics-listen defaults to {}",
        w.worker.metrics_listen
    );

    let cli = Cli::try_parse_from(["groupcast", "mock-provider"]).expect("parse");
    let CliCommand::MockProvider(m) = cli.command else {
        panic!("not mock-provider")
    };
    assert!(
        m.listen.ip().is_loopback(),
        "--listen defaults to {}",
        m.listen
    );
    // No credentials come from a default either.
    assert!(m.api_key.is_none() && m.api_secret.is_none());

    // The Redis URL's default is loopback too.
    let cli = Cli::try_parse_from(["groupcast", "status"]).expect("parse");
    let CliCommand::Status(s) = cli.command else {
        panic!("not status")
    };
    assert!(
        s.redis.url.starts_with("redis://127.0.0.1:"),
        "{}",
        s.redis.url
    );

    // Binding elsewhere takes an explicit flag.
    let cli = Cli::try_parse_from(["groupcast", "worker", "--metrics-listen", "0.0.0.0:9464"])
        .expect("parse");
    let CliCommand::Worker(w) = cli.command else {
        panic!("not a worker command")
    };
    assert_eq!(w.worker.metrics_listen, "0.0.0.0:9464");
}

#[test]
fn the_private_redis_server_binds_to_loopback() {
    // The demo and the tests start their redis-server through RedisServer:
    // it must listen on 127.0.0.1 only.
    let server = redis();
    let mut c = redis::Client::open(server.url())
        .expect("url")
        .get_connection()
        .expect("connect");
    let bind: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("bind")
        .query(&mut c)
        .expect("config get");
    assert_eq!(
        bind.get(1).map(String::as_str),
        Some("127.0.0.1"),
        "{bind:?}"
    );
}
