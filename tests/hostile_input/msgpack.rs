//! A small MessagePack writer, so that tests can write what rmp-serde never
//! would: invalid UTF-8 in strings, lying lengths, NaN where an integer goes,
//! nesting deeper than any decoder should follow; and structure-aware
//! mutations of valid payloads.

use groupcast::events::Chunk;
use proptest::prelude::*;
use proptest::sample::Index;

use crate::common::*;

#[derive(Debug, Clone)]
pub enum Mp {
    Nil,
    Bool(bool),
    Int(i64),
    UInt(u64),
    F64(f64),
    /// A `str` with any bytes (invalid UTF-8 included).
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Arr(Vec<Mp>),
    Map(Vec<(Mp, Mp)>),
    /// Bytes written as they are (a lying header, garbage).
    Raw(Vec<u8>),
}

pub fn s(text: &str) -> Mp {
    Mp::Str(text.as_bytes().to_vec())
}

pub fn len_header(out: &mut Vec<u8>, n: usize, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8) {
    match fix {
        Some((base, max)) if n < max => out.push(base | n as u8),
        _ => match m8 {
            Some(m) if n < 256 => out.extend([m, n as u8]),
            _ if n < 65_536 => {
                out.push(m16);
                out.extend((n as u16).to_be_bytes());
            }
            _ => {
                out.push(m16 + 1);
                out.extend((n as u32).to_be_bytes());
            }
        },
    }
}

pub fn enc(v: &Mp, out: &mut Vec<u8>) {
    match v {
        Mp::Nil => out.push(0xc0),
        Mp::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mp::Int(i) => {
            out.push(0xd3);
            out.extend(i.to_be_bytes());
        }
        Mp::UInt(u) => {
            if *u < 128 {
                out.push(*u as u8);
            } else {
                out.push(0xcf);
                out.extend(u.to_be_bytes());
            }
        }
        Mp::F64(f) => {
            out.push(0xcb);
            out.extend(f.to_be_bytes());
        }
        Mp::Str(b) => {
            len_header(out, b.len(), Some((0xa0, 32)), Some(0xd9), 0xda);
            out.extend(b);
        }
        Mp::Bin(b) => {
            len_header(out, b.len(), None, Some(0xc4), 0xc5);
            out.extend(b);
        }
        Mp::Arr(items) => {
            len_header(out, items.len(), Some((0x90, 16)), None, 0xdc);
            for i in items {
                enc(i, out);
            }
        }
        Mp::Map(entries) => {
            len_header(out, entries.len(), Some((0x80, 16)), None, 0xde);
            for (k, v) in entries {
                enc(k, out);
                enc(v, out);
            }
        }
        Mp::Raw(b) => out.extend(b),
    }
}

pub fn bytes(v: &Mp) -> Vec<u8> {
    let mut out = Vec::new();
    enc(v, &mut out);
    out
}

pub fn chunk_mp(c: &Chunk) -> Mp {
    let mut template = vec![
        (s("type"), s(&c.template.kind)),
        (s("from"), s(&c.template.from)),
        (s("text"), s(&c.template.text)),
    ];
    if let Some(k) = &c.template.kakao_options {
        template.push((
            s("kakao_options"),
            Mp::Map(vec![
                (s("pf_id"), s(&k.pf_id)),
                (s("template_id"), s(&k.template_id)),
            ]),
        ));
    }
    let recipients = c
        .recipients
        .iter()
        .map(|r| {
            Mp::Map(vec![
                (s("to"), s(&r.to)),
                (
                    s("vars"),
                    Mp::Map(r.vars.iter().map(|(k, v)| (s(k), s(v))).collect()),
                ),
            ])
        })
        .collect();
    Mp::Map(vec![
        (s("batch"), s(&c.batch)),
        (s("seq"), Mp::UInt(u64::from(c.seq))),
        (s("last"), Mp::Bool(c.last)),
        (s("template"), Mp::Map(template)),
        (s("recipients"), Mp::Arr(recipients)),
    ])
}

pub fn good_chunk(batch: &str, seq: u32, n: usize) -> Chunk {
    Chunk {
        batch: batch.into(),
        seq,
        last: true,
        template: template(),
        options: Default::default(),
        recipients: recipients(seq + 50, n),
    }
}

pub fn nested_arrays(depth: usize) -> Mp {
    // Written flat (no recursion here either): `depth` one-element arrays.
    let mut raw = vec![0x91; depth];
    raw.push(0xc0);
    Mp::Raw(raw)
}

pub fn nested_maps(depth: usize) -> Mp {
    let mut raw = Vec::with_capacity(depth * 3 + 1);
    for _ in 0..depth {
        raw.extend([0x81, 0xa1, b'x']);
    }
    raw.push(0xc0);
    Mp::Raw(raw)
}

