//! `schemas/` against groupcast's own decoders.
//!
//! Every example payload (JSON, converted to MessagePack with named fields)
//! must decode with the decoder groupcast runs, every malformed one must be
//! refused with an error that names the problem, and every event type must
//! have a schema and an example. The schemas themselves are checked against
//! the decoders too: a small validator for the JSON Schema keywords that
//! `schemas/` uses (it refuses any other keyword, so nothing goes unchecked),
//! and mutations of each complete example (a field removed, a value of the
//! wrong type, an integer out of range) that the schema and the decoder must
//! judge alike.

#[path = "schemas/validator.rs"]
mod validator;

#[path = "schemas/agreement.rs"]
mod agreement;
#[path = "schemas/encoding.rs"]
mod encoding;
#[path = "schemas/examples.rs"]
mod examples;
#[path = "schemas/limits.rs"]
mod limits;

use std::path::{Path, PathBuf};

use groupcast::events::{decode_payload, encode_payload, Chunk, Event, Recorded};
use groupcast::worker::ops::WorkItem;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------
// Files

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("schemas/README.md")
}

/// The `.json` files of a directory, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    out.sort();
    out
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .expect("file name")
        .trim_end_matches(".schema")
        .to_string()
}

/// What a payload is, from its example's name (`<kind>[-<variant>].json`) or
/// an invalid example's `_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chunk,
    Event(&'static str),
    Envelope,
    IngestEntry,
    Seal,
    WorkItem,
    DeadLetter,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "chunk" => Kind::Chunk,
            "envelope" => Kind::Envelope,
            "ingest_entry" => Kind::IngestEntry,
            "seal" => Kind::Seal,
            "work_item" => Kind::WorkItem,
            "dead_letter" => Kind::DeadLetter,
            t => Kind::Event(Event::TYPE_NAMES.iter().find(|n| **n == t)?),
        })
    }

    fn of_example(path: &Path) -> Kind {
        let name = stem(path);
        let kind = name.split('-').next().unwrap_or_default();
        Kind::parse(kind).unwrap_or_else(|| {
            panic!(
                "{}: no schema is named {kind:?} (examples are named <schema>[-<variant>].json)",
                path.display()
            )
        })
    }

    fn schema_path(self) -> PathBuf {
        match self {
            Kind::Chunk => root().join("chunk.schema.json"),
            Kind::Event(t) => root().join("events").join(format!("{t}.schema.json")),
            Kind::Envelope => root().join("envelope.schema.json"),
            Kind::IngestEntry => root().join("ingest_entry.schema.json"),
            Kind::Seal => root().join("seal.schema.json"),
            Kind::WorkItem => root().join("work_item.schema.json"),
            Kind::DeadLetter => root().join("dead_letter.schema.json"),
        }
    }

    fn schema(self) -> Value {
        read_json(&self.schema_path())
    }
}

// ---------------------------------------------------------------------------
// Decoding with groupcast's decoders

/// JSON to MessagePack with named fields, as any producer writes it.
fn msgpack(v: &Value) -> Vec<u8> {
    rmp_serde::to_vec_named(v).expect("JSON encodes as MessagePack")
}

/// MessagePack back to JSON, to compare what groupcast writes with an example.
fn from_msgpack(bytes: &[u8]) -> Value {
    rmp_serde::from_slice(bytes).expect("groupcast's own encoding decodes")
}

/// The fields of a stream entry shown as JSON: `d` (an object or array) is
/// MessagePack, every other value is a string's UTF-8 bytes.
fn entry_fields(v: &Value) -> Vec<(String, Vec<u8>)> {
    v.as_object()
        .expect("an entry is shown as an object")
        .iter()
        .map(|(name, value)| {
            let bytes = match value {
                Value::String(s) if name != "d" => s.as_bytes().to_vec(),
                other => msgpack(other),
            };
            (name.clone(), bytes)
        })
        .collect()
}

/// Decodes a payload the way groupcast does (for a chunk: decode, then
/// validate unless `structural_only`). Returns groupcast's own re-encoding
/// of what it read, as JSON, or the error message.
fn decode(kind: Kind, v: &Value, structural_only: bool) -> Result<Value, String> {
    match kind {
        Kind::Chunk => {
            let c = Chunk::decode(&msgpack(v)).map_err(|e| e.to_string())?;
            if !structural_only {
                c.validate().map_err(|e| e.to_string())?;
            }
            Ok(from_msgpack(&c.encode()))
        }
        Kind::Event(t) => {
            let e = Event::decode(t, &msgpack(v)).map_err(|e| e.to_string())?;
            assert_eq!(e.type_name(), t);
            Ok(from_msgpack(&e.encode_data()))
        }
        Kind::Envelope => {
            let r = Recorded::from_fields("1-0", &entry_fields(v)).map_err(|e| e.to_string())?;
            Ok(json!({
                "v": "1",
                "t": r.event.type_name(),
                "k": r.key,
                "d": from_msgpack(&r.event.encode_data()),
            }))
        }
        Kind::IngestEntry => {
            let d = v.get("d").ok_or("entry has no `d` field")?;
            let kind = if v["t"] == "seal" {
                Kind::Seal
            } else {
                Kind::Chunk
            };
            let d = decode(kind, d, structural_only)?;
            Ok(json!({"v": v["v"], "t": v["t"], "d": d}))
        }
        Kind::Seal => {
            let s =
                groupcast::events::seal::Seal::decode(&msgpack(v)).map_err(|e| e.to_string())?;
            Ok(from_msgpack(&s.encode()))
        }
        Kind::WorkItem => {
            let w: WorkItem =
                decode_payload("work item", &msgpack(v)).map_err(|e| e.to_string())?;
            Ok(from_msgpack(&encode_payload(&w)))
        }
        Kind::DeadLetter => {
            // Written by workers only; its original fields are checked below.
            Ok(v.clone())
        }
    }
}
