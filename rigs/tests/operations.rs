//! What an operator meets when a campaign goes wrong: credentials the
//! provider refuses (at start, and after), a cancel with chunks still
//! coming, and dead letters to work through (list, filter, judge, redrive,
//! purge). Real redis-server, the mock provider, the `groupcast` binary.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use groupcast::producer::{append_chunks, append_raw, cut, ingest_fields};
use groupcast::projection::field;
use groupcast_rigs::mock::Faults;

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

fn groupcast(redis_url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "gct")
        .env("USER", "test-operator")
        .env_remove("GROUPCAST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run groupcast")
}

/// A `groupcast worker` against the provider at `provider_url` with
/// `secret`, logging at INFO to a pipe.
fn worker(redis_url: &str, provider_url: &str, secret: &str) -> std::process::Child {
    Command::new(BIN)
        .args(["worker", "--durability", "none", "--metrics-listen", "off"])
        .env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "gct")
        .env("GROUPCAST_PROVIDER_URL", provider_url)
        .env("GROUPCAST_PROVIDER_API_KEY", KEY)
        .env("GROUPCAST_PROVIDER_API_SECRET", secret)
        .env("GROUPCAST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_credentials_the_provider_refuses_does_not_start() {
    let (server, _store) = store(1).await;
    let mock = groupcast_rigs::mock::start(mock_config(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("mock");
    // A wrong secret: refused at once, exit 2, saying what to fix.
    let mut child = worker(&server.url(), &mock.base_url(), "not-the-secret");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the worker started with a wrong secret");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr");
    }
    assert_eq!(status.code(), Some(2), "{stderr}");
    for expected in [
        "refused the credentials",
        "SignatureDoesNotMatch",
        "GROUPCAST_PROVIDER_API_SECRET",
        "the worker did not start",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
    assert!(
        !stderr.contains("not-the-secret"),
        "the secret leaked: {stderr}"
    );
    // The right secret: the check passes and the worker runs.
    let mut child = worker(&server.url(), &mock.base_url(), SECRET);
    let lines = BufReader::new(child.stderr.take().expect("stderr"));
    let accepted = tokio::task::spawn_blocking(move || {
        lines
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("the provider accepts the credentials"))
    });
    let accepted = tokio::time::timeout(Duration::from_secs(30), accepted).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        matches!(accepted, Ok(Ok(true))),
        "the worker with the right secret did not pass the check"
    );
}

