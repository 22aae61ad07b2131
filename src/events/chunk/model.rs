//! The chunk's shape: owned ([`Chunk`], what a producer builds and serde
//! reads) and borrowed ([`ChunkRef`], what the worker reads in place), and
//! the conversions between them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::options::BatchOptions;

/// One chunk of a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// The batch (campaign) id: `[A-Za-z0-9._-]{1,128}`.
    pub batch: String,
    /// Sequence number, 0-based.
    pub seq: u32,
    /// Whether this is the last chunk of the batch.
    pub last: bool,
    /// The message template shared by the batch.
    pub template: Template,
    /// The batch's options (the same in every chunk; none by default).
    #[serde(default, skip_serializing_if = "BatchOptions::is_empty")]
    pub options: BatchOptions,
    /// The recipients.
    pub recipients: Vec<Recipient>,
}

/// A message template in the provider's shape, with `#{name}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// `SMS`, `LMS`, `ATA` (AlimTalk) or `CTA`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The sender number.
    pub from: String,
    /// The text, with `#{name}` placeholders filled from each recipient's vars.
    pub text: String,
    /// Kakao options, required for `ATA`/`CTA`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kakao_options: Option<KakaoTemplate>,
}

/// The Kakao part of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KakaoTemplate {
    /// Kakao channel id.
    pub pf_id: String,
    /// Approved template id.
    pub template_id: String,
}

/// One recipient and its template variables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipient {
    /// The phone number.
    pub to: String,
    /// Values for the template's placeholders, by name (without `#{}`).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
}

/// A chunk read in place: every string borrowed from the encoded bytes, and
/// no allocation per recipient (but one for a recipient with several
/// variables). [`ChunkRef::decode`] reads one; [`Chunk::view`] borrows an
/// owned one the same way. Same checks, same digest as [`Chunk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRef<'a> {
    /// The batch (campaign) id.
    pub batch: &'a str,
    /// Sequence number, 0-based.
    pub seq: u32,
    /// Whether this is the last chunk of the batch.
    pub last: bool,
    /// The message template shared by the batch.
    pub template: TemplateRef<'a>,
    /// The batch's options (owned: small, and usually empty).
    pub options: BatchOptions,
    /// The recipients.
    pub recipients: Vec<RecipientRef<'a>>,
}

/// A [`Template`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateRef<'a> {
    /// `SMS`, `LMS`, `ATA` or `CTA`.
    pub kind: &'a str,
    /// The sender number.
    pub from: &'a str,
    /// The text, with `#{name}` placeholders.
    pub text: &'a str,
    /// Kakao options, required for `ATA`/`CTA`.
    pub kakao_options: Option<KakaoRef<'a>>,
}

/// A [`KakaoTemplate`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KakaoRef<'a> {
    /// Kakao channel id.
    pub pf_id: &'a str,
    /// Approved template id.
    pub template_id: &'a str,
}

/// A [`Recipient`], borrowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientRef<'a> {
    /// The phone number.
    pub to: &'a str,
    /// Its template variables.
    pub vars: VarsRef<'a>,
}

/// A recipient's variables, borrowed: in name order, each name once, as in
/// the `BTreeMap` of a [`Recipient`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VarsRef<'a>(Vars<'a>);

#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum Vars<'a> {
    #[default]
    Empty,
    One((&'a str, &'a str)),
    Many(Vec<(&'a str, &'a str)>),
}

impl<'a> VarsRef<'a> {
    /// From `(name, value)` pairs in any order: as in a `BTreeMap` built
    /// from them, a repeated name keeps its last value.
    pub(crate) fn from_pairs(mut pairs: Vec<(&'a str, &'a str)>) -> Self {
        if pairs.len() > 1 {
            // Stable: of equal names, the last stays last.
            pairs.sort_by(|a, b| a.0.cmp(b.0));
            pairs.dedup_by(|later, earlier| {
                let same = later.0 == earlier.0;
                if same {
                    earlier.1 = later.1;
                }
                same
            });
        }
        match pairs.len() {
            0 => VarsRef(Vars::Empty),
            1 => VarsRef(Vars::One(pairs[0])),
            _ => VarsRef(Vars::Many(pairs)),
        }
    }

    /// One variable.
    pub fn one(name: &'a str, value: &'a str) -> Self {
        VarsRef(Vars::One((name, value)))
    }

    /// The `(name, value)` pairs, in name order.
    pub fn as_slice(&self) -> &[(&'a str, &'a str)] {
        match &self.0 {
            Vars::Empty => &[],
            Vars::One(pair) => std::slice::from_ref(pair),
            Vars::Many(pairs) => pairs,
        }
    }

    /// The value of variable `name`.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        let pairs = self.as_slice();
        if pairs.len() <= 4 {
            return pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        }
        pairs
            .binary_search_by(|(n, _)| (*n).cmp(name))
            .ok()
            .map(|i| pairs[i].1)
    }

    /// How many variables.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

/// A recipient as the worker reads it: owned ([`Recipient`]) or borrowed
/// ([`RecipientRef`]).
pub trait RecipientFields {
    /// The phone number.
    fn to(&self) -> &str;
    /// The value of variable `name`.
    fn var(&self, name: &str) -> Option<&str>;
    /// How many variables.
    fn var_count(&self) -> usize;
    /// The variables, in name order, each name once.
    fn vars(&self) -> impl Iterator<Item = (&str, &str)>;
}