/// Values that do not belong anywhere in a chunk, or are too much of one.
pub fn hostile_value() -> impl Strategy<Value = Mp> {
    prop_oneof![
        Just(Mp::Nil),
        any::<bool>().prop_map(Mp::Bool),
        any::<i64>().prop_map(Mp::Int),
        Just(Mp::Int(-1)),
        any::<u64>().prop_map(Mp::UInt),
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-1.0),
            any::<f64>()
        ]
        .prop_map(Mp::F64),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Str),
        // Invalid UTF-8, for sure.
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(|mut b| {
            b.insert(0, 0xff);
            Mp::Str(b)
        }),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Mp::Bin),
        (1usize..300_000).prop_map(|n| Mp::Str(vec![b'7'; n])),
        (1usize..50_000).prop_map(nested_arrays),
        (1usize..50_000).prop_map(nested_maps),
        // Headers that promise more than there is.
        Just(Mp::Raw(vec![0xdd, 0xff, 0xff, 0xff, 0xff])),
        Just(Mp::Raw(vec![0xdf, 0xff, 0xff, 0xff, 0xff])),
        Just(Mp::Raw(vec![0xdb, 0xff, 0xff, 0xff, 0xff, b'a'])),
        Just(Mp::Raw(vec![0xc6, 0x7f, 0xff, 0xff, 0xff])),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Mp::Raw),
        Just(Mp::Arr(Vec::new())),
        Just(Mp::Map(Vec::new())),
    ]
}

/// Every node of a value, as a path of child indices (map entries by index).
pub fn paths(v: &Mp, prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(prefix.clone());
    let children: Vec<&Mp> = match v {
        Mp::Arr(items) => items.iter().take(3).collect(),
        Mp::Map(entries) => entries.iter().map(|(_, v)| v).collect(),
        _ => return,
    };
    for (i, c) in children.into_iter().enumerate() {
        prefix.push(i);
        paths(c, prefix, out);
        prefix.pop();
    }
}

pub fn node<'a>(v: &'a mut Mp, path: &[usize]) -> &'a mut Mp {
    let Some((first, rest)) = path.split_first() else {
        return v;
    };
    match v {
        Mp::Arr(items) => node(&mut items[*first], rest),
        Mp::Map(entries) => node(&mut entries[*first].1, rest),
        _ => v,
    }
}

#[derive(Debug, Clone)]
pub enum Mutation {
    Replace(Index, Mp),
    /// Removes a map entry, or an array item.
    Remove(Index, Index),
    /// Adds an entry with an unknown (or hostile) key.
    Add(Index, Mp, Mp),
    /// Repeats a map entry (the later one with a hostile value).
    Duplicate(Index, Index, Mp),
    Truncate(Index),
    FlipByte(Index, u8),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), hostile_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Mutation::Remove(i, j)),
        1 => (any::<Index>(), hostile_value(), hostile_value()).prop_map(|(i, k, v)| Mutation::Add(i, k, v)),
        1 => (any::<Index>(), any::<Index>(), hostile_value()).prop_map(|(i, j, v)| Mutation::Duplicate(i, j, v)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipByte(i, b)),
    ]
}

pub fn containers(v: &Mp) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    let mut v = v.clone();
    all.into_iter()
        .filter(|p| matches!(node(&mut v, p), Mp::Map(_) | Mp::Arr(_)))
        .collect()
}

/// Applies mutations to a valid payload and encodes it.
pub fn mutate(valid: &Mp, mutations: &[Mutation]) -> Vec<u8> {
    let mut v = valid.clone();
    let mut tail: Vec<Mutation> = Vec::new();
    for m in mutations {
        let mut all = Vec::new();
        paths(&v, &mut Vec::new(), &mut all);
        let boxes = containers(&v);
        if boxes.is_empty() && !matches!(m, Mutation::Replace(..)) {
            tail.push(m.clone());
            continue;
        }
        match m {
            Mutation::Replace(i, new) => *node(&mut v, &all[i.index(all.len())]) = new.clone(),
            Mutation::Remove(i, j) => match node(&mut v, &boxes[i.index(boxes.len())]) {
                Mp::Map(e) if !e.is_empty() => {
                    let k = j.index(e.len());
                    e.remove(k);
                }
                Mp::Arr(a) if !a.is_empty() => {
                    let k = j.index(a.len());
                    a.remove(k);
                }
                _ => {}
            },
            Mutation::Add(i, k, val) => {
                if let Mp::Map(e) = node(&mut v, &boxes[i.index(boxes.len())]) {
                    e.push((k.clone(), val.clone()));
                }
            }
            Mutation::Duplicate(i, j, val) => {
                if let Mp::Map(e) = node(&mut v, &boxes[i.index(boxes.len())]) {
                    if !e.is_empty() {
                        let key = e[j.index(e.len())].0.clone();
                        e.push((key, val.clone()));
                    }
                }
            }
            other => tail.push(other.clone()),
        }
    }
    let mut out = bytes(&v);
    for m in tail {
        match m {
            Mutation::Truncate(i) => out.truncate(i.index(out.len() + 1)),
            Mutation::FlipByte(i, b) if !out.is_empty() => {
                let k = i.index(out.len());
                out[k] ^= b | 1;
            }
            _ => {}
        }
    }
    out
}

/// A valid work item, to mutate.
pub fn valid_work_item() -> Mp {
    Mp::Map(vec![
        (s("batch"), s("b-1")),
        (s("gen"), Mp::UInt(0)),
        (s("seq"), Mp::UInt(4)),
        (s("group_id"), s("G1")),
        (s("attempt"), Mp::UInt(2)),
    ])
}
