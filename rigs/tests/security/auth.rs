//! AUTH: a password, and a least-privilege ACL user.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use groupcast::keys::Keyspace;
use groupcast::store::Store;
use groupcast_rigs::redis_server::{free_port, RedisServer, ServerOptions};

use crate::common::*;
use crate::support::*;

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
    +xadd +xreadgroup +xack +xgroup|create +xautoclaim +xclaim +xpending +xrange +xrevrange +xlen +xinfo|groups +xtrim +xdel \
    +hget +hmget +hgetall +hset +hmset +hincrby +hexists \
    +sadd +srem +smembers +scard \
    +zadd +zrange +zrangebyscore +zrem +zcard +zscore +zremrangebyscore +exists \
    +get +getrange +set +append +del +expire +pexpire +pttl \
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
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md"))
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

    let mock = groupcast_rigs::mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
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
    // A batch past the dedupe's bitmap threshold (100,000 numbers), so that
    // accept.lua's BITFIELD runs as the ACL user too.
    let big = recipients_file(dir.path(), 4, 100_500);
    run_ok(
        &[
            "submit",
            "--batch",
            "acl-2",
            "--recipients",
            &big,
            "--template",
            &t,
            "--chunk-size",
            "5000",
        ],
        &env,
    );
    wait_reported(&admin, "acl-1", Duration::from_secs(60)).await;
    wait_reported(&admin, "acl-2", Duration::from_secs(120)).await;
    wait_dead_letters(&admin, 2).await;

    // Every read-side command, as the ACL user.
    run_ok(&["status"], &env);
    run_ok(&["status", "acl-1", "--json"], &env);
    run_ok(&["audit", "acl-1"], &env);
    run_ok(&["replay", "--all", "--verify"], &env);
    run_ok(&["replay", "--batch", "acl-1"], &env);
    run_ok(&["verify", "acl-1", "--provider-url", &provider_url], &env);
    let list = run_ok(&["dlq", "list", "--json"], &env);
    // The undecodable entry: redriven, it is dead-lettered again (a chunk
    // of the ended batch acl-bad would be counted on the batch instead).
    let id = list
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            v["reason"]
                .as_str()
                .is_some_and(|r| r.contains("undecodable"))
        })
        .find_map(|v| v["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no undecodable dead letter listed: {list}"));
    run_ok(&["dlq", "show", &id], &env);
    run_ok(&["dlq", "redrive", &id, "--yes", "--force"], &env);
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
