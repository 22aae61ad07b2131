//! Hostile input: every decoder and reader that takes bytes from outside is
//! fuzzed (arbitrary bytes, and structure-aware mutations of valid payloads),
//! every input limit is checked on both paths (`submit` and the worker), and
//! malicious entries on the streams are dead-lettered with a reason while a
//! good batch completes beside them.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use common::*;
use groupcast::cli::{Cli, CliError, Command};
use groupcast::events::chunk::{
    KakaoTemplate, MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use groupcast::events::{decode_payload, Chunk, Event, Recipient, Recorded, Template};
use groupcast::keys::MAX_BATCH_ID_LEN;
use groupcast::producer::{append_chunks, append_raw, ingest_fields};
use groupcast::store::queue::parse_entries;
use groupcast::worker::ops::WorkItem;
use proptest::prelude::*;
use proptest::sample::Index;

/// The longest error message a hostile input may produce: messages quote
/// input, and input can be megabytes.
const MAX_MESSAGE: usize = 2048;

// ---------------------------------------------------------------------------
// A small MessagePack writer, so that tests can write what rmp-serde never
// would: invalid UTF-8 in strings, lying lengths, NaN where an integer goes,
// nesting deeper than any decoder should follow.

#[derive(Debug, Clone)]
enum Mp {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    F64(f64),
    /// A `str` with any bytes (invalid UTF-8 included).
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
    /// Bytes written as they are (a lying header, garbage).
    Raw(Vec<u8>),
}

fn s(text: &str) -> Mp {
    Mp::Str(text.as_bytes().to_vec())
}

fn len_header(out: &mut Vec<u8>, n: usize, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8) {
    match fix {
        Some((base, max)) if n < max => out.push(base | n as u8),
        _ => match m8 {
            Some(m) if n < 256 => out.extend([m, n as u8]),
            _ if n < 65_536 => {
                out.push(m16);
                out.extend((n as u16).to_be_bytes());
            }
            _ => {
                out.push(m16 + 1);
                out.extend((n as u32).to_be_bytes());
            }
        },
    }
}

fn enc(v: &Mp, out: &mut Vec<u8>) {
    match v {
        Mp::Nil => out.push(0xc0),
        Mp::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mp::Int(i) => {
            out.push(0xd3);
            out.extend(i.to_be_bytes());
        }
        Mp::UInt(u) => {
            if *u < 128 {
                out.push(*u as u8);
            } else {
                out.push(0xcf);
                out.extend(u.to_be_bytes());
            }
        }
        Mp::F64(f) => {
            out.push(0xcb);
            out.extend(f.to_be_bytes());
        }
        Mp::Str(b) => {
            len_header(out, b.len(), Some((0xa0, 32)), Some(0xd9), 0xda);
            out.extend(b);
        }
        Mp::Bin(b) => {
            len_header(out, b.len(), None, Some(0xc4), 0xc5);
            out.extend(b);
        }
        Mp::Arr(items) => {
            len_header(out, items.len(), Some((0x90, 16)), None, 0xdc);
            for i in items {
                enc(i, out);
            }
        }
        Mp::Map(entries) => {
            len_header(out, entries.len(), Some((0x80, 16)), None, 0xde);
            for (k, v) in entries {
                enc(k, out);
                enc(v, out);
            }
        }
        Mp::Raw(b) => out.extend(b),
    }
}

fn bytes(v: &Mp) -> Vec<u8> {
    let mut out = Vec::new();
    enc(v, &mut out);
    out
}

fn chunk_mp(c: &Chunk) -> Mp {
    let mut template = vec![
        (s("type"), s(&c.template.kind)),
        (s("from"), s(&c.template.from)),
        (s("text"), s(&c.template.text)),
    ];
    if let Some(k) = &c.template.kakao_options {
        template.push((
            s("kakao_options"),
            Mp::Map(vec![
                (s("pf_id"), s(&k.pf_id)),
                (s("template_id"), s(&k.template_id)),
            ]),
        ));
    }
    let recipients = c
        .recipients
        .iter()
        .map(|r| {
            Mp::Map(vec![
                (s("to"), s(&r.to)),
                (
                    s("vars"),
                    Mp::Map(r.vars.iter().map(|(k, v)| (s(k), s(v))).collect()),
                ),
            ])
        })
        .collect();
    Mp::Map(vec![
        (s("batch"), s(&c.batch)),
        (s("seq"), Mp::UInt(u64::from(c.seq))),
        (s("last"), Mp::Bool(c.last)),
        (s("template"), Mp::Map(template)),
        (s("recipients"), Mp::Arr(recipients)),
    ])
}

fn good_chunk(batch: &str, seq: u32, n: usize) -> Chunk {
    Chunk {
        batch: batch.into(),
        seq,
        last: true,
        template: template(),
        recipients: recipients(seq + 50, n),
    }
}

fn nested_arrays(depth: usize) -> Mp {
    // Written flat (no recursion here either): `depth` one-element arrays.
    let mut raw = vec![0x91; depth];
    raw.push(0xc0);
    Mp::Raw(raw)
}

fn nested_maps(depth: usize) -> Mp {
    let mut raw = Vec::with_capacity(depth * 3 + 1);
    for _ in 0..depth {
        raw.extend([0x81, 0xa1, b'x']);
    }
    raw.push(0xc0);
    Mp::Raw(raw)
}

/// Values that do not belong anywhere in a chunk, or are too much of one.
fn hostile_value() -> impl Strategy<Value = Mp> {
    prop_oneof![
        Just(Mp::Nil),
        any::<bool>().prop_map(Mp::Bool),
        any::<i64>().prop_map(Mp::Int),
        Just(Mp::Int(-1)),
        any::<u64>().prop_map(Mp::UInt),
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-1.0),
            any::<f64>()
        ]
        .prop_map(Mp::F64),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Str),
        // Invalid UTF-8, for sure.
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|mut b| {
            b.insert(0, 0xff);
            Mp::Str(b)
        }),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Bin),
        (1usize..300_000).prop_map(|n| Mp::Str(vec![b'7'; n])),
        (1usize..50_000).prop_map(nested_arrays),
        (1usize..50_000).prop_map(nested_maps),
        // Headers that promise more than there is.
        Just(Mp::Raw(vec![0xdd, 0xff, 0xff, 0xff, 0xff])),
        Just(Mp::Raw(vec![0xdf, 0xff, 0xff, 0xff, 0xff])),
        Just(Mp::Raw(vec![0xdb, 0xff, 0xff, 0xff, 0xff, b'a'])),
        Just(Mp::Raw(vec![0xc6, 0x7f, 0xff, 0xff, 0xff])),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Mp::Raw),
        Just(Mp::Arr(Vec::new())),
        Just(Mp::Map(Vec::new())),
    ]
}

