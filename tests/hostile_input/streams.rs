//! End to end: malicious entries on the streams, a good batch beside them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::events::chunk::{MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS};
use groupcast::events::Chunk;
use groupcast::producer::{append_chunks, append_raw, ingest_fields};
use groupcast::store::queue::parse_entries;

use crate::common::*;
use crate::msgpack::*;
use crate::MAX_MESSAGE;

/// A stream entry's fields.
type Fields = Vec<(String, Vec<u8>)>;

fn entry(v: &[u8], t: &[u8], d: Option<Vec<u8>>) -> Fields {
    let mut f = vec![("v".to_string(), v.to_vec()), ("t".to_string(), t.to_vec())];
    if let Some(d) = d {
        f.push(("d".to_string(), d));
    }
    f
}

fn chunk_entry(c: &Chunk) -> Fields {
    ingest_fields(c)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

fn with_field(c: &Chunk, name: &str, value: Mp) -> Vec<u8> {
    let mut m = chunk_mp(c);
    if let Mp::Map(e) = &mut m {
        match e
            .iter_mut()
            .find(|(k, _)| matches!(k, Mp::Str(b) if b == name.as_bytes()))
        {
            Some(slot) => slot.1 = value,
            None => e.push((s(name), value)),
        }
    }
    bytes(&m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malicious_entries_are_dead_lettered_and_a_good_batch_completes() {
    let rig = Rig::start(2, test_config(), mock_config()).await;
    let store = &rig.store;
    let ingest = store.keys.ingest(0);
    let work = store.keys.work(0);

    // The good batch, cut in two halves: one before the hostile entries, one after.
    let good = "good-batch".to_string();
    let chunks = groupcast::producer::cut(&good, &template(), recipients(9, 600), 100);
    append_chunks(store, &chunks[..3]).await.expect("append");

    let base = good_chunk("hostile", 0, 2);
    let mut to_10k = base.clone();
    to_10k.recipients[0].to = "0".repeat(10 * 1024);
    let mut var_big = base.clone();
    var_big.recipients[0]
        .vars
        .insert("name".into(), "v".repeat(MAX_VAR_CHARS + 1));
    let mut text_big = base.clone();
    text_big.template.text = "t".repeat(MAX_TEXT_CHARS + 1);

    let ingest_cases: Vec<(&str, Fields, &str)> = vec![
        (
            "a 9 MiB d",
            entry(b"1", b"chunk", Some(vec![0x90; 9 * 1024 * 1024])),
            "over the limit",
        ),
        (
            "10,001 recipients",
            chunk_entry(&Chunk {
                batch: "hostile-many".into(),
                recipients: recipients(2, MAX_CHUNK_RECIPIENTS + 1),
                ..base.clone()
            }),
            "10001 recipients",
        ),
        (
            "batch id a}b{c",
            chunk_entry(&Chunk {
                batch: "a}b{c".into(),
                ..base.clone()
            }),
            "invalid batch id",
        ),
        (
            "batch id of 129 bytes",
            chunk_entry(&Chunk {
                batch: "x".repeat(129),
                ..base.clone()
            }),
            "at most 128",
        ),
        (
            "batch id with invalid UTF-8",
            entry(
                b"1",
                b"chunk",
                Some(with_field(&base, "batch", Mp::Str(b"ab\xff\xfe".to_vec()))),
            ),
            "undecodable chunk",
        ),
        (
            "a `to` of 10 KB",
            chunk_entry(&Chunk {
                batch: "hostile-to".into(),
                ..to_10k
            }),
            "unusable number",
        ),
        (
            "a variable over the limit",
            chunk_entry(&Chunk {
                batch: "hostile-var".into(),
                ..var_big
            }),
            "longer than 1000",
        ),
        (
            "a template text over the limit",
            chunk_entry(&Chunk {
                batch: "hostile-text".into(),
                ..text_big
            }),
            "at most 4000",
        ),
        (
            "deeply nested msgpack",
            entry(
                b"1",
                b"chunk",
                Some(with_field(&base, "x", nested_arrays(200_000))),
            ),
            "depth",
        ),
        (
            "deeply nested maps as the payload",
            entry(b"1", b"chunk", Some(bytes(&nested_maps(200_000)))),
            "undecodable chunk",
        ),
        (
            "NaN seq",
            entry(
                b"1",
                b"chunk",
                Some(with_field(&base, "seq", Mp::F64(f64::NAN))),
            ),
            "undecodable chunk",
        ),
        (
            "negative seq",
            entry(b"1", b"chunk", Some(with_field(&base, "seq", Mp::Int(-1)))),
            "undecodable chunk",
        ),
        (
            "a lying array length",
            entry(
                b"1",
                b"chunk",
                Some(with_field(
                    &base,
                    "recipients",
                    Mp::Raw(vec![0xdd, 0xff, 0xff, 0xff, 0xff]),
                )),
            ),
            "undecodable chunk",
        ),
        (
            "an unknown envelope version of 1 MB",
            entry(&vec![b'9'; 1024 * 1024], b"chunk", Some(base.encode())),
            "unknown envelope version",
        ),
        (
            "an unknown type",
            entry(b"1", b"\xff\xfe", Some(base.encode())),
            "is neither `chunk` nor `seal`",
        ),
        ("no payload", entry(b"1", b"chunk", None), "no `d`"),
        (
            "a seal that is not one",
            entry(b"1", b"seal", Some(vec![0xc1; 40])),
            "undecodable seal",
        ),
        (
            "a seal of a batch id with a brace",
            entry(
                b"1",
                b"seal",
                Some(
                    groupcast::events::seal::Seal {
                        batch: "a}b".into(),
                        last: 3,
                    }
                    .encode(),
                ),
            ),
            "invalid batch id",
        ),
    ];
    let work_cases: Vec<(&str, Fields, &str)> = vec![
        (
            "an unknown op",
            vec![
                ("op".into(), vec![b'z'; 100_000]),
                ("d".into(), b"".to_vec()),
            ],
            "unknown work op",
        ),
        (
            "a malformed work item",
            vec![
                ("op".into(), b"send".to_vec()),
                ("d".into(), b"\xc1\xc1".to_vec()),
            ],
            "malformed work item",
        ),
        (
            "a work item with a hostile batch id",
            vec![
                ("op".into(), b"create".to_vec()),
                (
                    "d".into(),
                    bytes(&Mp::Map(vec![
                        (s("batch"), s("a}b{c")),
                        (s("gen"), Mp::UInt(0)),
                    ])),
                ),
            ],
            "invalid batch id",
        ),
        (
            "a load item without its chunk",
            vec![
                ("op".into(), b"load".to_vec()),
                ("d".into(), bytes(&valid_work_item())),
            ],
            "without seq, group or chunk",
        ),
    ];
    // Keyed by (stream, entry id): two streams can hand out the same id.
    let mut expected: BTreeMap<(String, String), (&str, &str)> = BTreeMap::new();
    for (what, fields, reason) in &ingest_cases {
        let id = append_raw(store, &ingest, fields).await.expect("append");
        expected.insert((ingest.clone(), id), (what, reason));
    }
    for (what, fields, reason) in &work_cases {
        let id = append_raw(store, &work, fields).await.expect("append");
        expected.insert((work.clone(), id), (what, reason));
    }
    append_chunks(store, &chunks[3..]).await.expect("append");

    rig.wait_reported(std::slice::from_ref(&good), Duration::from_secs(90))
        .await;
    rig.verify(std::slice::from_ref(&good)).await;
    rig.check_ledger(&BTreeMap::from([(good.clone(), 600)]));

    // Every hostile entry is a dead letter, with its reason, kept short.
    let deadline = Instant::now() + Duration::from_secs(60);
    let letters = loop {
        let v: redis::Value = redis::cmd("XRANGE")
            .arg(store.keys.dead_letters(0))
            .arg("-")
            .arg("+")
            .query_async(&mut store.raw_conn())
            .await
            .expect("xrange");
        let letters = parse_entries(&v);
        if letters.len() >= expected.len() || Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut by_entry: BTreeMap<(String, String), String> = BTreeMap::new();
    for l in &letters {
        by_entry.insert(
            (
                l.text("source").unwrap_or_default(),
                l.text("entry").unwrap_or_default(),
            ),
            l.text("reason").unwrap_or_default(),
        );
    }
    for (id, (what, reason)) in &expected {
        let got = by_entry.get(id).unwrap_or_else(|| {
            panic!("{what} ({id:?}) was not dead-lettered; letters: {by_entry:?}")
        });
        assert!(
            got.contains(reason),
            "{what}: reason {got:?} lacks {reason:?}"
        );
        assert!(
            got.len() <= MAX_MESSAGE,
            "{what}: a {} byte reason",
            got.len()
        );
    }
    assert_eq!(
        letters.len(),
        expected.len(),
        "unexpected dead letters: {by_entry:?}"
    );

    // Chunks of a known batch that failed validation are in its history too.
    let st = store.batch("hostile-to").state().await.expect("state");
    assert_eq!(st.int("rejected"), 1);
    rig.stop().await;
}
