//! The chunk's model, checks and codec against each other and against
//! rmp-serde.

use std::collections::BTreeMap;

use sha2::Digest;

use super::codec::{self, decode_ref, encode_chunk};
use super::*;

fn template(text: &str) -> Template {
    Template {
        kind: "SMS".into(),
        from: "0212345678".into(),
        text: text.into(),
        kakao_options: None,
    }
}

#[test]
fn renders_placeholders() {
    let t = template("Hi #{name}, code #{code}. #{missing} #{");
    let vars = BTreeMap::from([
        ("name".to_string(), "Kim".to_string()),
        ("code".to_string(), "42".to_string()),
    ]);
    assert_eq!(t.render(&vars), "Hi Kim, code 42. #{missing} #{");
    assert_eq!(t.placeholders(), vec!["name", "code", "missing"]);
}

#[test]
fn validation_names_the_problem() {
    let mut c = Chunk {
        batch: "b1".into(),
        seq: 0,
        last: true,
        template: template("Hi #{name}"),
        options: Default::default(),
        recipients: vec![Recipient {
            to: "01012345678".into(),
            vars: BTreeMap::new(),
        }],
    };
    assert_eq!(
        c.validate(),
        Err(ChunkError::MissingVariable {
            index: 0,
            name: "name".into()
        })
    );
    c.recipients[0].vars.insert("name".into(), "Lee".into());
    assert_eq!(c.validate(), Ok(()));
    // A repeated number is the batch-wide dedupe's business, not an error.
    c.recipients.push(c.recipients[0].clone());
    assert_eq!(c.validate(), Ok(()));
    c.batch = "a{b}".into();
    assert!(matches!(c.validate(), Err(ChunkError::BatchId(_))));
}

fn sample(n: usize, kakao: bool) -> Chunk {
    Chunk {
        batch: "camp-1".into(),
        seq: 7,
        last: false,
        template: Template {
            kind: if kakao { "ATA" } else { "SMS" }.into(),
            from: "0212345678".into(),
            text: "Hi #{name}, \"#{code}\"\n".into(),
            kakao_options: kakao.then(|| KakaoTemplate {
                pf_id: "pf".into(),
                template_id: "tp".into(),
            }),
        },
        options: Default::default(),
        recipients: (0..n)
            .map(|i| Recipient {
                to: format!("010{i:08}"),
                vars: BTreeMap::from([
                    ("name".to_string(), format!("c{i}")),
                    ("code".to_string(), "é".repeat(i % 40)),
                ]),
            })
            .collect(),
    }
}

fn encode_into(c: &Chunk, out: &mut Vec<u8>) {
    encode_chunk(&c.parts(), out);
}

/// What rmp-serde alone makes of `bytes`: the value, or the message.
fn reference(bytes: &[u8]) -> Result<Chunk, String> {
    crate::events::decode_payload::<Chunk>("chunk", bytes).map_err(|e| e.to_string())
}

#[test]
fn canonical_encoding_is_rmp_serdes() {
    for (n, kakao) in [
        (0, false),
        (1, true),
        (15, false),
        (16, true),
        (70_000, false),
    ] {
        let mut c = sample(n, kakao);
        for (seq, text_len) in [(0, 0), (127, 31), (128, 32), (255, 255), (256, 256)]
            .into_iter()
            .chain([(65_535, 65_535), (65_536, 65_536), (u32::MAX, 70_000)])
        {
            if n > 16 && seq > 0 {
                break;
            }
            c.seq = seq;
            c.template.text = "x".repeat(text_len);
            c.last = seq % 2 == 0;
            let mut mine = Vec::new();
            encode_into(&c, &mut mine);
            let theirs = rmp_serde::to_vec_named(&c).unwrap();
            assert!(mine == theirs, "n={n} seq={seq} text={text_len}");
            assert_eq!(c.digest(), hex::encode(&sha2::Sha256::digest(&theirs)[..8]));
            assert_eq!(Chunk::decode(&mine).unwrap(), c);
            assert!(decode_ref(&mine).is_some());
        }
    }
    let many_vars = Recipient {
        to: "1".into(),
        vars: (0..20).map(|i| (format!("v{i}"), "x".into())).collect(),
    };
    let mut c = sample(1, false);
    c.recipients.push(many_vars);
    let mut mine = Vec::new();
    encode_into(&c, &mut mine);
    assert_eq!(mine, rmp_serde::to_vec_named(&c).unwrap());
}

/// A chunk of one recipient, without variables.
fn one_recipient() -> Chunk {
    Chunk {
        batch: "b1".into(),
        seq: 3,
        last: false,
        template: template("x"),
        options: Default::default(),
        recipients: vec![Recipient {
            to: "01012345678".into(),
            vars: BTreeMap::new(),
        }],
    }
}