/// Every node of a value, as a path of child indices (map entries by index).
fn paths(v: &Mp, prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(prefix.clone());
    let children: Vec<&Mp> = match v {
        Mp::Arr(items) => items.iter().take(3).collect(),
        Mp::Map(entries) => entries.iter().map(|(_, v)| v).collect(),
        _ => return,
    };
    for (i, c) in children.into_iter().enumerate() {
        prefix.push(i);
        paths(c, prefix, out);
        prefix.pop();
    }
}

fn node<'a>(v: &'a mut Mp, path: &[usize]) -> &'a mut Mp {
    let Some((first, rest)) = path.split_first() else {
        return v;
    };
    match v {
        Mp::Arr(items) => node(&mut items[*first], rest),
        Mp::Map(entries) => node(&mut entries[*first].1, rest),
        _ => v,
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(Index, Mp),
    /// Removes a map entry, or an array item.
    Remove(Index, Index),
    /// Adds an entry with an unknown (or hostile) key.
    Add(Index, Mp, Mp),
    /// Repeats a map entry (the later one with a hostile value).
    Duplicate(Index, Index, Mp),
    Truncate(Index),
    FlipByte(Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), hostile_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Mutation::Remove(i, j)),
        1 => (any::<Index>(), hostile_value(), hostile_value()).prop_map(|(i, k, v)| Mutation::Add(i, k, v)),
        1 => (any::<Index>(), any::<Index>(), hostile_value()).prop_map(|(i, j, v)| Mutation::Duplicate(i, j, v)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipByte(i, b)),
    ]
}

