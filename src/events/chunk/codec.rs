//! The chunk in MessagePack, by hand: one reader for the usual shape (a
//! named-field map, as every encoder writes it), which borrows every string
//! from the input, and the canonical encoder (rmp-serde's bytes exactly) that
//! the digest hashes and the size check counts. Any other shape, and every
//! malformed input, goes to rmp-serde, whose answer (and error) it then is.

use sha2::{Digest, Sha256};

use super::model::{
    Chunk, ChunkRef, KakaoRef, Parts, Recipient, RecipientFields, RecipientRef, Template,
    TemplateRef, VarsRef,
};
use super::MAX_CHUNK_BYTES;
use crate::events::options::{AdOptions, BatchOptions, Priority, QuietHours};
use crate::events::{decode_payload, encode_payload, DecodeError};

impl Chunk {
    /// A digest of the chunk's content. Two deliveries of the same chunk have
    /// the same digest whatever encoder wrote them (the digest is taken over
    /// our own canonical re-encoding, with variables in name order).
    ///
    /// The canonical bytes are exactly [`Chunk::encode`]'s (rmp-serde, named
    /// fields), but written straight into the hash, without building them.
    pub fn digest(&self) -> String {
        digest(&self.parts())
    }

    /// Encodes the chunk (the `d` field of an ingest entry).
    pub fn encode(&self) -> Vec<u8> {
        encode_payload(self)
    }

    /// Decodes an ingest `d` field, refusing oversized input before parsing it.
    pub fn decode(bytes: &[u8]) -> Result<Chunk, DecodeError> {
        Ok(match read(bytes)? {
            Read::InPlace(chunk) => chunk.to_chunk(),
            Read::Decoded(chunk) => chunk,
        })
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
        decode_ref(bytes)
    }

    /// Reads an ingest `d` field of any shape: in place when it has the usual
    /// one ([`ChunkRef::decode`]), else decoded into `fallback` and borrowed
    /// from there. The error is [`Chunk::decode`]'s: what is wrong with it.
    pub(crate) fn decode_any(
        bytes: &'a [u8],
        fallback: &'a mut Option<Chunk>,
    ) -> Result<ChunkRef<'a>, DecodeError> {
        Ok(match read(bytes)? {
            Read::InPlace(chunk) => chunk,
            Read::Decoded(chunk) => fallback.insert(chunk).view(),
        })
    }

    /// The digest of the chunk's content (as [`Chunk::digest`]).
    pub fn digest(&self) -> String {
        digest(&self.parts())
    }
}

/// An ingest `d` field, read.
enum Read<'a> {
    /// In the usual shape, read in place.
    InPlace(ChunkRef<'a>),
    /// In another shape, decoded by rmp-serde.
    Decoded(Chunk),
}

/// Reads `bytes` in place if it can, else through rmp-serde, refusing
/// oversized input before parsing it.
fn read(bytes: &[u8]) -> Result<Read<'_>, DecodeError> {
    if bytes.len() > MAX_CHUNK_BYTES {
        return Err(DecodeError::TooLarge(bytes.len()));
    }
    match decode_ref(bytes) {
        Some(chunk) => Ok(Read::InPlace(chunk)),
        None => decode_payload("chunk", bytes).map(Read::Decoded),
    }
}

/// The length of [`Chunk::encode`], counted without encoding.
pub(super) fn encoded_len<R: RecipientFields>(chunk: &Parts<'_, R>) -> usize {
    let mut bytes = Counter(0);
    encode_chunk(chunk, &mut bytes);
    bytes.0
}

/// The bytes recipient `r` takes in [`Chunk::encode`]'s output, counted
/// without encoding. With [`chunk_encoded_len`], a producer that reads
/// recipients one at a time knows each chunk's size (and so whether it is
/// under [`MAX_CHUNK_BYTES`]) without building the chunk.
pub fn recipient_encoded_len(r: &impl RecipientFields) -> usize {
    let mut bytes = Counter(0);
    encode_recipient(r, &mut bytes);
    bytes.0
}

/// The length of [`Chunk::encode`] for a chunk with these fields and
/// `recipients` recipients whose [`recipient_encoded_len`]s add up to
/// `recipient_bytes`.
pub fn chunk_encoded_len(
    batch: &str,
    seq: u32,
    last: bool,
    template: &Template,
    options: &BatchOptions,
    recipients: usize,
    recipient_bytes: usize,
) -> usize {
    let mut bytes = Counter(0);
    encode_head(
        &head(batch, seq, last, template, options),
        recipients,
        &mut bytes,
    );
    bytes.0 + recipient_bytes
}

/// A chunk's fields without its recipients.
fn head<'a>(
    batch: &'a str,
    seq: u32,
    last: bool,
    template: &'a Template,
    options: &'a BatchOptions,
) -> Parts<'a, Recipient> {
    Parts {
        batch,
        seq,
        last,
        template: template.view(),
        options,
        recipients: &[],
    }
}

