//! The submit path: the CSV/JSONL reader and the template reader, fuzzed.

use std::path::Path;

use groupcast::cli::CliError;
use groupcast::events::chunk::MAX_VAR_CHARS;
use groupcast::events::{Recipient, Template};
use proptest::prelude::*;

use crate::{tmp_file, MAX_MESSAGE};

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
