//! The worker's CPU per recipient, piece by piece, without Redis or HTTP.
//!
//! `cargo bench --bench hot_path` (release). Decodes, validates and digests a
//! 5,000-recipient chunk (W1's size), writes the 10,000-message add request
//! body and reads a 10,000-result answer (the mock's format): read in place
//! (`ChunkRef`), owned (`Chunk`), and for comparison the earlier way (`old:`
//! lines).
//! Prints nanoseconds per recipient, the best of a few rounds (the machine is
//! shared: the best is the least disturbed).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use groupcast::events::chunk::{ChunkRef, KakaoTemplate};
use groupcast::events::{Chunk, Recipient, Template};
use groupcast::provider::model::{AddMessagesRequest, AddMessagesResponse, AddSummary};
use groupcast::provider::{add_body, Registration};
use sha2::{Digest, Sha256};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A chunk as `groupcast bench` produces it (optionally AlimTalk).
fn chunk(n: usize, kakao: bool) -> Chunk {
    Chunk {
        batch: "bench-0".into(),
        seq: 17,
        last: false,
        template: Template {
            kind: if kakao { "ATA" } else { "SMS" }.into(),
            from: "0212345678".into(),
            text: "#{name}, your order shipped".into(),
            kakao_options: kakao.then(|| KakaoTemplate {
                pf_id: "KA01PF0000000000000000000000".into(),
                template_id: "KA01TP0000000000000000000000".into(),
            }),
        },
        options: Default::default(),
        recipients: (0..n)
            .map(|i| Recipient {
                to: format!("010{i:08}"),
                vars: BTreeMap::from([("name".to_string(), format!("c{i}"))]),
            })
            .collect(),
    }
}

/// An add answer as the mock writes it: every message registered.
fn answer(n: usize) -> Vec<u8> {
    let mut out = String::from(
        r#"{"groupId":"G4V20260101000000ABCDEFGHIJKLMN","errorCount":0,"resultList":["#,
    );
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"to":"010{i:08}","messageId":"M4V7f3a000001{i:09}","statusCode":"2000","statusMessage":"Registered"}}"#
        ));
    }
    out.push_str("]}");
    out.into_bytes()
}

/// Runs `f` for about `budget`, in rounds; the best round's ns per unit.
fn measure<T>(name: &str, units: usize, mut f: impl FnMut() -> T) {
    let budget = Duration::from_millis(
        std::env::var("BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    );
    // Warm up (and size the rounds).
    let t = Instant::now();
    black_box(f());
    let once = t.elapsed().max(Duration::from_micros(1));
    let per_round = ((budget / 5).as_nanos() / once.as_nanos()).max(1) as u32;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..per_round {
            black_box(f());
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(per_round) / units as f64;
        best = best.min(ns);
    }
    println!("{name:<44} {best:>8.1} ns/recipient");
}

fn main() {
    for kakao in [false, true] {
        let label = if kakao { "ATA" } else { "SMS" };
        println!("-- {label} template");
        let c = chunk(5_000, kakao);
        let bytes = c.encode();
        let n = c.recipients.len();
        measure("encode (producer)", n, || c.encode());
        measure("decode 5,000 in place (ChunkRef)", n, || {
            ChunkRef::decode(&bytes).unwrap()
        });
        measure("decode 5,000 (Chunk)", n, || Chunk::decode(&bytes).unwrap());
        measure("old: decode (rmp-serde)", n, || {
            rmp_serde::from_slice::<Chunk>(&bytes).unwrap()
        });
        let view = ChunkRef::decode(&bytes).unwrap();
        measure("validate (ChunkRef)", n, || view.validate().unwrap());
        measure("validate (Chunk)", n, || c.validate().unwrap());
        measure("digest (ChunkRef)", n, || view.digest());
        measure("digest (Chunk)", n, || c.digest());
        measure("old: digest (sha256 of encode)", n, || {
            hex::encode(&Sha256::digest(c.encode())[..8])
        });

        let big = chunk(10_000, kakao);
        let m = big.recipients.len();
        let big_bytes = big.encode();
        let big_view = ChunkRef::decode(&big_bytes).unwrap();
        measure("add body 10,000 (ChunkRef)", m, || {
            add_body::add_body(&big_view.template, &big_view.recipients)
        });
        measure("add body 10,000 (Chunk)", m, || {
            add_body::add_body(&big.template.view(), &big.recipients)
        });
        measure("old: messages + serde_json body", m, || {
            let msgs = add_body::messages(&big);
            serde_json::to_vec(&AddMessagesRequest { messages: &msgs }).unwrap()
        });
    }
    println!("-- add answer");
    let a = answer(10_000);
    measure("parse 10,000 results (AddSummary)", 10_000, || {
        AddSummary::from_json(&a).unwrap()
    });
    measure("old: AddMessagesResponse + Registration", 10_000, || {
        let r: AddMessagesResponse = serde_json::from_slice(&a).unwrap();
        r.result_list
            .iter()
            .map(Registration::from_result)
            .collect::<Vec<_>>()
    });

    println!("-- a W1 chunk, end to end (decode, validate, digest, body, answer)");
    let c = chunk(5_000, false);
    let bytes = c.encode();
    let a = answer(5_000);
    measure("worker path, in place (ChunkRef)", 5_000, || {
        let c = ChunkRef::decode(&bytes).unwrap();
        c.validate().unwrap();
        let d = c.digest();
        let body = add_body::add_body(&c.template, &c.recipients);
        let s = AddSummary::from_json(&a).unwrap();
        (d, body.len(), s.registered)
    });
    measure("worker path (Chunk)", 5_000, || {
        let c = Chunk::decode(&bytes).unwrap();
        c.validate().unwrap();
        let d = c.digest();
        let body = add_body::add_body(&c.template.view(), &c.recipients);
        let s = AddSummary::from_json(&a).unwrap();
        (d, body.len(), s.registered)
    });
    measure("old: worker path", 5_000, || {
        let c: Chunk = rmp_serde::from_slice(&bytes).unwrap();
        c.validate().unwrap();
        let d = hex::encode(&Sha256::digest(c.encode())[..8]);
        let msgs = add_body::messages(&c);
        let body = serde_json::to_vec(&AddMessagesRequest { messages: &msgs }).unwrap();
        let r: AddMessagesResponse = serde_json::from_slice(&a).unwrap();
        let regs: Vec<Registration> = r
            .result_list
            .iter()
            .map(Registration::from_result)
            .collect();
        (d, body.len(), regs.len())
    });
}