/// Writes [`Chunk::encode`]'s bytes one recipient at a time, for a producer
/// that reads recipients as it goes and never builds the chunk.
pub struct ChunkEncoder {
    bytes: Vec<u8>,
    /// Recipients announced and not pushed yet.
    left: usize,
}

impl ChunkEncoder {
    /// Starts a chunk that will have exactly `recipients` recipients, with
    /// room for `capacity` bytes.
    pub fn new(
        batch: &str,
        seq: u32,
        last: bool,
        template: &Template,
        options: &BatchOptions,
        recipients: usize,
        capacity: usize,
    ) -> ChunkEncoder {
        let mut bytes = Vec::with_capacity(capacity);
        encode_head(
            &head(batch, seq, last, template, options),
            recipients,
            &mut bytes,
        );
        ChunkEncoder {
            bytes,
            left: recipients,
        }
    }

    /// Appends the next recipient.
    pub fn push(&mut self, r: &impl RecipientFields) {
        encode_recipient(r, &mut self.bytes);
        self.left = self.left.wrapping_sub(1);
    }

    /// The encoded chunk, or `None` when the recipients pushed were not as
    /// many as announced (the bytes would not decode).
    pub fn finish(self) -> Option<Vec<u8>> {
        (self.left == 0).then_some(self.bytes)
    }
}

