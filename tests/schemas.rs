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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use groupcast::events::chunk::{
    MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use groupcast::events::{decode_payload, encode_payload, Chunk, Event, Recorded};
use groupcast::keys::{shard_of, Keyspace, MAX_BATCH_ID_LEN};
use groupcast::worker::ops::WorkItem;
use serde_json::{json, Map, Value};

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
    WorkItem,
    DeadLetter,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "chunk" => Kind::Chunk,
            "envelope" => Kind::Envelope,
            "ingest_entry" => Kind::IngestEntry,
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
            let d = decode(Kind::Chunk, d, structural_only)?;
            Ok(json!({"v": v["v"], "t": v["t"], "d": d}))
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

// ---------------------------------------------------------------------------
// A validator for the JSON Schema (2020-12) keywords that schemas/ uses

/// Keywords that only annotate.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$defs",
    "$comment",
    "title",
    "description",
];

/// The regular expressions schemas/ uses, each with an equivalent check
/// (the tests have no regex engine; an unknown pattern fails the test).
fn pattern_matches(pattern: &str, s: &str) -> bool {
    let batch_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match pattern {
        "^[A-Za-z0-9._-]{1,128}$" => (1..=128).contains(&s.len()) && s.chars().all(batch_char),
        "\\S" => s.chars().any(|c| !c.is_whitespace()),
        "^[0-9a-f]{16}$" => {
            s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        "^[0-9]+-[0-9]+$" => s
            .split_once('-')
            .is_some_and(|(a, b)| digits(a) && digits(b)),
        "^[0-9]+$" => digits(s),
        "^f:" => s.starts_with("f:"),
        other => {
            panic!("the schema test does not know the pattern {other:?}: add it to pattern_matches")
        }
    }
}

fn json_type_matches(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        // JSON Schema: a number with no fractional part (3.0 is an integer).
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => panic!("unknown JSON Schema type {other:?}"),
    }
}

fn as_i128(v: &Value) -> Option<i128> {
    v.as_i64()
        .map(i128::from)
        .or_else(|| v.as_u64().map(i128::from))
}

fn number_cmp(v: &Value, bound: &Value) -> std::cmp::Ordering {
    match (as_i128(v), as_i128(bound)) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => {
            let (a, b) = (v.as_f64().expect("number"), bound.as_f64().expect("number"));
            a.partial_cmp(&b).expect("comparable numbers")
        }
    }
}

struct Validator {
    root: Value,
}

impl Validator {
    fn new(root: Value) -> Self {
        Validator { root }
    }