fn containers(v: &Mp) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    let mut v = v.clone();
    all.into_iter()
        .filter(|p| matches!(node(&mut v, p), Mp::Map(_) | Mp::Arr(_)))
        .collect()
}

/// Applies mutations to a valid payload and encodes it.
fn mutate(valid: &Mp, mutations: &[Mutation]) -> Vec<u8> {
    let mut v = valid.clone();
    let mut tail: Vec<Mutation> = Vec::new();
    for m in mutations {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let boxes = containers(&v);
        if boxes.is_empty() && !matches!(m, Mutation::Replace(..)) {
            tail.push(m.clone());
            continue;
        }
        match m {
            Mutation::Replace(i, new) => *node(&mut v, &all[i.index(all.len())]) = new.clone(),
            Mutation::Remove(i, j) => match node(&mut v, &boxes[i.index(boxes.len())]) {
                Mp::Map(e) if !e.is_empty() => {
                    let k = j.index(e.len());
                    e.remove(k);
                }
                Mp::Arr(a) if !a.is_empty() => {
                    let k = j.index(a.len());
                    a.remove(k);
                }
                _ => {}
            },
            Mutation::Add(i, k, val) => {
                if let Mp::Map(e) = node(&mut v, &boxes[i.index(boxes.len())]) {
                    e.push((k.clone(), val.clone()));
                }
            }
            Mutation::Duplicate(i, j, val) => {
                if let Mp::Map(e) = node(&mut v, &boxes[i.index(boxes.len())]) {
                    if !e.is_empty() {
                        let key = e[j.index(e.len())].0.clone();
                        e.push((key, val.clone()));
                    }
                }
            }
            other => tail.push(other.clone()),
        }
    }
    let mut out = bytes(&v);
    for m in tail {
        match m {
            Mutation::Truncate(i) => out.truncate(i.index(out.len() + 1)),
            Mutation::FlipByte(i, b) if !out.is_empty() => {
                let k = i.index(out.len());
                out[k] ^= b | 1;
            }
            _ => {}
        }
    }
    out
}

/// What every decoded-and-validated chunk must satisfy.
fn check_chunk(bytes: &[u8]) -> Result<(), TestCaseError> {
    match Chunk::decode(bytes) {
        Err(e) => {
            let m = e.to_string();
            prop_assert!(
                !m.is_empty() && m.len() <= MAX_MESSAGE,
                "message: {}",
                m.len()
            );
        }
        Ok(c) => {
            let _ = c.digest();
            match c.validate() {
                Err(e) => {
                    let m = e.to_string();
                    prop_assert!(
                        !m.is_empty() && m.len() <= MAX_MESSAGE,
                        "message: {}",
                        m.len()
                    );
                }
                Ok(()) => {
                    prop_assert!(groupcast::keys::validate_batch_id(&c.batch).is_ok());
                    prop_assert!(
                        !c.recipients.is_empty() && c.recipients.len() <= MAX_CHUNK_RECIPIENTS
                    );
                    prop_assert!(c.template.validate().is_ok());
                    prop_assert!(c.template.text.chars().count() <= MAX_TEXT_CHARS);
                    for r in &c.recipients {
                        prop_assert!(!r.to.is_empty() && r.to.len() <= 32);
                        for v in r.vars.values() {
                            prop_assert!(v.chars().count() <= MAX_VAR_CHARS);
                        }
                    }
                    prop_assert!(c.encode().len() <= MAX_CHUNK_BYTES);
                }
            }
        }
    }
    Ok(())
}

fn check_message(r: Result<impl Sized, impl std::fmt::Display>) -> Result<(), TestCaseError> {
    if let Err(e) = r {
        let m = e.to_string();
        prop_assert!(
            !m.is_empty() && m.len() <= MAX_MESSAGE,
            "message: {}",
            m.len()
        );
    }
    Ok(())
}

