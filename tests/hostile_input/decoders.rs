//! Every decoder of bytes from the streams, fuzzed: arbitrary bytes and
//! mutations of valid payloads.

use groupcast::events::chunk::{
    MAX_CHUNK_BYTES, MAX_CHUNK_RECIPIENTS, MAX_TEXT_CHARS, MAX_VAR_CHARS,
};
use groupcast::events::{decode_payload, Chunk, Event, Recorded};
use groupcast::worker::ops::WorkItem;
use proptest::prelude::*;
use proptest::sample::Index;

use crate::msgpack::*;
use crate::MAX_MESSAGE;

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