#[test]
fn the_digest_is_unchanged() {
    // Computed by the earlier digest (sha256 of rmp_serde::to_vec_named):
    // stored digests must keep matching their chunks.
    let c = one_recipient();
    let expected = hex::encode(&sha2::Sha256::digest(rmp_serde::to_vec_named(&c).unwrap())[..8]);
    assert_eq!(c.digest(), expected);
    assert_eq!(sample(3, true).digest(), sample(3, true).digest());
    assert_ne!(sample(3, true).digest(), sample(3, false).digest());
}

#[test]
fn decoding_agrees_with_rmp_serde_on_any_shape() {
    let c = sample(3, true);
    let canonical = c.encode();
    let mut cases: Vec<Vec<u8>> = vec![canonical.clone()];
    // Fields in another order (a JSON value's maps are sorted by name).
    let v = serde_json::to_value(&c).unwrap();
    cases.push(rmp_serde::to_vec_named(&v).unwrap());
    // Positional (rmp_serde::to_vec) encoding.
    cases.push(rmp_serde::to_vec(&c).unwrap());
    // An unknown field, a repeated field, a missing `vars`, a nil
    // kakao_options, a missing field.
    let mut obj = v.as_object().unwrap().clone();
    obj.insert("extra".into(), serde_json::json!([1, "x"]));
    cases.push(rmp_serde::to_vec_named(&obj).unwrap());
    let mut repeated = canonical.clone();
    repeated[0] = 0x86;
    repeated.extend(rmp_serde::to_vec(&"seq").unwrap());
    repeated.push(0x05);
    cases.push(repeated);
    let mut o = obj.clone();
    o.remove("extra");
    o["recipients"][0].as_object_mut().unwrap().remove("vars");
    o["template"]["kakao_options"] = serde_json::Value::Null;
    cases.push(rmp_serde::to_vec_named(&o).unwrap());
    o["recipients"][1]["vars"] = serde_json::Value::Null;
    cases.push(rmp_serde::to_vec_named(&o).unwrap());
    o.remove("last");
    cases.push(rmp_serde::to_vec_named(&o).unwrap());
    // Signed and wide integers, a negative one, a `bin` batch id, bad
    // UTF-8, and every truncation of the canonical bytes.
    let seq_at = canonical.windows(4).position(|w| w == b"\xa3seq").unwrap() + 4;
    for int in [
        &[0xd3, 0, 0, 0, 0, 0, 0, 0, 5][..],
        &[0xcf, 0, 0, 0, 0, 0, 0, 0, 5],
        &[0xff],
        &[0xce, 0xff, 0xff, 0xff, 0xff],
    ] {
        let mut b = canonical[..seq_at].to_vec();
        b.extend_from_slice(int);
        b.extend_from_slice(&canonical[seq_at + 1..]);
        cases.push(b);
    }
    let batch_at = canonical
        .windows(6)
        .position(|w| w == b"\xa5batch")
        .unwrap()
        + 6;
    let mut bin = canonical[..batch_at].to_vec();
    bin.extend_from_slice(&[0xc4, 6]);
    bin.extend_from_slice(&canonical[batch_at + 1..]);
    cases.push(bin);
    let mut bad = canonical.clone();
    bad[batch_at + 1] = 0xff;
    cases.push(bad);
    for cut in 0..canonical.len() {
        cases.push(canonical[..cut].to_vec());
    }
    cases.push([canonical.as_slice(), b"trailing"].concat());
    // Variables out of order, repeated (the last value wins), none.
    for vars in [
        &[("b", "1"), ("a", "2"), ("b", "3")][..],
        &[("x", "1"), ("x", "2")],
        &[("b", "1"), ("a", "2")],
        &[],
        &[("only", "1")],
    ] {
        let mut b = Vec::new();
        codec::map(&mut b, 5);
        for (k, v) in [("batch", "b"), ("template", ""), ("seq", ""), ("last", "")] {
            codec::str(&mut b, k);
            match k {
                "batch" => codec::str(&mut b, v),
                "seq" => codec::uint(&mut b, 9),
                "last" => b.push(0xc3),
                _ => b.extend(rmp_serde::to_vec_named(&c.template).unwrap()),
            }
        }
        codec::str(&mut b, "recipients");
        b.push(0x92);
        for to in ["1", "2"] {
            codec::map(&mut b, 2);
            codec::str(&mut b, "vars");
            codec::map(&mut b, vars.len());
            for (k, v) in vars {
                codec::str(&mut b, k);
                codec::str(&mut b, v);
            }
            codec::str(&mut b, "to");
            codec::str(&mut b, to);
        }
        cases.push(b);
    }
    let mut borrowed = 0;
    for (i, b) in cases.iter().enumerate() {
        let got = Chunk::decode(b).map_err(|e| e.to_string());
        assert_eq!(got, reference(b), "case {i}");
        // Any shape: read in place when it can be, else decoded into the
        // fallback; the same chunk, or the same error.
        let mut fallback = None;
        match ChunkRef::decode_any(b, &mut fallback) {
            Ok(r) => assert_eq!(Ok(r.to_chunk()), got, "case {i}"),
            Err(e) => assert_eq!(Err(e.to_string()), got, "case {i}"),
        }
        assert_eq!(
            fallback.is_some(),
            got.is_ok() && ChunkRef::decode(b).is_none(),
            "case {i}"
        );
        // The borrowed read agrees wherever it reads at all.
        if let Some(r) = ChunkRef::decode(b) {
            borrowed += 1;
            let owned = got.expect("what is read in place decodes");
            assert_eq!(r.to_chunk(), owned, "case {i}");
            assert_eq!(r, owned.view(), "case {i}");
            assert_eq!(r.digest(), owned.digest(), "case {i}");
            assert_eq!(r.validate(), owned.validate(), "case {i}");
        }
    }
    assert!(borrowed >= 8, "{borrowed}");
}

