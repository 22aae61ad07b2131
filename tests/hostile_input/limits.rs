//! Every limit, on the submit path (the CLI, before anything is appended)
//! and on the worker's.

use std::path::Path;

use clap::Parser;
use groupcast::cli::{Cli, CliError, Command};
use groupcast::events::chunk::{
    KakaoTemplate, MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use groupcast::events::Chunk;
use groupcast::keys::MAX_BATCH_ID_LEN;

use crate::common::*;
use crate::msgpack::*;
use crate::{tmp_file, MAX_MESSAGE};

/// Runs `groupcast submit` in process against a Redis that is not there:
/// input errors come before the connection, so a connection error means the
/// input was accepted.
async fn submit(
    dir: &Path,
    batch: &str,
    chunk_size: usize,
    template_json: &[u8],
    csv: &[u8],
) -> CliError {
    let t = tmp_file(dir, "template.json", template_json);
    let r = tmp_file(dir, "recipients.csv", csv);
    let closed = groupcast_rigs::redis_server::free_port().expect("port");
    let cli = Cli::try_parse_from([
        "groupcast".to_string(),
        "submit".into(),
        "--redis".into(),
        format!("redis://127.0.0.1:{closed}/"),
        "--batch".into(),
        batch.into(),
        "--chunk-size".into(),
        chunk_size.to_string(),
        "--template".into(),
        t.display().to_string(),
        "--recipients".into(),
        r.display().to_string(),
    ])
    .expect("parse");
    let Command::Submit(args) = cli.command else {
        panic!("not submit")
    };
    groupcast::cli::submit::run(args)
        .await
        .expect_err("submit should fail")
}

fn csv(n: usize, name: impl Fn(usize) -> String) -> Vec<u8> {
    let mut out = String::from("to,name\n");
    for i in 0..n {
        out.push_str(&format!("010{:08},{}\n", i, name(i)));
    }
    out.into_bytes()
}

fn usage(e: CliError) -> String {
    match e {
        CliError::Usage(m) => m,
        other => panic!("expected a usage error, got: {other}"),
    }
}

#[tokio::test]
async fn every_limit_is_enforced_by_submit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let tpl = br#"{"type": "SMS", "from": "0212345678", "text": "Hi #{name}"}"#;
    let small = csv(3, |i| format!("Kim{i}"));

    // The control: good input gets as far as connecting.
    let e = submit(d, "ok-1", 100, tpl, &small).await;
    assert!(matches!(e, CliError::Redis(_)), "good input refused: {e}");

    let long_id = "x".repeat(MAX_BATCH_ID_LEN + 1);
    type Case<'a> = (&'a str, String, usize, Vec<u8>, Vec<u8>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "batch id length",
            long_id,
            100,
            tpl.to_vec(),
            small.clone(),
            "at most 128",
        ),
        (
            "batch id characters",
            "a}b{c".into(),
            100,
            tpl.to_vec(),
            small.clone(),
            "'}'",
        ),
        (
            "batch id characters",
            "a:b".into(),
            100,
            tpl.to_vec(),
            small.clone(),
            "':'",
        ),
        (
            "recipients per chunk",
            "b".into(),
            MAX_CHUNK_RECIPIENTS + 1,
            tpl.to_vec(),
            small.clone(),
            "between 1 and 10000",
        ),
        (
            "recipients per chunk",
            "b".into(),
            0,
            tpl.to_vec(),
            small.clone(),
            "between 1 and 10000",
        ),
        (
            "template text",
            "b".into(),
            100,
            format!(
                r#"{{"type": "SMS", "from": "0212345678", "text": "{}"}}"#,
                "가".repeat(MAX_TEXT_CHARS + 1)
            )
            .into_bytes(),
            small.clone(),
            "at most 4000",
        ),
        (
            "template file size",
            "b".into(),
            100,
            format!(
                r#"{{"type": "SMS", "from": "0212345678", "text": "hi", "x": "{}"}}"#,
                " ".repeat(70_000)
            )
            .into_bytes(),
            small.clone(),
            "over 65536 bytes",
        ),
        (
            "template sender",
            "b".into(),
            100,
            format!(
                r#"{{"type": "SMS", "from": "{}", "text": "hi"}}"#,
                "0".repeat(33)
            )
            .into_bytes(),
            small.clone(),
            "at most 32",
        ),
        (
            "variable size",
            "b".into(),
            100,
            tpl.to_vec(),
            csv(3, |i| {
                if i == 1 {
                    "v".repeat(MAX_VAR_CHARS + 1)
                } else {
                    "ok".into()
                }
            }),
            "longer than 1000",
        ),
        (
            "recipient number",
            "b".into(),
            100,
            tpl.to_vec(),
            format!("to,name\n{},Kim\n", "0".repeat(10_000)).into_bytes(),
            "has 10000 digits: a Korean number has 9 to 11",
        ),
        (
            "chunk bytes",
            "b".into(),
            MAX_CHUNK_RECIPIENTS,
            tpl.to_vec(),
            csv(MAX_CHUNK_RECIPIENTS, |_| "v".repeat(900)),
            "lower --chunk-size",
        ),
    ];
    for (what, batch, size, t, r, expected) in cases {
        let m = usage(submit(d, &batch, size, &t, &r).await);
        assert!(m.contains(expected), "{what}: {m}");
        assert!(m.len() <= MAX_MESSAGE, "{what}: a {} byte message", m.len());
    }
}

