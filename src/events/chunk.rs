//! The ingest format: one chunk of a batch, as an upstream producer writes it.
//!
//! An ingest stream entry has the fields `v` (`1`), `t` (`chunk`) and `d` (a
//! MessagePack map of [`Chunk`]). See `schemas/chunk.schema.json`.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{clip, QUOTE_MAX};
use crate::keys::{validate_batch_id, BatchIdError};

/// The most recipients one chunk may carry (one provider add request).
pub const MAX_CHUNK_RECIPIENTS: usize = 10_000;
/// The largest encoded chunk accepted, in bytes.
pub const MAX_CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// The longest template text, in characters.
pub const MAX_TEXT_CHARS: usize = 4_000;
/// The longest template variable value, in characters.
pub const MAX_VAR_CHARS: usize = 1_000;
/// The longest sender number (`from`), in characters.
pub const MAX_SENDER_CHARS: usize = 32;
/// The longest Kakao channel or template id, in characters.
pub const MAX_KAKAO_ID_CHARS: usize = 128;

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

/// Why a chunk is refused. Each one dead-letters the chunk.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChunkError {
    /// The batch id is unsafe.
    #[error("invalid batch id: {0}")]
    BatchId(#[from] BatchIdError),
    /// No recipients.
    #[error("chunk has no recipients")]
    Empty,
    /// Too many recipients.
    #[error("chunk has {0} recipients; at most {MAX_CHUNK_RECIPIENTS} are allowed")]
    TooManyRecipients(usize),
    /// The encoded entry is too large.
    #[error("chunk is {0} bytes; at most {MAX_CHUNK_BYTES} are allowed")]
    TooLarge(usize),
    /// Unknown message type.
    #[error("template type {:?} is not one of SMS, LMS, ATA, CTA", clip(.0, QUOTE_MAX))]
    BadType(String),
    /// AlimTalk without Kakao options.
    #[error("template type {0} needs kakao_options (pf_id, template_id)")]
    MissingKakao(String),
    /// Text too long.
    #[error("template text is {0} characters; at most {MAX_TEXT_CHARS} are allowed")]
    TextTooLong(usize),
    /// Sender missing.
    #[error("template has no `from` number")]
    NoSender,
    /// A template field other than the text is too long.
    #[error("template field `{field}` is {len} characters; at most {max} are allowed")]
    FieldTooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A recipient's number is empty or absurdly long.
    #[error("recipient {index} has an unusable number {:?}", clip(.to, QUOTE_MAX))]
    BadNumber {
        /// Position in the chunk.
        index: usize,
        /// The number as given.
        to: String,
    },
    /// The same number twice in one chunk.
    #[error("recipient {index} repeats the number {:?}", clip(.to, QUOTE_MAX))]
    DuplicateRecipient {
        /// Position in the chunk.
        index: usize,
        /// The repeated number.
        to: String,
    },
    /// A placeholder without a value.
    #[error("recipient {index} has no value for placeholder #{{{}}}", clip(.name, QUOTE_MAX))]
    MissingVariable {
        /// Position in the chunk.
        index: usize,
        /// The placeholder's name.
        name: String,
    },
    /// A variable value is too long.
    #[error(
        "recipient {index} variable {} is longer than {MAX_VAR_CHARS} characters",
        clip(.name, QUOTE_MAX)
    )]
    VariableTooLong {
        /// Position in the chunk.
        index: usize,
        /// The variable's name.
        name: String,
    },
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
    pub fn from_pairs(mut pairs: Vec<(&'a str, &'a str)>) -> Self {
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

    /// Checks the template on its own.
    pub fn validate(&self) -> Result<(), ChunkError> {
        self.view().validate()
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
    /// Checks the template on its own (as [`Template::validate`]).
    pub fn validate(&self) -> Result<(), ChunkError> {
        if !matches!(self.kind, "SMS" | "LMS" | "ATA" | "CTA") {
            return Err(ChunkError::BadType(self.kind.to_string()));
        }
        if matches!(self.kind, "ATA" | "CTA") && self.kakao_options.is_none() {
            return Err(ChunkError::MissingKakao(self.kind.to_string()));
        }
        if self.from.trim().is_empty() {
            return Err(ChunkError::NoSender);
        }
        let mut fields = [
            ("from", self.from, MAX_SENDER_CHARS),
            ("", "", 0),
            ("", "", 0),
        ];
        if let Some(k) = &self.kakao_options {
            fields[1] = ("kakaoOptions.pfId", k.pf_id, MAX_KAKAO_ID_CHARS);
            fields[2] = ("kakaoOptions.templateId", k.template_id, MAX_KAKAO_ID_CHARS);
        }
        for (field, value, max) in fields {
            let len = value.chars().count();
            if len > max {
                return Err(ChunkError::FieldTooLong { field, len, max });
            }
        }
        // A text of at most MAX_TEXT_CHARS bytes has at most as many
        // characters: count them only when the bytes could be too many.
        if self.text.len() > MAX_TEXT_CHARS {
            let chars = self.text.chars().count();
            if chars > MAX_TEXT_CHARS {
                return Err(ChunkError::TextTooLong(chars));
            }
        }
        Ok(())
    }

    /// The template, owned.
    pub fn to_template(&self) -> Template {
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

/// [`Chunk::validate`], for owned and borrowed chunks alike.
fn validate_chunk<R: RecipientFields>(
    batch: &str,
    seq: u32,
    last: bool,
    template: &TemplateRef<'_>,
    recipients: &[R],
) -> Result<(), ChunkError> {
    validate_batch_id(batch)?;
    template.validate()?;
    if recipients.is_empty() {
        return Err(ChunkError::Empty);
    }
    if recipients.len() > MAX_CHUNK_RECIPIENTS {
        return Err(ChunkError::TooManyRecipients(recipients.len()));
    }
    // The same limit as `decode`'s, so that a producer (`submit`, or the
    // Rust API) never appends a chunk that the worker would refuse: the
    // length of `Chunk::encode`, counted without encoding.
    let mut bytes = fast::Counter(0);
    fast::encode_chunk(batch, seq, last, template, recipients, &mut bytes);
    if bytes.0 > MAX_CHUNK_BYTES {
        return Err(ChunkError::TooLarge(bytes.0));
    }
    let names = placeholders(template.text);
    let mut seen = HashSet::with_capacity(recipients.len());
    for (index, r) in recipients.iter().enumerate() {
        let to = r.to();
        if to.is_empty() || to.len() > 32 {
            return Err(ChunkError::BadNumber {
                index,
                to: to.to_string(),
            });
        }
        if !seen.insert(to) {
            return Err(ChunkError::DuplicateRecipient {
                index,
                to: to.to_string(),
            });
        }
        for name in &names {
            if r.var(name).is_none() {
                return Err(ChunkError::MissingVariable {
                    index,
                    name: name.clone(),
                });
            }
        }
        if let Some((name, _)) = r
            .vars()
            .find(|(_, v)| v.len() > MAX_VAR_CHARS && v.chars().count() > MAX_VAR_CHARS)
        {
            return Err(ChunkError::VariableTooLong {
                index,
                name: name.to_string(),
            });
        }
    }
    Ok(())
}

/// [`Chunk::digest`], for owned and borrowed chunks alike.
fn digest_chunk<R: RecipientFields>(
    batch: &str,
    seq: u32,
    last: bool,
    template: &TemplateRef<'_>,
    recipients: &[R],
) -> String {
    let mut w = fast::HashWriter::new();
    fast::encode_chunk(batch, seq, last, template, recipients, &mut w);
    let hash = w.finish();
    hex::encode(&hash[..8])
}

impl Chunk {
    /// Checks everything that can be checked without the batch's state.
    pub fn validate(&self) -> Result<(), ChunkError> {
        validate_chunk(
            &self.batch,
            self.seq,
            self.last,
            &self.template.view(),
            &self.recipients,
        )
    }

    /// A digest of the chunk's content. Two deliveries of the same chunk have
    /// the same digest whatever encoder wrote them (the digest is taken over
    /// our own canonical re-encoding, with variables in name order).
    ///
    /// The canonical bytes are exactly [`Chunk::encode`]'s (rmp-serde, named
    /// fields), but written straight into the hash, without building them.
    pub fn digest(&self) -> String {
        digest_chunk(
            &self.batch,
            self.seq,
            self.last,
            &self.template.view(),
            &self.recipients,
        )
    }

    /// Encodes the chunk (the `d` field of an ingest entry).
    pub fn encode(&self) -> Vec<u8> {
        super::encode_payload(self)
    }

    /// Decodes an ingest `d` field, refusing oversized input before parsing it.
    pub fn decode(bytes: &[u8]) -> Result<Chunk, super::DecodeError> {
        if bytes.len() > MAX_CHUNK_BYTES {
            return Err(super::DecodeError::TooLarge(bytes.len()));
        }
        // The usual shape (a named-field map, as every encoder writes it)
        // is read directly; anything else, including every malformed input,
        // goes through rmp-serde, whose answer (and error) it then is.
        if let Some(chunk) = fast::decode_chunk(bytes) {
            return Ok(chunk);
        }
        super::decode_payload("chunk", bytes)
    }

    /// The chunk, borrowed.
    pub fn view(&self) -> ChunkRef<'_> {
        ChunkRef {
            batch: &self.batch,
            seq: self.seq,
            last: self.last,
            template: self.template.view(),
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
    /// Reads an ingest `d` field in place, if it has the usual shape (a
    /// named-field map with the known fields, each once, of the usual
    /// MessagePack types) and is not oversized. Whatever it reads,
    /// [`Chunk::decode`] reads to the same chunk; when it gives up (`None`),
    /// [`Chunk::decode`] decides: the chunk in another shape, or what is
    /// wrong with it.
    pub fn decode(bytes: &'a [u8]) -> Option<ChunkRef<'a>> {
        if bytes.len() > MAX_CHUNK_BYTES {
            return None;
        }
        fast::decode_chunk_ref(bytes)
    }

    /// Checks everything that can be checked without the batch's state
    /// (as [`Chunk::validate`]).
    pub fn validate(&self) -> Result<(), ChunkError> {
        validate_chunk(
            self.batch,
            self.seq,
            self.last,
            &self.template,
            &self.recipients,
        )
    }

    /// The digest of the chunk's content (as [`Chunk::digest`]).
    pub fn digest(&self) -> String {
        digest_chunk(
            self.batch,
            self.seq,
            self.last,
            &self.template,
            &self.recipients,
        )
    }

    /// The chunk, owned.
    pub fn to_chunk(&self) -> Chunk {
        Chunk {
            batch: self.batch.to_string(),
            seq: self.seq,
            last: self.last,
            template: self.template.to_template(),
            recipients: self
                .recipients
                .iter()
                .map(|r| Recipient {
                    to: r.to.to_string(),
                    vars: r
                        .vars
                        .as_slice()
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_string()))
                        .collect(),
                })
                .collect(),
        }
    }
}

/// MessagePack for [`Chunk`] by hand: a decoder for the usual shape, and the
/// canonical encoder (rmp-serde's bytes exactly) that the digest hashes.
mod fast {
    use std::collections::BTreeMap;

    use sha2::{Digest, Sha256};

    use super::{
        Chunk, ChunkRef, KakaoRef, KakaoTemplate, Recipient, RecipientFields, RecipientRef,
        Template, TemplateRef, VarsRef,
    };

    struct Reader<'a> {
        b: &'a [u8],
    }

    impl<'a> Reader<'a> {
        #[inline]
        fn byte(&mut self) -> Option<u8> {
            let (&x, rest) = self.b.split_first()?;
            self.b = rest;
            Some(x)
        }

        #[inline]
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if n > self.b.len() {
                return None;
            }
            let (a, rest) = self.b.split_at(n);
            self.b = rest;
            Some(a)
        }

        #[inline]
        fn be(&mut self, n: usize) -> Option<usize> {
            let s = self.take(n)?;
            Some(s.iter().fold(0usize, |a, &x| (a << 8) | usize::from(x)))
        }

        /// The bytes of a `str` (not `bin`: rmp-serde decides those).
        #[inline]
        fn str_bytes(&mut self) -> Option<&'a [u8]> {
            let m = self.byte()?;
            let n = match m {
                0xa0..=0xbf => usize::from(m & 0x1f),
                0xd9 => self.be(1)?,
                0xda => self.be(2)?,
                0xdb => self.be(4)?,
                _ => return None,
            };
            self.take(n)
        }

        #[inline]
        fn str(&mut self) -> Option<&'a str> {
            std::str::from_utf8(self.str_bytes()?).ok()
        }

        #[inline]
        fn string(&mut self) -> Option<String> {
            std::str::from_utf8(self.str_bytes()?)
                .ok()
                .map(str::to_owned)
        }

        #[inline]
        fn map_len(&mut self) -> Option<usize> {
            let m = self.byte()?;
            match m {
                0x80..=0x8f => Some(usize::from(m & 0x0f)),
                0xde => self.be(2),
                0xdf => self.be(4),
                _ => None,
            }
        }

        fn array_len(&mut self) -> Option<usize> {
            let m = self.byte()?;
            match m {
                0x90..=0x9f => Some(usize::from(m & 0x0f)),
                0xdc => self.be(2),
                0xdd => self.be(4),
                _ => None,
            }
        }

        fn u32(&mut self) -> Option<u32> {
            let m = self.byte()?;
            let v = match m {
                0x00..=0x7f => usize::from(m),
                0xcc => self.be(1)?,
                0xcd => self.be(2)?,
                0xce => self.be(4)?,
                _ => return None,
            };
            u32::try_from(v).ok()
        }

        fn bool(&mut self) -> Option<bool> {
            match self.byte()? {
                0xc2 => Some(false),
                0xc3 => Some(true),
                _ => None,
            }
        }

        fn is_nil(&self) -> bool {
            self.b.first() == Some(&0xc0)
        }
    }

    /// The chunk, if `bytes` is a named-field map with exactly the known
    /// fields, each once, of the usual MessagePack types; else `None`, and
    /// rmp-serde decides (unknown fields, positional arrays, `bin` strings,
    /// signed integers, errors...). Whatever this accepts, rmp-serde decodes
    /// to the same value.
    pub(super) fn decode_chunk(bytes: &[u8]) -> Option<Chunk> {
        let rd = &mut Reader { b: bytes };
        let (mut batch, mut seq, mut last, mut template, mut recipients) =
            (None, None, None, None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"batch" if batch.is_none() => batch = Some(rd.string()?),
                b"seq" if seq.is_none() => seq = Some(rd.u32()?),
                b"last" if last.is_none() => last = Some(rd.bool()?),
                b"template" if template.is_none() => template = Some(decode_template(rd)?),
                b"recipients" if recipients.is_none() => {
                    let n = rd.array_len()?;
                    // A recipient takes 5 bytes at least: never reserve
                    // more than the input can hold.
                    let mut v = Vec::with_capacity(n.min(rd.b.len() / 5));
                    for _ in 0..n {
                        v.push(decode_recipient(rd)?);
                    }
                    recipients = Some(v);
                }
                _ => return None,
            }
        }
        Some(Chunk {
            batch: batch?,
            seq: seq?,
            last: last?,
            template: template?,
            recipients: recipients?,
        })
    }

    fn decode_template(rd: &mut Reader<'_>) -> Option<Template> {
        let (mut kind, mut from, mut text, mut kakao) = (None, None, None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"type" if kind.is_none() => kind = Some(rd.string()?),
                b"from" if from.is_none() => from = Some(rd.string()?),
                b"text" if text.is_none() => text = Some(rd.string()?),
                b"kakao_options" if kakao.is_none() => {
                    if rd.is_nil() {
                        rd.byte();
                        kakao = Some(None);
                        continue;
                    }
                    let (mut pf_id, mut template_id) = (None, None);
                    for _ in 0..rd.map_len()? {
                        match rd.str_bytes()? {
                            b"pf_id" if pf_id.is_none() => pf_id = Some(rd.string()?),
                            b"template_id" if template_id.is_none() => {
                                template_id = Some(rd.string()?)
                            }
                            _ => return None,
                        }
                    }
                    kakao = Some(Some(KakaoTemplate {
                        pf_id: pf_id?,
                        template_id: template_id?,
                    }));
                }
                _ => return None,
            }
        }
        Some(Template {
            kind: kind?,
            from: from?,
            text: text?,
            kakao_options: kakao.flatten(),
        })
    }

    #[inline]
    fn decode_recipient(rd: &mut Reader<'_>) -> Option<Recipient> {
        let (mut to, mut vars) = (None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"to" if to.is_none() => to = Some(rd.string()?),
                b"vars" if vars.is_none() => {
                    let mut m = BTreeMap::new();
                    for _ in 0..rd.map_len()? {
                        let k = rd.string()?;
                        // Like serde's map visitor: a repeated name keeps
                        // its last value.
                        m.insert(k, rd.string()?);
                    }
                    vars = Some(m);
                }
                _ => return None,
            }
        }
        Some(Recipient {
            to: to?,
            vars: vars.unwrap_or_default(),
        })
    }

    /// [`decode_chunk`], borrowing every string from `bytes`.
    pub(super) fn decode_chunk_ref(bytes: &[u8]) -> Option<ChunkRef<'_>> {
        let rd = &mut Reader { b: bytes };
        let (mut batch, mut seq, mut last, mut template, mut recipients) =
            (None, None, None, None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"batch" if batch.is_none() => batch = Some(rd.str()?),
                b"seq" if seq.is_none() => seq = Some(rd.u32()?),
                b"last" if last.is_none() => last = Some(rd.bool()?),
                b"template" if template.is_none() => template = Some(decode_template_ref(rd)?),
                b"recipients" if recipients.is_none() => {
                    let n = rd.array_len()?;
                    let mut v = Vec::with_capacity(n.min(rd.b.len() / 5));
                    for _ in 0..n {
                        v.push(decode_recipient_ref(rd)?);
                    }
                    recipients = Some(v);
                }
                _ => return None,
            }
        }
        Some(ChunkRef {
            batch: batch?,
            seq: seq?,
            last: last?,
            template: template?,
            recipients: recipients?,
        })
    }

    fn decode_template_ref<'a>(rd: &mut Reader<'a>) -> Option<TemplateRef<'a>> {
        let (mut kind, mut from, mut text, mut kakao) = (None, None, None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"type" if kind.is_none() => kind = Some(rd.str()?),
                b"from" if from.is_none() => from = Some(rd.str()?),
                b"text" if text.is_none() => text = Some(rd.str()?),
                b"kakao_options" if kakao.is_none() => {
                    if rd.is_nil() {
                        rd.byte();
                        kakao = Some(None);
                        continue;
                    }
                    let (mut pf_id, mut template_id) = (None, None);
                    for _ in 0..rd.map_len()? {
                        match rd.str_bytes()? {
                            b"pf_id" if pf_id.is_none() => pf_id = Some(rd.str()?),
                            b"template_id" if template_id.is_none() => {
                                template_id = Some(rd.str()?)
                            }
                            _ => return None,
                        }
                    }
                    kakao = Some(Some(KakaoRef {
                        pf_id: pf_id?,
                        template_id: template_id?,
                    }));
                }
                _ => return None,
            }
        }
        Some(TemplateRef {
            kind: kind?,
            from: from?,
            text: text?,
            kakao_options: kakao.flatten(),
        })
    }

    #[inline]
    fn decode_recipient_ref<'a>(rd: &mut Reader<'a>) -> Option<RecipientRef<'a>> {
        let (mut to, mut vars) = (None, None);
        for _ in 0..rd.map_len()? {
            match rd.str_bytes()? {
                b"to" if to.is_none() => to = Some(rd.str()?),
                b"vars" if vars.is_none() => {
                    let n = rd.map_len()?;
                    vars = Some(if n == 1 {
                        let name = rd.str()?;
                        VarsRef::one(name, rd.str()?)
                    } else {
                        let mut pairs = Vec::with_capacity(n.min(rd.b.len() / 2));
                        for _ in 0..n {
                            let name = rd.str()?;
                            pairs.push((name, rd.str()?));
                        }
                        VarsRef::from_pairs(pairs)
                    });
                }
                _ => return None,
            }
        }
        Some(RecipientRef {
            to: to?,
            vars: vars.unwrap_or_default(),
        })
    }

    /// Where the encoder writes.
    pub(super) trait Sink {
        fn put(&mut self, bytes: &[u8]);
    }

    /// Counts the bytes instead of keeping them.
    pub(super) struct Counter(pub(super) usize);

    impl Sink for Counter {
        #[inline]
        fn put(&mut self, bytes: &[u8]) {
            self.0 += bytes.len();
        }
    }

    impl Sink for Vec<u8> {
        #[inline]
        fn put(&mut self, bytes: &[u8]) {
            self.extend_from_slice(bytes);
        }
    }

    /// SHA-256 fed through a buffer, so that the encoder's many small
    /// writes are hashed in large blocks.
    pub(super) struct HashWriter {
        hash: Sha256,
        buf: Vec<u8>,
    }

    const HASH_BUF: usize = 16 * 1024;

    impl HashWriter {
        pub(super) fn new() -> Self {
            HashWriter {
                hash: Sha256::new(),
                buf: Vec::with_capacity(HASH_BUF),
            }
        }

        pub(super) fn finish(mut self) -> [u8; 32] {
            self.hash.update(&self.buf);
            self.hash.finalize().into()
        }
    }

    impl Sink for HashWriter {
        #[inline]
        fn put(&mut self, bytes: &[u8]) {
            if self.buf.len() + bytes.len() > HASH_BUF {
                self.hash.update(&self.buf);
                self.buf.clear();
                if bytes.len() > HASH_BUF {
                    self.hash.update(bytes);
                    return;
                }
            }
            self.buf.extend_from_slice(bytes);
        }
    }

    /// A length with rmp's smallest marker: `fix` (+ n) below `fix_max`, else
    /// `m8` (if any) below 256, `m16` up to 65,535, else `m32`.
    #[inline]
    pub(super) fn len(
        w: &mut impl Sink,
        n: usize,
        fix: u8,
        fix_max: usize,
        m8: Option<u8>,
        m16: u8,
        m32: u8,
    ) {
        let n32 = n as u32;
        if n < fix_max {
            w.put(&[fix | n as u8]);
        } else if let (Some(m8), true) = (m8, n < 256) {
            w.put(&[m8, n as u8]);
        } else if n < 65_536 {
            let b = (n32 as u16).to_be_bytes();
            w.put(&[m16, b[0], b[1]]);
        } else {
            let b = n32.to_be_bytes();
            w.put(&[m32, b[0], b[1], b[2], b[3]]);
        }
    }

    #[inline]
    pub(super) fn str(w: &mut impl Sink, s: &str) {
        len(w, s.len(), 0xa0, 32, Some(0xd9), 0xda, 0xdb);
        w.put(s.as_bytes());
    }

    #[inline]
    pub(super) fn map(w: &mut impl Sink, n: usize) {
        len(w, n, 0x80, 16, None, 0xde, 0xdf);
    }

    pub(super) fn uint(w: &mut impl Sink, v: u32) {
        if v < 128 {
            w.put(&[v as u8]);
        } else if v < 256 {
            w.put(&[0xcc, v as u8]);
        } else if v < 65_536 {
            let b = (v as u16).to_be_bytes();
            w.put(&[0xcd, b[0], b[1]]);
        } else {
            let b = v.to_be_bytes();
            w.put(&[0xce, b[0], b[1], b[2], b[3]]);
        }
    }

    /// Writes the chunk exactly as `rmp_serde::to_vec_named` writes a
    /// [`Chunk`].
    pub(super) fn encode_chunk<R: RecipientFields>(
        batch: &str,
        seq: u32,
        last: bool,
        t: &TemplateRef<'_>,
        recipients: &[R],
        w: &mut impl Sink,
    ) {
        map(w, 5);
        str(w, "batch");
        str(w, batch);
        str(w, "seq");
        uint(w, seq);
        str(w, "last");
        w.put(&[if last { 0xc3 } else { 0xc2 }]);
        str(w, "template");
        map(w, 3 + usize::from(t.kakao_options.is_some()));
        str(w, "type");
        str(w, t.kind);
        str(w, "from");
        str(w, t.from);
        str(w, "text");
        str(w, t.text);
        if let Some(k) = &t.kakao_options {
            str(w, "kakao_options");
            map(w, 2);
            str(w, "pf_id");
            str(w, k.pf_id);
            str(w, "template_id");
            str(w, k.template_id);
        }
        str(w, "recipients");
        len(w, recipients.len(), 0x90, 16, None, 0xdc, 0xdd);
        for r in recipients {
            map(w, 2);
            str(w, "to");
            str(w, r.to());
            str(w, "vars");
            map(w, r.var_count());
            for (k, v) in r.vars() {
                str(w, k);
                str(w, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;

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
        c.recipients.push(c.recipients[0].clone());
        assert!(matches!(
            c.validate(),
            Err(ChunkError::DuplicateRecipient { index: 1, .. })
        ));
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
        let t = c.template.view();
        fast::encode_chunk(&c.batch, c.seq, c.last, &t, &c.recipients, out);
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
                assert!(fast::decode_chunk(&mine).is_some());
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

    #[test]
    fn the_digest_is_unchanged() {
        // Computed by the earlier digest (sha256 of rmp_serde::to_vec_named):
        // stored digests must keep matching their chunks.
        let c = Chunk {
            batch: "b1".into(),
            seq: 3,
            last: false,
            template: template("x"),
            recipients: vec![Recipient {
                to: "01012345678".into(),
                vars: BTreeMap::new(),
            }],
        };
        let expected =
            hex::encode(&sha2::Sha256::digest(rmp_serde::to_vec_named(&c).unwrap())[..8]);
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
            fast::map(&mut b, 5);
            for (k, v) in [("batch", "b"), ("template", ""), ("seq", ""), ("last", "")] {
                fast::str(&mut b, k);
                match k {
                    "batch" => fast::str(&mut b, v),
                    "seq" => fast::uint(&mut b, 9),
                    "last" => b.push(0xc3),
                    _ => b.extend(rmp_serde::to_vec_named(&c.template).unwrap()),
                }
            }
            fast::str(&mut b, "recipients");
            b.push(0x92);
            for to in ["1", "2"] {
                fast::map(&mut b, 2);
                fast::str(&mut b, "vars");
                fast::map(&mut b, vars.len());
                for (k, v) in vars {
                    fast::str(&mut b, k);
                    fast::str(&mut b, v);
                }
                fast::str(&mut b, "to");
                fast::str(&mut b, to);
            }
            cases.push(b);
        }
        let mut borrowed = 0;
        for (i, b) in cases.iter().enumerate() {
            let got = Chunk::decode(b).map_err(|e| e.to_string());
            assert_eq!(got, reference(b), "case {i}");
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
        let c = Chunk {
            batch: "b1".into(),
            seq: 3,
            last: false,
            template: template("x"),
            recipients: vec![Recipient {
                to: "01012345678".into(),
                vars: BTreeMap::new(),
            }],
        };
        let mut d = c.clone();
        assert_eq!(c.digest(), d.digest());
        d.recipients[0].to = "01012345679".into();
        assert_ne!(c.digest(), d.digest());
    }
}
