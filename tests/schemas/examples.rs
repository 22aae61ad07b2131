//! Every event type has a schema and an example; every example decodes and
//! fits its schema; every malformed example is refused with a reason; the
//! examples agree with each other.

use groupcast::events::{Chunk, Event};
use serde_json::{json, Map, Value};

use crate::validator::schema_errors;
use crate::{decode, json_files, msgpack, read_json, readme, root, stem, Kind};

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

#[test]
fn the_chunk_assigned_example_is_the_chunk_examples_assignment() {
    let chunk: Chunk = rmp_serde::from_slice(&msgpack(&read_json(
        &root().join("examples").join("chunk.json"),
    )))
    .expect("chunk example");
    let assigned = read_json(&root().join("examples").join("chunk_assigned.json"));
    assert_eq!(assigned["digest"], json!(chunk.digest()));
    assert_eq!(assigned["seq"], json!(chunk.seq));
    // Its recipients: those sent, and the copies of numbers already given.
    let copies = assigned["duplicates"].as_array().map_or(0, Vec::len);
    assert_eq!(
        assigned["count"].as_u64().map(|n| n as usize + copies),
        Some(chunk.recipients.len())
    );
    assert_eq!(assigned["last"], json!(chunk.last));
}

#[test]
fn the_dead_letter_example_names_its_entrys_problem() {
    let dl = read_json(&root().join("examples").join("dead_letter.json"));
    let e = decode(Kind::Chunk, &dl["f:d"], false).expect_err("its chunk is malformed");
    let reason = dl["reason"].as_str().expect("reason");
    assert!(reason.ends_with(&e), "reason {reason:?} vs decoder {e:?}");
}