/// The same limits on the worker's path: what `Chunk::decode` + `validate`
/// (the loader's checks) say about chunks no `submit` would write.
#[test]
fn every_limit_is_enforced_on_the_worker_path() {
    let ok = good_chunk("ok", 0, 2);
    assert_eq!(ok.validate(), Ok(()));
    let check = |what: &str, c: Chunk, expected: &str| {
        let b = c.encode();
        let m = match Chunk::decode(&b) {
            Err(e) => e.to_string(),
            Ok(c) => c.validate().expect_err(what).to_string(),
        };
        assert!(m.contains(expected), "{what}: {m}");
        assert!(m.len() <= MAX_MESSAGE, "{what}: {} bytes", m.len());
    };
    check(
        "batch id length",
        Chunk {
            batch: "x".repeat(MAX_BATCH_ID_LEN + 1),
            ..ok.clone()
        },
        "at most 128",
    );
    check(
        "batch id characters",
        Chunk {
            batch: "a}b{c".into(),
            ..ok.clone()
        },
        "'}'",
    );
    check(
        "recipients",
        Chunk {
            recipients: recipients(1, MAX_CHUNK_RECIPIENTS + 1),
            ..ok.clone()
        },
        "10001 recipients",
    );
    let mut t = template();
    t.text = "가".repeat(MAX_TEXT_CHARS + 1);
    check(
        "template text",
        Chunk {
            template: t,
            ..ok.clone()
        },
        "at most 4000",
    );
    let mut t = template();
    t.kakao_options = Some(KakaoTemplate {
        pf_id: "p".repeat(200),
        template_id: "T".into(),
    });
    check(
        "kakao id",
        Chunk {
            template: t,
            ..ok.clone()
        },
        "at most 128",
    );
    let mut big = ok.clone();
    big.recipients[0]
        .vars
        .insert("name".into(), "v".repeat(MAX_VAR_CHARS + 1));
    check("variable size", big, "longer than 1000");
    let mut bad = ok.clone();
    bad.recipients[0].to = "0".repeat(10_000);
    check("recipient number", bad, "unusable number");
    // Over MAX_CHUNK_BYTES: refused by decode before parsing, and by validate
    // for a chunk built in memory.
    let huge = Chunk {
        recipients: recipients(1, 9_000)
            .into_iter()
            .map(|mut r| {
                r.vars.insert("pad".into(), "p".repeat(999));
                r
            })
            .collect(),
        ..ok.clone()
    };
    assert!(huge.encode().len() > MAX_CHUNK_BYTES);
    assert!(matches!(
        huge.validate(),
        Err(groupcast::events::ChunkError::TooLarge(_))
    ));
    check("chunk bytes", huge, "over the limit");
}