#[test]
fn borrowed_chunks_check_and_digest_like_owned_ones() {
    let mut chunks = vec![sample(20, true), sample(3, false)];
    let mut c = sample(3, false);
    c.recipients[2].to = c.recipients[0].to.clone();
    chunks.push(c);
    let mut c = sample(3, false);
    c.recipients[1].vars.remove("name");
    chunks.push(c);
    let mut c = sample(3, false);
    c.recipients[1]
        .vars
        .insert("z".into(), "é".repeat(MAX_VAR_CHARS + 1));
    chunks.push(c);
    let mut c = sample(3, true);
    c.template.kakao_options = None;
    chunks.push(c);
    let mut c = sample(3, true);
    c.template.text = "é".repeat(MAX_TEXT_CHARS + 1);
    chunks.push(c);
    let mut c = sample(3, true);
    c.recipients[0].vars = (0..9).map(|i| (format!("v{i}"), "x".into())).collect();
    chunks.push(c);
    let mut c = sample(3, true);
    c.template.from = "1".repeat(MAX_SENDER_CHARS + 1);
    chunks.push(c);
    let mut c = sample(3, true);
    if let Some(k) = &mut c.template.kakao_options {
        k.template_id = "t".repeat(MAX_KAKAO_ID_CHARS + 1);
    }
    chunks.push(c);
    for c in &chunks {
        let bytes = c.encode();
        let r = ChunkRef::decode(&bytes).expect("the usual shape");
        assert_eq!(r.validate(), c.validate());
        assert_eq!(r.digest(), c.digest());
        assert_eq!(r.to_chunk(), *c);
        for (a, b) in r.recipients.iter().zip(&c.recipients) {
            for name in ["name", "code", "v3", "v8", "z", "nope"] {
                assert_eq!(a.var(name), b.var(name));
            }
            assert!(a.vars().eq(b.vars()));
        }
    }
    assert!(ChunkRef::decode(&vec![0x80; MAX_CHUNK_BYTES + 1]).is_none());
    // Too large once encoded: the length is counted, not encoded.
    let mut c = sample(9_000, false);
    for r in &mut c.recipients {
        r.vars.insert("pad".into(), "x".repeat(MAX_VAR_CHARS));
    }
    let len = c.encode().len();
    assert!(len > MAX_CHUNK_BYTES);
    assert_eq!(c.validate(), Err(ChunkError::TooLarge(len)));
    assert_eq!(c.view().validate(), Err(ChunkError::TooLarge(len)));
}

#[test]
fn digest_ignores_encoding_but_not_content() {
    let c = one_recipient();
    let mut d = c.clone();
    assert_eq!(c.digest(), d.digest());
    d.recipients[0].to = "01012345679".into();
    assert_ne!(c.digest(), d.digest());
}