impl RecipientFields for Recipient {
    fn to(&self) -> &str {
        &self.to
    }
    fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
    fn var_count(&self) -> usize {
        self.vars.len()
    }
    fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }
}

impl RecipientFields for RecipientRef<'_> {
    fn to(&self) -> &str {
        self.to
    }
    fn var(&self, name: &str) -> Option<&str> {
        self.vars.get(name)
    }
    fn var_count(&self) -> usize {
        self.vars.len()
    }
    fn vars(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.as_slice().iter().copied()
    }
}

impl Template {
    /// The placeholder names used in the text, in order of first use.
    pub fn placeholders(&self) -> Vec<String> {
        placeholders(&self.text)
    }

    /// The template, borrowed.
    pub fn view(&self) -> TemplateRef<'_> {
        TemplateRef {
            kind: &self.kind,
            from: &self.from,
            text: &self.text,
            kakao_options: self.kakao_options.as_ref().map(|k| KakaoRef {
                pf_id: &k.pf_id,
                template_id: &k.template_id,
            }),
        }
    }

    /// The text with `#{name}` replaced by `vars[name]`.
    pub fn render(&self, vars: &BTreeMap<String, String>) -> String {
        let mut out = String::with_capacity(self.text.len() + 16);
        let mut rest = self.text.as_str();
        while let Some(start) = rest.find("#{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            match after.find('}') {
                Some(end) => {
                    let name = &after[..end];
                    match vars.get(name) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&rest[start..start + 2 + end + 1]),
                    }
                    rest = &after[end + 1..];
                }
                None => {
                    out.push_str(&rest[start..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        out
    }
}

impl TemplateRef<'_> {
    /// The template, owned.
    pub(crate) fn to_template(self) -> Template {
        Template {
            kind: self.kind.to_string(),
            from: self.from.to_string(),
            text: self.text.to_string(),
            kakao_options: self.kakao_options.map(|k| KakaoTemplate {
                pf_id: k.pf_id.to_string(),
                template_id: k.template_id.to_string(),
            }),
        }
    }
}

/// Names of the `#{name}` placeholders in a text.
pub fn placeholders(text: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("#{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        rest = &after[end + 1..];
    }
    names
}

impl Chunk {
    /// The chunk's fields, for the checks and the canonical encoding.
    pub(super) fn parts(&self) -> Parts<'_, Recipient> {
        Parts {
            batch: &self.batch,
            seq: self.seq,
            last: self.last,
            template: self.template.view(),
            options: &self.options,
            recipients: &self.recipients,
        }
    }

    /// The chunk, borrowed.
    pub fn view(&self) -> ChunkRef<'_> {
        ChunkRef {
            batch: &self.batch,
            seq: self.seq,
            last: self.last,
            template: self.template.view(),
            options: self.options.clone(),
            recipients: self
                .recipients
                .iter()
                .map(|r| RecipientRef {
                    to: &r.to,
                    vars: match r.vars.len() {
                        0 => VarsRef::default(),
                        1 => r
                            .vars
                            .iter()
                            .next()
                            .map(|(n, v)| VarsRef::one(n, v))
                            .unwrap_or_default(),
                        _ => VarsRef(Vars::Many(
                            r.vars
                                .iter()
                                .map(|(n, v)| (n.as_str(), v.as_str()))
                                .collect(),
                        )),
                    },
                })
                .collect(),
        }
    }
}

impl<'a> ChunkRef<'a> {
    /// The chunk's fields, for the checks and the canonical encoding.
    pub(super) fn parts(&self) -> Parts<'_, RecipientRef<'a>> {
        Parts {
            batch: self.batch,
            seq: self.seq,
            last: self.last,
            template: self.template,
            options: &self.options,
            recipients: &self.recipients,
        }
    }

    /// The chunk without the recipients at `positions` (0-based): those the
    /// batch-wide dedupe found the batch already had.
    pub fn without(&self, positions: &[u32]) -> ChunkRef<'a> {
        let drop: std::collections::HashSet<u32> = positions.iter().copied().collect();
        ChunkRef {
            recipients: self
                .recipients
                .iter()
                .enumerate()
                .filter(|(i, _)| !drop.contains(&(*i as u32)))
                .map(|(_, r)| r.clone())
                .collect(),
            ..self.clone()
        }
    }

    /// The chunk, owned.
    pub(crate) fn to_chunk(&self) -> Chunk {
        Chunk {
            batch: self.batch.to_string(),
            seq: self.seq,
            last: self.last,
            template: self.template.to_template(),
            options: self.options.clone(),
            recipients: self
                .recipients
                .iter()
                .map(|r| {
                    // Inserted one by one: collecting into a `BTreeMap`
                    // buffers and sorts first, which costs more than the
                    // one or two variables a recipient usually has.
                    let mut vars = BTreeMap::new();
                    for (n, v) in r.vars.as_slice() {
                        vars.insert(n.to_string(), v.to_string());
                    }
                    Recipient {
                        to: r.to.to_string(),
                        vars,
                    }
                })
                .collect(),
        }
    }
}

/// A chunk's fields as the checks and the canonical encoding read them: one
/// shape for owned and borrowed chunks, without building a [`ChunkRef`] of an
/// owned chunk (which would allocate).
pub(super) struct Parts<'c, R> {
    pub(super) batch: &'c str,
    pub(super) seq: u32,
    pub(super) last: bool,
    pub(super) template: TemplateRef<'c>,
    pub(super) options: &'c BatchOptions,
    pub(super) recipients: &'c [R],
}
