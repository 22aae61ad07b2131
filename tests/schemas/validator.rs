//! A validator for the JSON Schema (2020-12) keywords that `schemas/` uses.

use serde_json::Value;

use crate::Kind;

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
        "^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?$" => {
            let parts: Vec<&str> = s.split(':').collect();
            let two = |p: &str, max: u32| {
                p.len() == 2 && digits(p) && p.parse::<u32>().is_ok_and(|v| v <= max)
            };
            matches!(parts.len(), 2 | 3)
                && two(parts[0], 23)
                && two(parts[1], 59)
                && parts.get(2).is_none_or(|p| two(p, 59))
        }
        other => {
            panic!("the schema test does not know the pattern {other:?}: add it to pattern_matches")
        }
    }
}

/// Whether `v` is of the JSON Schema type `t`.
pub fn json_type_matches(t: &str, v: &Value) -> bool {
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

/// An integer value as `i128`, whatever its sign (`None` for a fraction).
pub fn as_i128(v: &Value) -> Option<i128> {
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

pub struct Validator {
    root: Value,
}

impl Validator {
    pub fn new(root: Value) -> Self {
        Validator { root }
    }

    /// Follows a local `$ref` (`#/$defs/name`).
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
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
    pub fn errors(&self, v: &Value) -> Vec<String> {
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

/// What the schema of `kind` says is wrong with `v`.
pub fn schema_errors(kind: Kind, v: &Value) -> Vec<String> {
    Validator::new(kind.schema()).errors(v)
}
