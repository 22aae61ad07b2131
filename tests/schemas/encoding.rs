//! The README's encoding rules and shard vectors hold.

use groupcast::events::{Chunk, Event};
use groupcast::keys::{shard_of, shard_tag, Keyspace};
use serde_json::json;

use crate::validator::schema_errors;
use crate::{decode, msgpack, read_json, readme, root, Kind};

/// Hand-made MessagePack, to check the encoding rules of the README.
fn str8(s: &str) -> Vec<u8> {
    let mut out = vec![0xa0 | s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

#[test]
fn encoding_rules_of_the_readme_hold() {
    // Garbage bytes are refused, naming the payload.
    let e = Chunk::decode(b"\xc1\xff garbage")
        .expect_err("garbage")
        .to_string();
    assert!(e.starts_with("malformed chunk payload"), "{e}");
    let e = Event::decode("chunk_assigned", b"\x92\x01")
        .expect_err("short")
        .to_string();
    assert!(e.starts_with("malformed chunk_assigned payload"), "{e}");

    // Integers of any width are read: {"gen": <uint64 5>}, {"gen": <int64 5>}.
    for int in [
        &[0xcf, 0, 0, 0, 0, 0, 0, 0, 5][..],
        &[0xd3, 0, 0, 0, 0, 0, 0, 0, 5],
        &[0xcc, 5],
        &[0x05],
    ] {
        let mut d = vec![0x81];
        d.extend(str8("gen"));
        d.extend_from_slice(int);
        assert_eq!(
            Event::decode("group_requested", &d).expect("int width"),
            Event::decode("group_requested", &msgpack(&json!({"gen": 5}))).expect("fixint")
        );
    }
    // A float is not an integer, even 5.0.
    let mut d = vec![0x81];
    d.extend(str8("gen"));
    d.extend_from_slice(&[0xcb, 0x40, 0x14, 0, 0, 0, 0, 0, 0]);
    let e = Event::decode("group_requested", &d)
        .expect_err("float")
        .to_string();
    assert!(e.contains("expected u32"), "{e}");

    // Booleans are MessagePack booleans, not 0/1.
    let mut c = read_json(&root().join("examples").join("chunk-sms.json"));
    c["last"] = json!(1);
    assert!(decode(Kind::Chunk, &c, false)
        .expect_err("0/1")
        .contains("expected a boolean"));

    // Strings should be `str`; a `bin` holding UTF-8 is tolerated by this
    // decoder (some encoders write bin by default), anything else is refused.
    let mut d = vec![0x82];
    d.extend(str8("gen"));
    d.push(0x00);
    d.extend(str8("group_id"));
    d.extend_from_slice(&[0xc4, 3]);
    d.extend_from_slice(b"G4V");
    let bin = Event::decode("group_created", &d);
    let str_ = Event::decode(
        "group_created",
        &msgpack(&json!({"gen": 0, "group_id": "G4V"})),
    );
    assert_eq!(bin.expect("bin holding UTF-8"), str_.expect("str"));
    let n = d.len();
    d[n - 3..].copy_from_slice(b"\xff\xfe\xfd");
    assert!(
        Event::decode("group_created", &d).is_err(),
        "bin that is not UTF-8"
    );

    // Maps with named fields are the format. This decoder also reads a
    // positional array in field order, which the README forbids: the order is
    // an implementation detail, and the scripts' cmsgpack reads maps.
    let positional = json!([0, "G4V"]);
    assert!(Event::decode("group_created", &msgpack(&positional)).is_ok());

    // Fields the decoder does not know are ignored (forward compatibility);
    // the schemas refuse them, so that a misspelt optional field is caught by
    // a producer that validates.
    let mut c = read_json(&root().join("examples").join("chunk.json"));
    c["template"]["kakaoOptions"] = c["template"]["kakao_options"].clone();
    c["priority"] = json!("high");
    decode(Kind::Chunk, &c, false).expect("unknown fields are ignored");
    let errs = schema_errors(Kind::Chunk, &c);
    assert_eq!(errs.len(), 2, "{errs:?}");

    // nil is read as absent for optional fields.
    let e = Event::decode(
        "input_rejected",
        &msgpack(&json!({"seq": null, "reason": "r"})),
    );
    assert!(e.is_ok());
}

#[test]
fn the_readmes_shard_vectors_are_fnv1a() {
    let readme = readme();
    let table = readme
        .split("<!-- shard-vectors -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /shard-vectors -->").next())
        .expect("README has a <!-- shard-vectors --> table");
    let mut rows = 0;
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        let [id, hash, s1, s4, s16] = cells[..] else {
            panic!("bad shard vector row {line:?}");
        };
        let hash = u32::from_str_radix(hash.trim_start_matches("0x"), 16).expect("hex hash");
        assert_eq!(shard_of(id, u32::MAX), hash % u32::MAX, "FNV-1a of {id:?}");
        for (shards, want) in [(1, s1), (4, s4), (16, s16)] {
            assert_eq!(
                shard_of(id, shards).to_string(),
                want,
                "shard of {id:?} among {shards}"
            );
        }
        rows += 1;
    }
    assert!(rows >= 3, "only {rows} shard vectors");
    // The worked example's key.
    let ks = Keyspace::new("gc", 16);
    let key = ks.ingest(ks.shard_of("camp-2026.11_29"));
    assert_eq!(key, "gc:{s9-2}:ingest");
    assert!(
        readme.contains(&format!("`{key}`")),
        "README's worked example names {key}"
    );
}

#[test]
fn the_readmes_tag_vectors_are_groupcasts_tags() {
    let readme = readme();
    let table = readme
        .split("<!-- tag-vectors -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /tag-vectors -->").next())
        .expect("README has a <!-- tag-vectors --> table");
    let mut rows = 0;
    for line in table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| shards"))
    {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [n, tags] = cells[..] else {
            panic!("bad tag vector row {line:?}");
        };
        let n: u32 = n.parse().expect("shard count");
        let tags: Vec<&str> = tags
            .split_whitespace()
            .map(|t| t.trim_matches('`'))
            .collect();
        let ours: Vec<String> = (0..n).map(|k| shard_tag(k, n)).collect();
        assert_eq!(tags, ours, "tags of {n} shards");
        rows += 1;
    }
    assert!(rows >= 4, "only {rows} tag vectors");
    // The worked example's other key, and the Python in the text.
    let ks = Keyspace::new("gc", 16);
    assert_eq!(ks.ingest(ks.shard_of("b1")), "gc:{s12-60}:ingest");
    assert!(readme.contains("`gc:{s12-60}:ingest`"));
    assert!(readme.contains("def shard_tag(k: int, n: int) -> str:"));
}