fn valid_event_payloads() -> Vec<(&'static str, Mp)> {
    vec![
        (
            "chunk_assigned",
            Mp::Map(vec![
                (s("seq"), Mp::UInt(3)),
                (s("gen"), Mp::UInt(0)),
                (s("count"), Mp::UInt(100)),
                (s("last"), Mp::Bool(false)),
                (s("digest"), s("00ff00ff00ff00ff")),
            ]),
        ),
        (
            "chunk_loaded",
            Mp::Map(vec![
                (s("gen"), Mp::UInt(1)),
                (s("seq"), Mp::UInt(7)),
                (s("group_id"), s("G4V")),
                (s("registered"), Mp::UInt(2)),
                (s("duplicates"), Mp::UInt(0)),
                (
                    s("failed"),
                    Mp::Arr(vec![Mp::Map(vec![
                        (s("to"), s("0101")),
                        (s("code"), s("1062")),
                    ])]),
                ),
            ]),
        ),
        (
            "batch_reported",
            Mp::Map(vec![
                (s("outcome"), s("completed")),
                (s("generations"), Mp::UInt(1)),
                (s("chunks"), Mp::UInt(2)),
                (s("recipients"), Mp::UInt(200)),
                (s("registered"), Mp::UInt(200)),
                (s("failed"), Mp::UInt(0)),
                (s("sent_success"), Mp::UInt(200)),
                (s("sent_failed"), Mp::UInt(0)),
            ]),
        ),
        (
            "input_rejected",
            Mp::Map(vec![(s("seq"), Mp::Nil), (s("reason"), s("bad"))]),
        ),
    ]
}