#[test]
fn chunks_encoded_or_counted_recipient_by_recipient_are_the_encoding() {
    for n in [1usize, 15, 16, 17, 300, 10_000] {
        for seq in [0u32, 127, 128, 70_000] {
            let recipients: Vec<Recipient> = (0..n)
                .map(|i| Recipient {
                    to: format!("010{i:08}"),
                    vars: (0..i % 3)
                        .map(|k| (format!("v{k}"), "x".repeat(i % 40)))
                        .collect(),
                })
                .collect();
            let c = Chunk {
                batch: "sizes".into(),
                seq,
                last: n % 2 == 0,
                template: template("Hi #{v0}"),
                options: if n % 2 == 1 {
                    scheduled()
                } else {
                    Default::default()
                },
                recipients,
            };
            let mut e = ChunkEncoder::new(&c.batch, c.seq, c.last, &c.template, &c.options, n, 0);
            for r in &c.recipients {
                e.push(r);
            }
            assert_eq!(e.finish(), Some(c.encode()), "{n} recipients, seq {seq}");
            let short =
                ChunkEncoder::new(&c.batch, c.seq, c.last, &c.template, &c.options, n + 1, 0);
            assert_eq!(short.finish(), None, "a recipient missing");
            let bytes: usize = c.recipients.iter().map(recipient_encoded_len).sum();
            assert_eq!(
                chunk_encoded_len(&c.batch, c.seq, c.last, &c.template, &c.options, n, bytes),
                c.encode().len(),
                "{n} recipients, seq {seq}"
            );
        }
    }
}

fn scheduled() -> crate::events::options::BatchOptions {
    use crate::events::options::{BatchOptions, Priority, QuietHours};
    BatchOptions {
        send_at: Some("2026-12-01T18:00:00+09:00".into()),
        priority: Some(Priority::Urgent),
        quiet_hours: Some(QuietHours {
            start: "21:00".into(),
            end: "08:00".into(),
            tz: "Asia/Seoul".into(),
        }),
        ad: None,
    }
}

/// An advertising batch's options travel in the fast codec as rmp-serde
/// writes them (with and without consent and pair), and its text is
/// checked by `validate`, so a worker refuses it before the provider.
#[test]
fn advertising_options_are_read_in_place_and_their_text_is_checked() {
    use crate::events::options::{AdOptions, AdTextError, BatchOptions};
    let mut c = one_recipient();
    for ad in [
        AdOptions::default(),
        AdOptions {
            night_consent: true,
            pair: Some("spring".into()),
        },
        AdOptions {
            night_consent: false,
            pair: Some("spring.night-consent".into()),
        },
    ] {
        c.options = BatchOptions {
            ad: Some(ad),
            ..scheduled()
        };
        c.template.text = "(광고) 봄 세일\n무료수신거부 080-123-4567".into();
        let bytes = c.encode();
        assert_eq!(bytes, rmp_serde::to_vec_named(&c).expect("rmp-serde"));
        let read = ChunkRef::decode(&bytes).expect("the usual shape, read in place");
        assert_eq!(read.options, c.options);
        assert_eq!(c.validate(), Ok(()));
        c.template.text = "봄 세일\n무료수신거부 080-123-4567".into();
        assert_eq!(c.validate(), Err(ChunkError::AdText(AdTextError::NoPrefix)));
        c.template.text = "(광고) 봄 세일".into();
        assert_eq!(c.validate(), Err(ChunkError::AdText(AdTextError::NoOptOut)));
    }
    // The same text is fine for a batch that is not advertising.
    c.options = scheduled();
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn options_are_read_in_place_and_are_part_of_the_digest() {
    let mut c = one_recipient();
    let plain = c.digest();
    c.options = scheduled();
    let bytes = c.encode();
    assert_eq!(bytes, rmp_serde::to_vec_named(&c).expect("rmp-serde"));
    let read = ChunkRef::decode(&bytes).expect("the usual shape, read in place");
    assert_eq!(read.options, c.options);
    assert_eq!(Chunk::decode(&bytes).expect("decode"), c);
    assert_ne!(c.digest(), plain, "options are content");
    assert_eq!(read.digest(), c.digest());
    // Only a priority: one member.
    c.options = crate::events::options::BatchOptions {
        priority: Some(crate::events::options::Priority::Bulk),
        ..Default::default()
    };
    let bytes = c.encode();
    assert_eq!(
        ChunkRef::decode(&bytes).expect("in place").options,
        c.options
    );
    // An unknown priority is not the usual shape: rmp-serde says why.
    let mut v: serde_json::Value = serde_json::to_value(&c).expect("json");
    v["options"]["priority"] = "asap".into();
    let odd = rmp_serde::to_vec_named(&v).expect("encode");
    assert!(ChunkRef::decode(&odd).is_none());
    let e = Chunk::decode(&odd).expect_err("unknown priority");
    assert!(e.to_string().contains("asap"), "{e}");
}

#[test]
fn invalid_options_fail_validation_with_the_reason() {
    let mut c = one_recipient();
    c.options.quiet_hours = Some(crate::events::options::QuietHours {
        start: "21:00".into(),
        end: "08:00".into(),
        tz: "Asia/Nowhere".into(),
    });
    let e = c.validate().expect_err("unknown zone");
    assert!(e.to_string().contains("IANA"), "{e}");
}
