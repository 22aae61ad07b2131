//! The limits in the schema and the README are the code's.

use groupcast::events::chunk::{
    MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use groupcast::events::Chunk;
use groupcast::keys::MAX_BATCH_ID_LEN;
use serde_json::{json, Value};

use crate::validator::schema_errors;
use crate::{decode, msgpack, read_json, readme, root, Kind};

#[test]
fn limits_in_the_schema_and_readme_are_the_codes() {
    let chunk = Kind::Chunk.schema();
    let defs = &chunk["$defs"];
    assert_eq!(
        chunk["properties"]["recipients"]["maxItems"],
        json!(MAX_CHUNK_RECIPIENTS)
    );
    assert_eq!(
        chunk["properties"]["batch"]["maxLength"],
        json!(MAX_BATCH_ID_LEN)
    );
    assert_eq!(
        defs["template"]["properties"]["text"]["maxLength"],
        json!(MAX_TEXT_CHARS)
    );
    assert_eq!(
        defs["recipient"]["properties"]["vars"]["additionalProperties"]["maxLength"],
        json!(MAX_VAR_CHARS)
    );
    assert_eq!(
        chunk["x-groupcast"]["max_encoded_bytes"],
        json!(MAX_CHUNK_BYTES)
    );
    let readme = readme();
    for n in [
        MAX_CHUNK_RECIPIENTS,
        MAX_CHUNK_BYTES,
        MAX_TEXT_CHARS,
        MAX_VAR_CHARS,
        MAX_BATCH_ID_LEN,
    ] {
        assert!(
            readme.contains(&format!("| {n} ")),
            "README's limits table lacks {n}"
        );
    }
}

fn recipients(n: usize, var_len: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"to": format!("010{i:08}"), "vars": {"v": "x".repeat(var_len)}}))
            .collect(),
    )
}

#[test]
fn oversized_chunks_are_refused_with_the_limit() {
    let mut c = read_json(&root().join("examples").join("chunk-sms.json"));
    c["recipients"] = recipients(MAX_CHUNK_RECIPIENTS, 0);
    decode(Kind::Chunk, &c, false).expect("exactly the maximum is fine");
    assert!(schema_errors(Kind::Chunk, &c).is_empty());

    c["recipients"] = recipients(MAX_CHUNK_RECIPIENTS + 1, 0);
    let e = decode(Kind::Chunk, &c, false).expect_err("one recipient too many");
    assert_eq!(e, "chunk has 10001 recipients; at most 10000 are allowed");
    assert!(!schema_errors(Kind::Chunk, &c).is_empty());

    c["recipients"] = recipients(MAX_CHUNK_RECIPIENTS, MAX_VAR_CHARS);
    let bytes = msgpack(&c);
    assert!(bytes.len() > MAX_CHUNK_BYTES);
    let e = Chunk::decode(&bytes)
        .expect_err("too many bytes")
        .to_string();
    assert!(
        e.contains(&format!("{} bytes", bytes.len())) && e.contains("over the limit"),
        "{e}"
    );
}
