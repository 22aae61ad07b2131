//! The schemas and the decoders judge every mutation of every field alike.

use std::collections::BTreeSet;

use groupcast::events::Event;
use serde_json::{json, Value};

use crate::validator::{as_i128, json_type_matches, Validator};
use crate::{decode, read_json, root, stem, Kind};

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
        // An example with every property: `<name>-every-field.json` where the
        // usual example cannot have them all (an advertising chunk is not
        // the usual chunk), else `<name>.json`.
        let examples = root().join("examples");
        let every_field = examples.join(format!("{name}-every-field.json"));
        let example = read_json(&if every_field.exists() {
            every_field
        } else {
            examples.join(format!("{name}.json"))
        });
        let validator = Validator::new(schema.clone());
        agree(kind, &validator, &schema, &example, Vec::new(), &mut seen);
    }
    // Every field of every event, the chunk's nested ones, the work item's.
    assert!(seen.len() >= 70, "only {} fields checked", seen.len());
}