/// [`Chunk::digest`], for owned and borrowed chunks alike.
fn digest<R: RecipientFields>(chunk: &Parts<'_, R>) -> String {
    let mut w = HashWriter::new();
    encode_chunk(chunk, &mut w);
    let hash = w.finish();
    hex::encode(&hash[..8])
}

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
        let b = self.str_bytes()?;
        // Numbers and most values are ASCII: `is_ascii` checks a short
        // string in a few word reads, where `from_utf8` goes byte by byte.
        if b.is_ascii() {
            // SAFETY: ASCII bytes are valid UTF-8.
            return Some(unsafe { std::str::from_utf8_unchecked(b) });
        }
        std::str::from_utf8(b).ok()
    }

    /// A map's or an array's length: in the `fix` marker's low four bits,
    /// or in the 2 or 4 bytes after an `m16` or `m32` marker.
    #[inline]
    fn len(&mut self, fix: u8, m16: u8, m32: u8) -> Option<usize> {
        let m = self.byte()?;
        if m & 0xf0 == fix {
            Some(usize::from(m & 0x0f))
        } else if m == m16 {
            self.be(2)
        } else if m == m32 {
            self.be(4)
        } else {
            None
        }
    }

    #[inline]
    fn map_len(&mut self) -> Option<usize> {
        self.len(0x80, 0xde, 0xdf)
    }

    fn array_len(&mut self) -> Option<usize> {
        self.len(0x90, 0xdc, 0xdd)
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
/// fields, each once, of the usual MessagePack types, every string borrowed
/// from `bytes`; else `None`, and rmp-serde decides (unknown fields,
/// positional arrays, `bin` strings, signed integers, errors...). Whatever
/// this accepts, rmp-serde decodes to the same value.
pub(super) fn decode_ref(bytes: &[u8]) -> Option<ChunkRef<'_>> {
    let rd = &mut Reader { b: bytes };
    let (mut batch, mut seq, mut last, mut template, mut recipients) =
        (None, None, None, None, None);
    let mut options = None;
    for _ in 0..rd.map_len()? {
        match rd.str_bytes()? {
            b"batch" if batch.is_none() => batch = Some(rd.str()?),
            b"seq" if seq.is_none() => seq = Some(rd.u32()?),
            b"last" if last.is_none() => last = Some(rd.bool()?),
            b"template" if template.is_none() => template = Some(decode_template_ref(rd)?),
            b"options" if options.is_none() => options = Some(decode_options(rd)?),
            b"recipients" if recipients.is_none() => {
                let n = rd.array_len()?;
                // A recipient takes 5 bytes at least: never reserve
                // more than the input can hold.
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
        options: options.unwrap_or_default(),
        recipients: recipients?,
    })
}

/// A chunk's `options` map (`None`: not the usual shape; rmp-serde decides).
fn decode_options(rd: &mut Reader<'_>) -> Option<BatchOptions> {
    let mut o = BatchOptions::default();
    let (mut at, mut priority, mut quiet, mut ad) = (false, false, false, false);
    for _ in 0..rd.map_len()? {
        match rd.str_bytes()? {
            b"send_at" if !at => {
                at = true;
                o.send_at = Some(rd.str()?.to_string());
            }
            b"priority" if !priority => {
                priority = true;
                o.priority = Some(Priority::parse(rd.str()?)?);
            }
            b"quiet_hours" if !quiet => {
                quiet = true;
                let (mut start, mut end, mut tz) = (None, None, None);
                for _ in 0..rd.map_len()? {
                    match rd.str_bytes()? {
                        b"start" if start.is_none() => start = Some(rd.str()?.to_string()),
                        b"end" if end.is_none() => end = Some(rd.str()?.to_string()),
                        b"tz" if tz.is_none() => tz = Some(rd.str()?.to_string()),
                        _ => return None,
                    }
                }
                o.quiet_hours = Some(QuietHours {
                    start: start?,
                    end: end?,
                    tz: tz?,
                });
            }
            b"ad" if !ad => {
                ad = true;
                let (mut consent, mut pair) = (None, None);
                for _ in 0..rd.map_len()? {
                    match rd.str_bytes()? {
                        b"night_consent" if consent.is_none() => consent = Some(rd.bool()?),
                        b"pair" if pair.is_none() => pair = Some(rd.str()?.to_string()),
                        _ => return None,
                    }
                }
                o.ad = Some(AdOptions {
                    night_consent: consent.unwrap_or(false),
                    pair,
                });
            }
            _ => return None,
        }
    }
    Some(o)
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
                        b"template_id" if template_id.is_none() => template_id = Some(rd.str()?),
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
                    // Like serde's map visitor: a repeated name keeps
                    // its last value.
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
struct Counter(usize);

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
struct HashWriter {
    hash: Sha256,
    buf: Vec<u8>,
}

const HASH_BUF: usize = 16 * 1024;

impl HashWriter {
    fn new() -> Self {
        HashWriter {
            hash: Sha256::new(),
            buf: Vec::with_capacity(HASH_BUF),
        }
    }

    fn finish(mut self) -> [u8; 32] {
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
fn len(w: &mut impl Sink, n: usize, fix: u8, fix_max: usize, m8: Option<u8>, m16: u8, m32: u8) {
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
pub(super) fn encode_chunk<R: RecipientFields>(c: &Parts<'_, R>, w: &mut impl Sink) {
    encode_head(c, c.recipients.len(), w);
    for r in c.recipients {
        encode_recipient(r, w);
    }
}

/// Writes everything of a chunk before its first recipient, announcing
/// `recipients` of them (whatever `c.recipients` holds).
fn encode_head<R: RecipientFields>(c: &Parts<'_, R>, recipients: usize, w: &mut impl Sink) {
    /// A string member `name: value`.
    #[inline]
    fn member(w: &mut impl Sink, name: &str, value: &str) {
        str(w, name);
        str(w, value);
    }
    let t = &c.template;
    map(w, 5 + usize::from(!c.options.is_empty()));
    member(w, "batch", c.batch);
    str(w, "seq");
    uint(w, c.seq);
    str(w, "last");
    w.put(&[if c.last { 0xc3 } else { 0xc2 }]);
    str(w, "template");
    map(w, 3 + usize::from(t.kakao_options.is_some()));
    member(w, "type", t.kind);
    member(w, "from", t.from);
    member(w, "text", t.text);
    if let Some(k) = &t.kakao_options {
        str(w, "kakao_options");
        map(w, 2);
        member(w, "pf_id", k.pf_id);
        member(w, "template_id", k.template_id);
    }
    if !c.options.is_empty() {
        encode_options(c.options, w);
    }
    str(w, "recipients");
    array(w, recipients);
}

/// Writes the `options` member, as rmp-serde writes [`BatchOptions`].
fn encode_options(o: &BatchOptions, w: &mut impl Sink) {
    str(w, "options");
    map(
        w,
        usize::from(o.send_at.is_some())
            + usize::from(o.priority.is_some())
            + usize::from(o.quiet_hours.is_some())
            + usize::from(o.ad.is_some()),
    );
    if let Some(at) = &o.send_at {
        str(w, "send_at");
        str(w, at);
    }
    if let Some(p) = o.priority {
        str(w, "priority");
        str(w, p.name());
    }
    if let Some(q) = &o.quiet_hours {
        str(w, "quiet_hours");
        map(w, 3);
        for (k, v) in [("start", &q.start), ("end", &q.end), ("tz", &q.tz)] {
            str(w, k);
            str(w, v);
        }
    }
    if let Some(ad) = &o.ad {
        // As rmp-serde writes [`AdOptions`]: members left out when unset.
        str(w, "ad");
        map(
            w,
            usize::from(ad.night_consent) + usize::from(ad.pair.is_some()),
        );
        if ad.night_consent {
            str(w, "night_consent");
            w.put(&[0xc3]);
        }
        if let Some(pair) = &ad.pair {
            str(w, "pair");
            str(w, pair);
        }
    }
}

/// An array header of `n` elements.
#[inline]
fn array(w: &mut impl Sink, n: usize) {
    len(w, n, 0x90, 16, None, 0xdc, 0xdd);
}

/// Writes one recipient of a chunk's `recipients` array.
#[inline]
fn encode_recipient(r: &impl RecipientFields, w: &mut impl Sink) {
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