    /// Follows a local `$ref` (`#/$defs/name`).
    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let name = r.strip_prefix("#/$defs/").unwrap_or_else(|| {
                    panic!("only local #/$defs/ references are supported, not {r}")
                });
                let target = &self.root["$defs"][name];
                assert!(!target.is_null(), "dangling reference {r}");
                self.resolve(target)
            }
            None => schema,
        }
    }

    /// Every violation of `schema` by `v`, with the JSON path.
    fn errors(&self, v: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        self.check(&self.root, v, "$", &mut errs);
        errs
    }

    fn check(&self, schema: &Value, v: &Value, path: &str, errs: &mut Vec<String>) {
        let schema = self.resolve(schema);
        let Some(obj) = schema.as_object() else {
            panic!("schema at {path} is not an object");
        };
        for (keyword, arg) in obj {
            if ANNOTATIONS.contains(&keyword.as_str()) || keyword.starts_with("x-") {
                continue;
            }
            let mut fail = |what: String| errs.push(format!("{path}: {what}"));
            match keyword.as_str() {
                "$ref" => {}
                "type" => {
                    let types: Vec<&str> = match arg {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                        _ => panic!("bad type at {path}"),
                    };
                    if !types.iter().any(|t| json_type_matches(t, v)) {
                        fail(format!("{v} is not of type {types:?}"));
                    }
                }
                "enum" => {
                    if !arg.as_array().expect("enum array").contains(v) {
                        fail(format!("{v} is not one of {arg}"));
                    }
                }
                "const" => {
                    if v != arg {
                        fail(format!("{v} is not {arg}"));
                    }
                }
                "required" => {
                    if let Some(o) = v.as_object() {
                        for name in arg.as_array().expect("required array") {
                            let name = name.as_str().expect("required name");
                            if !o.contains_key(name) {
                                fail(format!("missing required property {name:?}"));
                            }
                        }
                    }
                }
                "properties" => {
                    if let Some(o) = v.as_object() {
                        for (name, sub) in arg.as_object().expect("properties object") {
                            if let Some(x) = o.get(name) {
                                self.check(sub, x, &format!("{path}.{name}"), errs);
                            }
                        }
                    }
                }
                "patternProperties" => {
                    if let Some(o) = v.as_object() {
                        for (pattern, sub) in arg.as_object().expect("patternProperties object") {
                            for (name, x) in o {
                                if pattern_matches(pattern, name) {
                                    self.check(sub, x, &format!("{path}.{name}"), errs);
                                }
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Some(o) = v.as_object() {
                        let known = |name: &str| {
                            obj.get("properties")
                                .and_then(Value::as_object)
                                .is_some_and(|p| p.contains_key(name))
                                || obj
                                    .get("patternProperties")
                                    .and_then(Value::as_object)
                                    .is_some_and(|p| p.keys().any(|pat| pattern_matches(pat, name)))
                        };
                        for (name, x) in o.iter().filter(|(n, _)| !known(n)) {
                            match arg {
                                Value::Bool(false) => {
                                    errs.push(format!("{path}: unknown property {name:?}"))
                                }
                                Value::Bool(true) => {}
                                sub => self.check(sub, x, &format!("{path}.{name}"), errs),
                            }
                        }
                    }
                }
                "items" => {
                    if let Some(a) = v.as_array() {
                        for (i, x) in a.iter().enumerate() {
                            self.check(arg, x, &format!("{path}[{i}]"), errs);
                        }
                    }
                }
                "minItems" | "maxItems" => {
                    if let Some(a) = v.as_array() {
                        let n = arg.as_u64().expect("count") as usize;
                        if (keyword == "minItems" && a.len() < n)
                            || (keyword == "maxItems" && a.len() > n)
                        {
                            fail(format!("{} items, {keyword} {n}", a.len()));
                        }
                    }
                }
                "minLength" | "maxLength" => {
                    if let Some(s) = v.as_str() {
                        let n = arg.as_u64().expect("length") as usize;
                        let len = s.chars().count();
                        if (keyword == "minLength" && len < n)
                            || (keyword == "maxLength" && len > n)
                        {
                            fail(format!("{len} characters, {keyword} {n}"));
                        }
                    }
                }
                "minimum" | "maximum" => {
                    if v.is_number() {
                        let ord = number_cmp(v, arg);
                        if (keyword == "minimum" && ord.is_lt())
                            || (keyword == "maximum" && ord.is_gt())
                        {
                            fail(format!("{v} is out of range ({keyword} {arg})"));
                        }
                    }
                }
                "pattern" => {
                    if let Some(s) = v.as_str() {
                        if !pattern_matches(arg.as_str().expect("pattern"), s) {
                            fail(format!("{s:?} does not match {arg}"));
                        }
                    }
                }
                "if" => {
                    let mut sub = Vec::new();
                    self.check(arg, v, path, &mut sub);
                    if sub.is_empty() {
                        if let Some(then) = obj.get("then") {
                            self.check(then, v, path, errs);
                        }
                    }
                }
                "then" => {}
                other => panic!(
                    "schema keyword {other:?} at {path} is not checked by tests/schemas.rs: \
                     extend the validator or avoid the keyword"
                ),
            }
        }
    }
}

fn schema_errors(kind: Kind, v: &Value) -> Vec<String> {
    Validator::new(kind.schema()).errors(v)
}

// ---------------------------------------------------------------------------
// The tests

#[test]
fn every_event_type_has_a_schema_an_example_and_a_readme_entry() {
    let readme = readme();
    let mut missing = Vec::new();
    for t in Event::TYPE_NAMES {
        let path = Kind::Event(t).schema_path();
        if !path.exists() {
            missing.push(format!("{} (schema of event {t})", path.display()));
            continue;
        }
        let schema = read_json(&path);
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{t}"
        );
        assert_eq!(schema["title"], *t, "{}: title", path.display());
        assert_eq!(
            schema["x-groupcast"]["t"],
            *t,
            "{}: x-groupcast.t",
            path.display()
        );
        let key = schema["x-groupcast"]["k"].as_str().unwrap_or_default();
        assert!(
            !key.is_empty(),
            "{}: x-groupcast.k (the idempotency key) is missing",
            path.display()
        );
        let example = root().join("examples").join(format!("{t}.json"));
        if !example.exists() {
            missing.push(format!("{} (example of event {t})", example.display()));
        }
        for needle in [format!("`{t}`"), format!("`{key}`")] {
            if !readme.contains(&needle) {
                missing.push(format!("schemas/README.md never mentions {needle}"));
            }
        }
    }
    assert!(missing.is_empty(), "missing:\n{}", missing.join("\n"));
    for path in json_files(&root().join("events")) {
        let name = stem(&path);
        assert!(
            Event::TYPE_NAMES.contains(&name.as_str()),
            "{} describes no event type of Event::TYPE_NAMES",
            path.display()
        );
    }
    let envelope = Kind::Envelope.schema();
    let listed: Vec<&str> = envelope["properties"]["t"]["enum"]
        .as_array()
        .expect("envelope t enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(listed, Event::TYPE_NAMES, "envelope.schema.json's `t` enum");
}

#[test]
fn every_example_decodes_with_groupcasts_decoder_and_fits_its_schema() {
    let files = json_files(&root().join("examples"));
    assert!(
        files.len() >= Event::TYPE_NAMES.len() + 4,
        "too few examples: {files:?}"
    );
    for path in &files {
        let kind = Kind::of_example(path);
        let example = read_json(path);
        let errs = schema_errors(kind, &example);
        assert!(
            errs.is_empty(),
            "{} does not fit its schema: {errs:#?}",
            path.display()
        );
        let decoded = decode(kind, &example, false)
            .unwrap_or_else(|e| panic!("{} does not decode: {e}", path.display()));
        // A complete example (`<kind>.json`) is exactly what groupcast writes
        // back: no field the decoder ignores, none it would add.
        if !stem(path).contains('-') {
            assert_eq!(
                decoded,
                example,
                "{}: groupcast re-encodes it differently (a field added to or missing from the example?)",
                path.display()
            );
        }
    }
}

#[test]
fn every_malformed_example_is_refused_with_a_reason_naming_the_problem() {
    let files = json_files(&root().join("examples").join("invalid"));
    assert!(files.len() >= 20, "too few malformed examples");
    let mut failures = Vec::new();
    for path in &files {
        let mut example = read_json(path);
        let obj = example.as_object_mut().expect("object");
        let take = |obj: &mut Map<String, Value>, name: &str| {
            obj.remove(name)
                .unwrap_or_else(|| panic!("{} has no {name:?}", path.display()))
        };
        let kind = Kind::parse(take(obj, "_type").as_str().expect("_type"))
            .unwrap_or_else(|| panic!("{}: unknown _type", path.display()));
        let why = take(obj, "_why");
        assert!(
            why.as_str().is_some_and(|w| w.len() > 10),
            "{}: _why",
            path.display()
        );
        let expected = take(obj, "_error");
        let expected = expected.as_str().expect("_error is a string");
        let schema_rejects = take(obj, "_schema_rejects")
            .as_bool()
            .expect("_schema_rejects");
        assert!(
            obj.keys().all(|k| !k.starts_with('_')),
            "{}: unknown note",
            path.display()
        );
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        match decode(kind, &example, false) {
            Ok(v) => failures.push(format!("{name} was accepted as {v}")),
            Err(e) if !e.contains(expected) => {
                failures.push(format!("{name}: the error {e:?} does not say {expected:?}"))
            }
            Err(_) => {}
        }
        let errs = schema_errors(kind, &example);
        if errs.is_empty() == schema_rejects {
            failures.push(format!(
                "{name}: _schema_rejects is {schema_rejects} but the schema says {errs:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One way to break a field of a complete example.
enum Mutation {
    Remove,
    Set(Value),
}

fn mutate(v: &Value, path: &[PathStep], m: &Mutation) -> Value {
    let mut out = v.clone();
    let mut at = &mut out;
    for step in &path[..path.len() - 1] {
        at = match step {
            PathStep::Key(k) => &mut at[k.as_str()],
            PathStep::Index(i) => &mut at[*i],
        };
    }
    match (path.last().expect("non-empty path"), m) {
        (PathStep::Key(k), Mutation::Remove) => {
            at.as_object_mut().expect("object").remove(k);
        }
        (PathStep::Key(k), Mutation::Set(x)) => at[k.as_str()] = x.clone(),
        (PathStep::Index(i), Mutation::Set(x)) => at[*i] = x.clone(),
        (PathStep::Index(_), Mutation::Remove) => unreachable!(),
    }
    out
}

#[derive(Clone, Debug)]
enum PathStep {
    Key(String),
    Index(usize),
}

/// A value of a JSON type the schema does not allow.
fn wrong_type(schema: &Value) -> Value {
    let allowed: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    [json!("x"), json!(7), json!(true), json!({})]
        .into_iter()
        .find(|c| !allowed.iter().any(|t| json_type_matches(t, c)))
        .expect("some other type")
}

/// Walks the properties of `schema` present in `example`, mutating each one
/// and checking that the decoder and the schema agree.
fn agree(
    kind: Kind,
    validator: &Validator,
    schema: &Value,
    example: &Value,
    at: Vec<PathStep>,
    seen: &mut Vec<String>,
) {
    let schema = validator.resolve(schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let node = at.iter().fold(example, |v, s| match s {
        PathStep::Key(k) => &v[k.as_str()],
        PathStep::Index(i) => &v[*i],
    });
    for (name, sub) in props {
        let sub = validator.resolve(sub);
        let mut path = at.clone();
        path.push(PathStep::Key(name.clone()));
        let label = format!("{kind:?} {path:?}");
        seen.push(label.clone());
        assert!(
            node.get(name).is_some(),
            "{label}: the complete example lacks this property"
        );
        // Removal: refused iff the schema requires the field.
        let without = mutate(example, &path, &Mutation::Remove);
        match (
            decode(kind, &without, true),
            required.contains(name.as_str()),
        ) {
            (Ok(_), true) => panic!("{label}: required by the schema, optional for the decoder"),
            (Err(e), false) => panic!("{label}: optional in the schema, the decoder says {e}"),
            (Err(e), true) => assert!(
                e.contains(&format!("missing field `{name}`")),
                "{label}: removing it gives {e:?}"
            ),
            (Ok(_), false) => {}
        }
        // A value of the wrong type, and integers out of range: both refuse.
        let mut bad = vec![wrong_type(sub)];
        if let Some(min) = sub.get("minimum").and_then(as_i128) {
            bad.push(json!((min - 1) as i64));
        }
        if let Some(max) = sub.get("maximum").and_then(Value::as_u64) {
            if let Some(over) = max.checked_add(1) {
                bad.push(json!(over));
            }
        }
        for b in bad {
            let broken = mutate(example, &path, &Mutation::Set(b.clone()));
            assert!(
                decode(kind, &broken, true).is_err(),
                "{label}: the decoder accepts {b}"
            );
            assert!(
                !validator.errors(&broken).is_empty(),
                "{label}: the schema accepts {b}"
            );
        }
        // Nullable in the schema: nil is read as absent.
        if matches!(&sub["type"], Value::Array(ts) if ts.contains(&json!("null"))) {
            let nulled = mutate(example, &path, &Mutation::Set(Value::Null));
            if let Err(e) = decode(kind, &nulled, true) {
                panic!("{label}: nullable in the schema, the decoder says {e}");
            }
        }
        // Values of a map (vars): the wrong type is refused by both.
        if let (Some(values), Some(map)) = (
            sub.get("additionalProperties").filter(|a| a.is_object()),
            node.get(name).and_then(Value::as_object),
        ) {
            if let Some(first) = map.keys().next() {
                let mut p = path.clone();
                p.push(PathStep::Key(first.clone()));
                let broken = mutate(example, &p, &Mutation::Set(wrong_type(values)));
                assert!(decode(kind, &broken, true).is_err(), "{label}.{first}");
                assert!(!validator.errors(&broken).is_empty(), "{label}.{first}");
            }
        }
        // Nested objects, and the first item of arrays of objects.
        agree(kind, validator, sub, example, path.clone(), seen);
        if let Some(items) = sub.get("items") {
            if node[name].as_array().is_some_and(|a| !a.is_empty()) {
                let mut p = path.clone();
                p.push(PathStep::Index(0));
                agree(kind, validator, items, example, p, seen);
            }
        }
    }
}

#[test]
fn schemas_and_decoders_agree_on_every_field() {
    let mut kinds: Vec<Kind> = Event::TYPE_NAMES.iter().map(|t| Kind::Event(t)).collect();
    kinds.extend([Kind::Chunk, Kind::WorkItem]);
    let mut seen = Vec::new();
    for kind in kinds {
        let schema = kind.schema();
        let name = stem(&kind.schema_path());
        let example = read_json(&root().join("examples").join(format!("{name}.json")));
        let validator = Validator::new(schema.clone());
        agree(kind, &validator, &schema, &example, Vec::new(), &mut seen);
    }
    // Every field of every event, the chunk's nested ones, the work item's.
    assert!(seen.len() >= 70, "only {} fields checked", seen.len());
}

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
    assert_eq!(key, "gc:{s9}:ingest");
    assert!(
        readme.contains(&format!("`{key}`")),
        "README's worked example names {key}"
    );
}

#[test]
fn the_chunk_assigned_example_is_the_chunk_examples_assignment() {
    let chunk: Chunk = rmp_serde::from_slice(&msgpack(&read_json(
        &root().join("examples").join("chunk.json"),
    )))
    .expect("chunk example");
    let assigned = read_json(&root().join("examples").join("chunk_assigned.json"));
    assert_eq!(assigned["digest"], json!(chunk.digest()));
    assert_eq!(assigned["seq"], json!(chunk.seq));
    assert_eq!(assigned["count"], json!(chunk.recipients.len()));
    assert_eq!(assigned["last"], json!(chunk.last));
}

#[test]
fn the_dead_letter_example_names_its_entrys_problem() {
    let dl = read_json(&root().join("examples").join("dead_letter.json"));
    let e = decode(Kind::Chunk, &dl["f:d"], false).expect_err("its chunk is malformed");
    let reason = dl["reason"].as_str().expect("reason");
    assert!(reason.ends_with(&e), "reason {reason:?} vs decoder {e:?}");
}