/// A provider that starts with the worker (a mock in the same shell, a
/// container beside it) refuses connections for a moment: the check asks
/// again, and passes once the provider listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_check_waits_for_a_provider_that_is_starting() {
    let (server, _store) = store(1).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = Command::new(BIN)
        .args(["worker", "--durability", "none", "--metrics-listen", "off"])
        .env("GROUPCAST_REDIS_URL", server.url())
        .env("GROUPCAST_PREFIX", "gct")
        .env("GROUPCAST_PROVIDER_URL", format!("http://127.0.0.1:{port}"))
        .env("GROUPCAST_PROVIDER_API_KEY", KEY)
        .env("GROUPCAST_PROVIDER_API_SECRET", SECRET)
        .env("GROUPCAST_LOG", "info,groupcast::cli::worker=debug")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let lines = BufReader::new(child.stderr.take().expect("stderr"));
    std::thread::spawn(move || {
        for l in lines.lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let mut wait_for = async |what: &str| {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = rx.recv().await {
                seen.push_str(&l);
                seen.push('\n');
                if l.contains(what) {
                    return true;
                }
            }
            false
        })
        .await;
        matches!(found, Ok(true))
    };
    // Nothing listens yet: refused, asked again.
    let asked_again = wait_for("the credential check failed: asking again").await;
    // Now the provider comes up on that port.
    let _mock = groupcast_rigs::mock::start(
        mock_config(),
        format!("127.0.0.1:{port}").parse().expect("addr"),
    )
    .await
    .expect("mock");
    let accepted = wait_for("the provider accepts the credentials").await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(asked_again, "the check did not ask again:\n{seen}");
    assert!(
        accepted,
        "the check did not pass once the provider listened:\n{seen}"
    );
    assert!(
        !seen.contains("starting anyway"),
        "the worker gave up on the check:\n{seen}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_refused_after_start_show_on_the_batch() {
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    // The key is revoked while the worker runs.
    rig.mock.set_faults(Faults {
        refuse_credentials: true,
        ..Faults::default()
    });
    let chunks = cut("revoked", &template(), recipients(41, 20), 10);
    append_chunks(&rig.store, &chunks).await.expect("append");
    wait_until(Duration::from_secs(20), "the refusal noted", || async {
        let st = rig.store.batch("revoked").state().await.expect("state");
        st.get(field::CREDS_REFUSED).is_some()
    })
    .await;
    let out = ok_stdout(&groupcast(&url, &["status", "revoked"]));
    assert!(out.contains("provider refused credentials"), "{out}");
    assert!(out.contains("InvalidAPIKey"), "{out}");
    let out = ok_stdout(&groupcast(&url, &["status", "revoked", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(
        v["providerRefusedCredentials"]
            .as_str()
            .is_some_and(|r| r.contains("HTTP 403")),
        "{v}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_after_a_cancel_are_counted_on_the_batch_not_dead_lettered() {
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    let chunks = cut("stopped", &template(), recipients(42, 160), 10);
    append_chunks(&rig.store, &chunks[..1])
        .await
        .expect("append");
    wait_until(Duration::from_secs(20), "the first chunk", || async {
        let st = rig.store.batch("stopped").state().await.expect("state");
        st.int("seqs") == 1
    })
    .await;
    ok_stdout(&groupcast(
        &url,
        &["cancel", "stopped", "--reason", "wrong list"],
    ));
    // Fifteen more chunks come after the cancel.
    append_chunks(&rig.store, &chunks[1..])
        .await
        .expect("append");
    wait_until(
        Duration::from_secs(20),
        "15 late chunks counted",
        || async {
            let st = rig.store.batch("stopped").state().await.expect("state");
            st.int(field::AFTER_END) == 15
        },
    )
    .await;
    assert_eq!(dead_letters(&rig.store).await, vec![]);
    let out = ok_stdout(&groupcast(&url, &["status", "stopped"]));
    assert!(
        out.contains("15 chunk(s) came after the batch ended"),
        "{out}"
    );
    let out = ok_stdout(&groupcast(&url, &["status", "stopped", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["chunksAfterEnd"], 15, "{v}");
    rig.stop().await;
}

/// The JSON lines of `dlq list --json` with `extra` flags.
fn listed(url: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["dlq", "list", "--json"];
    args.extend_from_slice(extra);
    ok_stdout(&groupcast(url, &args))
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_judged_and_redriven_or_purged_with_a_confirmation() {
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    let ingest = rig.store.keys.ingest(0);
    // An invalid chunk: rejected by its batch, dead-lettered.
    let mut bad_template = template();
    bad_template.kind = "FAX".into();
    let bad = cut("dl-bad", &bad_template, recipients(43, 5), 5);
    append_chunks(&rig.store, &bad).await.expect("append");
    wait_until(
        Duration::from_secs(20),
        "the invalid chunk's dead letter",
        || async { dead_letters(&rig.store).await.len() == 1 },
    )
    .await;
    // A good chunk dead-lettered by trouble that is gone now (written by
    // hand, as the dead-lettering worker would).
    let good = cut("dl-good", &template(), recipients(44, 50), 50).remove(0);
    let mut fields: Vec<(String, Vec<u8>)> = vec![
        (
            "reason".into(),
            b"delivered 9 times (worker crashed)".to_vec(),
        ),
        ("source".into(), ingest.as_bytes().to_vec()),
        ("entry".into(), b"0-1".to_vec()),
    ];
    fields.extend(
        ingest_fields(&good)
            .iter()
            .map(|(k, v)| (format!("f:{k}"), v.clone())),
    );
    append_raw(&rig.store, &rig.store.keys.dead_letters(0), &fields)
        .await
        .expect("dead letter");

    // The table: batch, seq, op, verdict, reason, age.
    let out = ok_stdout(&groupcast(&url, &["dlq", "list"]));
    for col in ["id", "age", "batch", "seq", "op", "redrive", "reason"] {
        assert!(out.lines().next().is_some_and(|h| h.contains(col)), "{out}");
    }
    let row = |batch: &str| {
        out.lines()
            .find(|l| l.contains(batch))
            .unwrap_or_else(|| panic!("no row for {batch}: {out}"))
            .to_string()
    };
    assert!(row("dl-bad").contains(" no "), "{out}");
    assert!(row("dl-good").contains(" yes "), "{out}");
    assert!(
        out.contains("2 dead letter(s), 1 that a redrive cannot help"),
        "{out}"
    );
    // Filters, and the payload's summary instead of its size.
    let good_only = listed(&url, &["--batch", "dl-good"]);
    assert_eq!(good_only.len(), 1, "{good_only:?}");
    assert_eq!(good_only[0]["payload"], "chunk 0 (50 recipients, last)");
    assert_eq!(good_only[0]["seq"], 0);
    assert_eq!(good_only[0]["op"], "chunk");
    assert_eq!(good_only[0]["redrivable"], true);
    let bad_only = listed(&url, &["--reason", "FAX"]);
    assert_eq!(bad_only.len(), 1, "{bad_only:?}");
    assert_eq!(bad_only[0]["batch"], "dl-bad");
    assert_eq!(bad_only[0]["redrivable"], false);
    assert!(
        bad_only[0]["notRedrivable"]
            .as_str()
            .is_some_and(|w| w.starts_with("invalid input")),
        "{bad_only:?}"
    );
    assert!(listed(&url, &["--batch", "nobody"]).is_empty());

    // Without a terminal and without --yes: refused, nothing touched.
    let out = groupcast(&url, &["dlq", "purge", "--batch", "dl-bad"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("add --yes"), "{stderr}");
    assert_eq!(dead_letters(&rig.store).await.len(), 2);
    // No selection at all: refused.
    let out = groupcast(&url, &["dlq", "purge", "--yes"]);
    assert_eq!(out.status.code(), Some(2));
    // A redrive skips the hopeless one, saying why.
    let out = ok_stdout(&groupcast(
        &url,
        &["dlq", "redrive", "--batch", "dl-bad", "--yes"],
    ));
    assert!(
        out.contains("a redrive cannot help (invalid input: template type \"FAX\""),
        "{out}"
    );
    assert!(out.contains("0 dead letter(s) redriven"), "{out}");
    assert_eq!(dead_letters(&rig.store).await.len(), 2);
    // Purged, and the batch's audit says who did it.
    let out = ok_stdout(&groupcast(
        &url,
        &["dlq", "purge", "--batch", "dl-bad", "--yes"],
    ));
    assert!(out.contains("1 dead letter(s) purged"), "{out}");
    assert_eq!(dead_letters(&rig.store).await.len(), 1);
    let audit = ok_stdout(&groupcast(&url, &["audit", "dl-bad"]));
    assert!(
        audit.contains("PURGED by test-operator") && audit.contains("chunk 0 (5 recipients, last)"),
        "{audit}"
    );
    // The good one, redriven by its reason, completes its batch.
    let out = ok_stdout(&groupcast(
        &url,
        &["dlq", "redrive", "--reason", "worker crashed", "--yes"],
    ));
    assert!(out.contains("1 dead letter(s) redriven"), "{out}");
    rig.wait_reported(&["dl-good".to_string()], Duration::from_secs(20))
        .await;
    rig.verify(&["dl-good".to_string()]).await;
    assert_eq!(dead_letters(&rig.store).await, vec![]);
    rig.stop().await;
}
