//! Secrets stay in the environment: never in logs, errors, metrics, the
//! audit, command lines or Redis.

use std::time::Duration;

use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast_rigs::redis_server::free_port;

use crate::support::*;

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
    let (mut mock, provider_url) = mock_provider(&[
        ("GROUPCAST_MOCK_API_KEY_FILE", key_file.clone()),
        ("GROUPCAST_MOCK_API_SECRET_FILE", secret_file.clone()),
    ]);

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
    let mut worker = started_worker(&wargs, &worker_env);
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