fn valid_work_item() -> Mp {
    Mp::Map(vec![
        (s("batch"), s("b-1")),
        (s("gen"), Mp::UInt(0)),
        (s("seq"), Mp::UInt(4)),
        (s("group_id"), s("G1")),
        (s("attempt"), Mp::UInt(2)),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn chunk_decoder_survives_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_chunk(&b)?;
    }

    #[test]
    fn chunk_decoder_survives_mutated_chunks(
        n in 1usize..4,
        ms in proptest::collection::vec(mutation(), 1..4),
    ) {
        let valid = chunk_mp(&good_chunk("fuzz", 1, n));
        check_chunk(&mutate(&valid, &ms))?;
    }

    #[test]
    fn event_decoder_survives_arbitrary_and_mutated_payloads(
        b in proptest::collection::vec(any::<u8>(), 0..256),
        which in any::<Index>(),
        ms in proptest::collection::vec(mutation(), 1..4),
    ) {
        let t = Event::TYPE_NAMES[which.index(Event::TYPE_NAMES.len())];
        check_message(Event::decode(t, &b))?;
        let payloads = valid_event_payloads();
        let (t, valid) = &payloads[which.index(payloads.len())];
        check_message(Event::decode(t, &mutate(valid, &ms)))?;
    }

    #[test]
    fn recorded_decoder_survives_arbitrary_fields(
        fields in proptest::collection::vec(
            (
                prop_oneof![Just("v".to_string()), Just("t".to_string()), Just("k".to_string()), Just("d".to_string()), ".{0,8}"],
                proptest::collection::vec(any::<u8>(), 0..64),
            ),
            0..8,
        ),
        t in prop_oneof![proptest::sample::select(Event::TYPE_NAMES.to_vec()).prop_map(str::to_string), ".{0,300}"],
        v in prop_oneof![Just(b"1".to_vec()), proptest::collection::vec(any::<u8>(), 0..300)],
        d in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        check_message(Recorded::from_fields("1-0", &fields))?;
        let envelope = vec![
            ("v".to_string(), v),
            ("t".to_string(), t.into_bytes()),
            ("k".to_string(), b"key".to_vec()),
            ("d".to_string(), d),
        ];
        check_message(Recorded::from_fields("1-0", &envelope))?;
    }

    #[test]
    fn work_item_decoder_survives_arbitrary_and_mutated_items(
        b in proptest::collection::vec(any::<u8>(), 0..256),
        ms in proptest::collection::vec(mutation(), 1..4),
    ) {
        check_message(decode_payload::<WorkItem>("work item", &b))?;
        check_message(decode_payload::<WorkItem>("work item", &mutate(&valid_work_item(), &ms)))?;
    }
}

#[test]
fn the_mini_encoder_writes_what_the_decoders_read() {
    let c = good_chunk("enc", 2, 3);
    assert_eq!(Chunk::decode(&bytes(&chunk_mp(&c))).expect("decode"), c);
    let item: WorkItem = decode_payload("work item", &bytes(&valid_work_item())).expect("item");
    assert_eq!(item.seq, Some(4));
    for (t, p) in valid_event_payloads() {
        Event::decode(t, &bytes(&p)).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}

#[test]
fn deep_nesting_is_refused_not_followed() {
    // In an unknown field, a decoder skips the value: that skip must be
    // bounded too, or a worker thread's stack overflows (and the process
    // aborts) on one malicious entry.
    for depth in [2_000, 100_000, 1_000_000] {
        for deep in [nested_arrays(depth), nested_maps(depth)] {
            let mut valid = chunk_mp(&good_chunk("deep", 0, 1));
            if let Mp::Map(e) = &mut valid {
                e.push((s("x"), deep.clone()));
            }
            let e = Chunk::decode(&bytes(&valid)).expect_err("deep nesting decoded");
            assert!(e.to_string().contains("depth"), "{e}");
            // And as a variable's value, and as the whole payload.
            let e = Chunk::decode(&bytes(&deep)).expect_err("deep nesting decoded");
            assert!(e.to_string().len() <= MAX_MESSAGE);
        }
    }
}

#[test]
fn long_input_is_quoted_short() {
    let mut c = good_chunk("quote", 0, 1);
    c.recipients[0].to = "0".repeat(10_000);
    let m = c.validate().expect_err("10 KB number").to_string();
    assert!(
        m.len() < 200 && m.contains("10000 bytes"),
        "{} bytes: {m}",
        m.len()
    );
    let mut b = chunk_mp(&good_chunk("quote", 0, 1));
    if let Mp::Map(e) = &mut b {
        e[1].1 = Mp::Str(vec![b'9'; 5_000_000]);
    }
    let m = Chunk::decode(&bytes(&b))
        .expect_err("string seq")
        .to_string();
    assert!(m.len() <= MAX_MESSAGE, "{} bytes", m.len());
}

// ---------------------------------------------------------------------------
// The submit path: the CSV/JSONL reader and the template reader, fuzzed.

fn tmp_file(dir: &Path, name: &str, content: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write");
    p
}

fn sms_template() -> Template {
    Template {
        kind: "SMS".into(),
        from: "0212345678".into(),
        text: "Hi #{name}".into(),
        kakao_options: None,
    }
}

fn check_recipients(path: &Path) -> Result<(), TestCaseError> {
    match groupcast::cli::submit::read_recipients(path, &sms_template()) {
        Err(CliError::Usage(m)) => {
            prop_assert!(m.starts_with(&path.display().to_string()), "{}", m);
            prop_assert!(m.len() <= MAX_MESSAGE + 200, "message: {} bytes", m.len());
        }
        Err(other) => prop_assert!(false, "not a usage error: {}", other),
        Ok(rs) => {
            for r in rs {
                prop_assert!(groupcast::phone::is_valid_number(&r.to), "{:?}", r.to);
                prop_assert!(r
                    .vars
                    .get("name")
                    .is_some_and(|v| v.chars().count() <= MAX_VAR_CHARS));
            }
        }
    }
    Ok(())
}

/// A hostile CSV/JSON cell.
fn hostile_cell() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"01012345678".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"\"\"\"".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\0".to_vec()),
        Just(b"\xef\xbb\xbf".to_vec()),
        Just(b"\xff\xfe".to_vec()),
        Just(b",,,,".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"NaN".to_vec()),
        Just(b"1e999".to_vec()),
        Just(b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[".to_vec()),
        Just(b"{\"a\":{\"b\":{}}}".to_vec()),
        (1usize..20_000).prop_map(|n| vec![b'x'; n]),
        (1usize..5_000).prop_map(|n| vec![b'0'; n]),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn recipient_reader_survives_arbitrary_files(
        b in proptest::collection::vec(any::<u8>(), 0..512),
        ext in prop_oneof![Just("csv"), Just("jsonl")],
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        check_recipients(&tmp_file(dir.path(), &format!("r.{ext}"), &b))?;
    }

    #[test]
    fn recipient_reader_survives_mutated_csv(
        rows in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![3 => Just(None), 1 => hostile_cell().prop_map(Some)], 2..4),
            1..6,
        ),
    ) {
        let mut csv = b"to,name\n".to_vec();
        for (i, row) in rows.iter().enumerate() {
            let good = [format!("0101234{i:04}").into_bytes(), format!("Kim{i}").into_bytes()];
            let cells: Vec<Vec<u8>> = row
                .iter()
                .enumerate()
                .map(|(j, c)| c.clone().unwrap_or_else(|| good.get(j).cloned().unwrap_or_default()))
                .collect();
            csv.extend(cells.join(&b","[..]));
            csv.push(b'\n');
        }
        let dir = tempfile::tempdir().expect("tempdir");
        check_recipients(&tmp_file(dir.path(), "r.csv", &csv))?;
    }

    #[test]
    fn recipient_reader_survives_mutated_jsonl(
        rows in proptest::collection::vec(
            (prop_oneof![2 => Just(None), 1 => hostile_cell().prop_map(Some)], prop_oneof![2 => Just(None), 1 => hostile_cell().prop_map(Some)], any::<bool>()),
            1..6,
        ),
    ) {
        let mut out = Vec::new();
        for (i, (to, name, raw)) in rows.iter().enumerate() {
            // A hostile value either as a JSON string or spliced in raw
            // (wrong types, nesting, numbers out of range, broken JSON).
            let value = |v: &Option<Vec<u8>>, good: String| -> Vec<u8> {
                match v {
                    None => serde_json::to_vec(&good).expect("json"),
                    Some(b) if *raw => b.clone(),
                    Some(b) => serde_json::to_vec(&String::from_utf8_lossy(b)).expect("json"),
                }
            };
            out.extend(b"{\"to\": ");
            out.extend(value(to, format!("0101234{i:04}")));
            out.extend(b", \"name\": ");
            out.extend(value(name, format!("Kim{i}")));
            out.extend(b"}\n");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        check_recipients(&tmp_file(dir.path(), "r.jsonl", &out))?;
    }

    #[test]
    fn template_reader_survives_hostile_files(
        b in proptest::collection::vec(any::<u8>(), 0..512),
        kind in hostile_cell(),
        from in hostile_cell(),
        text in hostile_cell(),
        raw in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut files = vec![tmp_file(dir.path(), "t0.json", &b)];
        let field = |v: &Vec<u8>| if raw { v.clone() } else { serde_json::to_vec(&String::from_utf8_lossy(v)).expect("json") };
        let mut t = b"{\"type\": ".to_vec();
        t.extend(field(&kind));
        t.extend(b", \"from\": ");
        t.extend(field(&from));
        t.extend(b", \"text\": ");
        t.extend(field(&text));
        t.extend(b"}");
        files.push(tmp_file(dir.path(), "t1.json", &t));
        for p in files {
            match groupcast::cli::submit::read_template(&p) {
                Err(CliError::Usage(m)) => {
                    prop_assert!(m.starts_with(&p.display().to_string()), "{}", m);
                    prop_assert!(m.len() <= MAX_MESSAGE + 200, "message: {} bytes", m.len());
                }
                Err(other) => prop_assert!(false, "not a usage error: {}", other),
                Ok(t) => prop_assert!(t.validate().is_ok()),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Every limit, on the submit path (the CLI, before anything is appended).

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
    let closed = groupcast::redis_server::free_port().expect("port");
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
            "not a valid phone number",
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

// ---------------------------------------------------------------------------
// End to end: malicious entries on the streams, a good batch beside them.

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
            "is not `chunk`",
        ),
        ("no payload", entry(b"1", b"chunk", None), "no `d`"),
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

#[test]
fn recipients_keep_their_types() {
    // A guard for the fuzz targets above: the reader's happy path.
    let dir = tempfile::tempdir().expect("tempdir");
    let p = tmp_file(
        dir.path(),
        "r.jsonl",
        b"{\"to\": \"010-1234-5678\", \"name\": \"Kim\"}\n\n{\"to\": \"01012345679\", \"name\": 7}\n",
    );
    let rs: Vec<Recipient> =
        groupcast::cli::submit::read_recipients(&p, &sms_template()).expect("read");
    assert_eq!(rs.len(), 2);
    assert_eq!(rs[0].to, "01012345678");
    assert_eq!(rs[1].vars["name"], "7");
}
