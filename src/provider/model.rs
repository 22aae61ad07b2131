//! The provider's JSON objects, in the contract's shape (camelCase).
//!
//! Unknown fields are ignored on input (the real service returns many more
//! than this subset), so that pointing the client at it keeps working.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// Kind of message. Serialised as `SMS`, `LMS`, `ATA` (AlimTalk) or `CTA`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum MessageType {
    /// Short text message.
    Sms,
    /// Long text message.
    Lms,
    /// Kakao AlimTalk (needs [`KakaoOptions`]).
    Ata,
    /// Kakao FriendTalk (needs [`KakaoOptions`]).
    Cta,
}

/// Kakao options that go with `ATA`/`CTA` messages.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct KakaoOptions {
    /// Kakao channel (plus friend) id.
    pub pf_id: String,
    /// Approved template id.
    pub template_id: String,
    /// Template variables, e.g. `"#{name}" → "Kim"`.
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
}

/// One message to add to a group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Recipient number (see [`crate::phone::is_valid_number`]).
    pub to: String,
    /// Registered sender number.
    pub from: String,
    /// Message kind.
    pub r#type: MessageType,
    /// Body text (for ATA: the rendered template text).
    pub text: String,
    /// Kakao options for `ATA`/`CTA`; omitted from the JSON when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kakao_options: Option<KakaoOptions>,
}

/// A group's life cycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GroupStatus {
    /// Created, accepting messages, not sent.
    Pending,
    /// Send triggered, results still arriving.
    Sending,
    /// Every message has a result.
    Complete,
    /// The provider gave up on the group.
    Failed,
    /// Deleted before sending.
    Deleted,
}

/// A group's message counts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct GroupCount {
    /// Every message stored in the group, registered or not.
    pub total: u64,
    /// Messages answered `"2000"` (they will be sent).
    pub registered_success: u64,
    /// Messages answered with any `"1xxx"` code (stored, never sent).
    pub registered_failed: u64,
    /// Messages with a send result so far.
    pub sent_total: u64,
    /// Messages delivered.
    pub sent_success: u64,
    /// Messages whose delivery failed.
    pub sent_failed: u64,
    /// Messages sent but without a result yet.
    pub sent_pending: u64,
    /// Messages that went out as the SMS fallback of a failed AlimTalk.
    pub sent_replacement: u64,
}

/// A provider group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// Provider id, e.g. `G4V...`.
    pub group_id: String,
    /// Life-cycle state.
    pub status: GroupStatus,
    /// Caller's fields given at creation (we keep batch id and generation there).
    #[serde(default)]
    pub custom_fields: BTreeMap<String, String>,
    /// Message counts.
    #[serde(default)]
    pub count: GroupCount,
    /// Creation time (ISO-8601, as the provider formats it).
    #[serde(default)]
    pub date_created: String,
    /// When the send was triggered.
    #[serde(default)]
    pub date_sent: Option<String>,
    /// When every message had a result.
    #[serde(default)]
    pub date_completed: Option<String>,
}

/// Body of `POST /messages/v4/groups` (every field optional on the wire).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct CreateGroupRequest {
    /// Let the same `to` be registered more than once in this group.
    /// Keep `false`: it is what makes a retried add harmless (`"1026"`).
    pub allow_duplicates: bool,
    /// Free-form fields stored with the group.
    pub custom_fields: BTreeMap<String, String>,
}

/// Body of `PUT /messages/v4/groups/{groupId}/messages`.
#[derive(Serialize, Debug)]
pub struct AddMessagesRequest<'a> {
    /// At most [`crate::provider::MAX_MESSAGES_PER_REQUEST`] messages.
    pub messages: &'a [Message],
}

/// Answer to an add request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AddMessagesResponse {
    /// How many results are not `"2000"`. The real service sends it as a
    /// number or as a string of digits; both are accepted.
    #[serde(deserialize_with = "number_or_digit_string", default)]
    pub error_count: u64,
    /// One result per message, in request order.
    #[serde(default)]
    pub result_list: Vec<MessageResult>,
}

/// The provider's answer for one message of an add request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MessageResult {
    /// Recipient as sent.
    #[serde(default)]
    pub to: String,
    /// Provider message id (present for `"2000"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// `"2000"` registered; `"1026"` duplicate; `"1062"` invalid number;
    /// `"1000"` any other rejection (including over the group cap).
    pub status_code: String,
    /// Human-readable status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
}

/// Status code: registered, will be sent.
pub const CODE_REGISTERED: &str = "2000";
/// Status code: `to` already registered in this group.
pub const CODE_DUPLICATE: &str = "1026";
/// Status code: invalid recipient number.
pub const CODE_INVALID_NUMBER: &str = "1062";
/// Status code: rejected for any other reason (including the group cap).
pub const CODE_REJECTED: &str = "1000";

/// Status code: delivered.
pub(crate) const CODE_DELIVERED: &str = "4000";
/// Status code: sent (handed on), no result yet.
pub(crate) const CODE_SENDING: &str = "3000";

/// One page of `GET /messages/v4/list`.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    /// The `startKey` of the next page; `None` on the last page.
    #[serde(default)]
    pub next_key: Option<String>,
    /// The page's messages, in the provider's order (`messageList` is a
    /// JSON object keyed by message id; its order is kept).
    #[serde(
        default,
        rename = "messageList",
        deserialize_with = "messages_in_order"
    )]
    pub messages: Vec<ListedMessage>,
}

/// A message as the list shows it.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ListedMessage {
    /// Provider message id (the one the add answer gave it).
    #[serde(default)]
    pub message_id: String,
    /// Its group.
    #[serde(default)]
    pub group_id: String,
    /// Recipient.
    #[serde(default)]
    pub to: String,
    /// `"2000"` registered, `"3000"` sent without a result yet, `"4000"`
    /// delivered, any other code failed (`"1xxx"` at registration).
    pub status_code: String,
    /// Why it failed, in words (empty when the provider gave none).
    #[serde(default, deserialize_with = "string_or_null")]
    pub reason: String,
    /// It went out as the SMS fallback of a failed AlimTalk.
    #[serde(default, deserialize_with = "bool_or_null")]
    pub replacement: bool,
}

impl ListedMessage {
    /// Whether its status can no longer change: every code but `"2000"`
    /// (not sent yet) and `"3000"` (sent, no result yet). A `"1xxx"`
    /// registration failure (`"1026"` included) is final: never sent.
    pub fn is_final(&self) -> bool {
        !matches!(self.status_code.as_str(), CODE_REGISTERED | CODE_SENDING)
    }

    /// Whether it was delivered (`"4000"`).
    pub fn is_delivered(&self) -> bool {
        self.status_code == CODE_DELIVERED
    }
}

/// `messageList`: an object keyed by message id, read into a `Vec` in the
/// order the provider wrote it (`null` reads as empty). A value without a
/// `messageId` takes its key.
fn messages_in_order<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ListedMessage>, D::Error> {
    struct InOrder;
    impl<'de> Visitor<'de> for InOrder {
        type Value = Vec<ListedMessage>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of messages keyed by message id")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(1000));
            while let Some((key, mut m)) = map.next_entry::<String, ListedMessage>()? {
                if m.message_id.is_empty() {
                    m.message_id = key;
                }
                out.push(m);
            }
            Ok(out)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(InOrder)
}

fn string_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn bool_or_null<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or_default())
}

/// Outcome of adding one message, as the rest of the system needs it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Registration {
    /// `"2000"`: will be sent.
    Registered {
        /// Provider message id.
        message_id: String,
    },
    /// `"1026"`: this `to` was already registered in this group (typically
    /// by an earlier attempt of the same add whose answer was lost).
    Duplicate,
    /// Any other code: stored by the provider, never sent.
    Failed {
        /// The provider's status code, e.g. `"1062"` or `"1000"`.
        code: String,
    },
}

impl Registration {
    /// Maps one provider result to a registration outcome.
    pub fn from_result(result: &MessageResult) -> Self {
        match result.status_code.as_str() {
            CODE_REGISTERED => Registration::Registered {
                message_id: result.message_id.clone().unwrap_or_default(),
            },
            CODE_DUPLICATE => Registration::Duplicate,
            other => Registration::Failed {
                code: other.to_owned(),
            },
        }
    }
}

/// An add request's answer as the worker needs it, counted while it is read:
/// of each result only `statusCode` is looked at (the other fields are
/// skipped without being kept), and only the failures keep their code.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddSummary {
    /// `errorCount` as the provider sent it.
    pub error_count: u64,
    /// How many results the answer had.
    pub results: usize,
    /// Results `"2000"` ([`Registration::Registered`]).
    pub registered: u32,
    /// Results `"1026"` ([`Registration::Duplicate`]).
    pub duplicates: u32,
    /// Any other code ([`Registration::Failed`]): the message's position in
    /// the request, and the code.
    pub failed: Vec<(usize, String)>,
}

impl AddSummary {
    /// Reads an add request's answer (`errorCount` is checked as
    /// [`AddMessagesResponse`] checks it; each result needs a `statusCode`).
    pub fn from_json(bytes: &[u8]) -> Result<AddSummary, serde_json::Error> {
        // The usual shape is scanned directly; anything else (nested values,
        // escapes, floats, errors...) is left to serde_json, whose answer it
        // then is.
        if let Some(s) = scan::add_summary(bytes) {
            return Ok(s);
        }
        Self::from_json_serde(bytes)
    }

    fn from_json_serde(bytes: &[u8]) -> Result<AddSummary, serde_json::Error> {
        let r: LeanAddResponse = serde_json::from_slice(bytes)?;
        let mut s = r.result_list;
        s.error_count = r.error_count;
        Ok(s)
    }

    /// Counts one result.
    fn count(&mut self, code: &str) {
        match code {
            CODE_REGISTERED => self.registered += 1,
            CODE_DUPLICATE => self.duplicates += 1,
            other => self.failed.push((self.results, other.to_owned())),
        }
        self.results += 1;
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanAddResponse {
    #[serde(deserialize_with = "number_or_digit_string", default)]
    error_count: u64,
    #[serde(default)]
    result_list: AddSummary,
}

#[derive(Deserialize)]
struct LeanResult<'a> {
    #[serde(rename = "statusCode", borrow)]
    status_code: Cow<'a, str>,
}

impl<'de> Deserialize<'de> for AddSummary {
    /// A `resultList` array, counted (no `errorCount`: see [`AddSummary::from_json`]).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Tally;
        impl<'de> Visitor<'de> for Tally {
            type Value = AddSummary;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AddSummary, A::Error> {
                let mut s = AddSummary::default();
                while let Some(r) = seq.next_element::<LeanResult<'de>>()? {
                    s.count(&r.status_code);
                }
                Ok(s)
            }
        }
        d.deserialize_seq(Tally)
    }
}

/// A scanner for the usual shape of an add answer: a strict subset of JSON
/// (flat objects of unescaped strings, integers, `true`, `false`, `null`).
/// Whatever it accepts, serde_json reads to the same [`AddSummary`]; on
/// anything else it gives up (`None`) and serde_json decides.
mod scan {
    use super::{AddSummary, CODE_DUPLICATE, CODE_REGISTERED};

    struct Scan<'a> {
        b: &'a [u8],
        i: usize,
    }

    impl<'a> Scan<'a> {
        #[inline]
        fn peek(&mut self) -> Option<u8> {
            while let Some(&c) = self.b.get(self.i) {
                if !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
                    return Some(c);
                }
                self.i += 1;
            }
            None
        }

        #[inline]
        fn eat(&mut self, c: u8) -> Option<()> {
            (self.peek()? == c).then(|| self.i += 1)
        }

        /// A string without escapes or control characters, valid UTF-8 (as
        /// serde_json wants keys and the strings it keeps).
        #[inline]
        fn str(&mut self) -> Option<&'a [u8]> {
            let s = self.skip_str()?;
            if !s.is_ascii() {
                std::str::from_utf8(s).ok()?;
            }
            Some(s)
        }

        /// A string without escapes or control characters, whatever its
        /// bytes (serde_json does not check the UTF-8 of a value it skips).
        #[inline]
        fn skip_str(&mut self) -> Option<&'a [u8]> {
            self.eat(b'"')?;
            let rest = &self.b[self.i..];
            let len = string_end(rest)?;
            if rest[len] != b'"' {
                return None;
            }
            self.i += len + 1;
            Some(&rest[..len])
        }

        fn literal(&mut self, word: &[u8]) -> Option<()> {
            let end = self.i + word.len();
            (self.b.get(self.i..end)? == word).then(|| self.i = end)
        }

        /// An integer: `-?(0|[1-9][0-9]*)`, not followed by a fraction or
        /// an exponent. Its digits.
        fn integer(&mut self) -> Option<&'a [u8]> {
            if self.peek()? == b'-' {
                self.i += 1;
            }
            let start = self.i;
            let digits = self.b[start..]
                .iter()
                .position(|c| !c.is_ascii_digit())
                .unwrap_or(self.b.len() - start);
            let d = &self.b[start..start + digits];
            if d.is_empty() || (d[0] == b'0' && d.len() > 1) {
                return None;
            }
            self.i += digits;
            if matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E')) {
                return None;
            }
            Some(d)
        }

        fn skip_value(&mut self) -> Option<()> {
            match self.peek()? {
                b'"' => self.skip_str().map(drop),
                b'-' | b'0'..=b'9' => self.integer().map(drop),
                b't' => self.literal(b"true"),
                b'f' => self.literal(b"false"),
                b'n' => self.literal(b"null"),
                _ => None,
            }
        }

        /// After a member: `true` at the closing `close`, `false` at a comma.
        #[inline]
        fn next(&mut self, close: u8) -> Option<bool> {
            let c = self.peek()?;
            self.i += 1;
            match c {
                b',' => Some(false),
                c if c == close => Some(true),
                _ => None,
            }
        }

        /// `{`, and whether `}` follows at once.
        fn open_object(&mut self) -> Option<bool> {
            self.eat(b'{')?;
            Some(self.eat(b'}').is_some())
        }
    }

    /// The position of the first `"`, `\\` or control character: sixteen
    /// bytes at a time with SSE2 (every x86_64 has it), which finds the end
    /// of most of an answer's strings (numbers, ids, keys, codes) in one
    /// step; the last bytes (and other targets) eight at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(super) fn string_end(b: &[u8]) -> Option<usize> {
        let mut i = 0;
        while let Some(block) = b.get(i..i + 16) {
            let found = sse2::special_bytes(block.try_into().ok()?);
            if found != 0 {
                return Some(i + found.trailing_zeros() as usize);
            }
            i += 16;
        }
        string_end_swar(&b[i..]).map(|p| i + p)
    }

    /// The position of the first `"`, `\\` or control character.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline]
    pub(super) fn string_end(b: &[u8]) -> Option<usize> {
        string_end_swar(b)
    }

    #[cfg(target_arch = "x86_64")]
    mod sse2 {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi8,
        };

        /// One bit per byte of `block` (bit `k` for byte `k`): set for a
        /// quote, a backslash or a control character (`<= 0x1f`).
        #[inline]
        pub(super) fn special_bytes(block: &[u8; 16]) -> u32 {
            // SAFETY: SSE2 is part of the x86_64 baseline, so every one of
            // these instructions exists; the unaligned load reads exactly
            // the 16 bytes `block` borrows.
            unsafe {
                let x = _mm_loadu_si128(block.as_ptr().cast());
                let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
                let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
                // Unsigned `x <= 0x1f` is `max(x, 0x1f) == 0x1f`.
                let low = _mm_set1_epi8(0x1f);
                let control = _mm_cmpeq_epi8(_mm_max_epu8(x, low), low);
                _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control)) as u32
            }
        }
    }

    /// [`string_end`] eight bytes at a time (like serde_json's own string
    /// scan).
    #[inline]
    fn string_end_swar(b: &[u8]) -> Option<usize> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let mut i = 0;
        while let Some(word) = b.get(i..i + 8) {
            let x = u64::from_le_bytes(word.try_into().ok()?);
            // Per byte, the high bit is set at (and only false positives
            // above) the first byte that is a quote, a backslash or < 0x20.
            let quote = x ^ (ONES * u64::from(b'"'));
            let backslash = x ^ (ONES * u64::from(b'\\'));
            let found = (quote.wrapping_sub(ONES) & !quote
                | backslash.wrapping_sub(ONES) & !backslash
                | x.wrapping_sub(ONES * 0x20) & !x)
                & HIGH;
            if found != 0 {
                return Some(i + (found.trailing_zeros() / 8) as usize);
            }
            i += 8;
        }
        b[i..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
            .map(|p| i + p)
    }

    fn digits_u64(d: &[u8]) -> Option<u64> {
        if d.is_empty() || !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    }

    /// `errorCount`: a count as a number, a string of digits, or `null`.
    fn error_count(s: &mut Scan<'_>) -> Option<u64> {
        match s.peek()? {
            b'"' => digits_u64(s.str()?),
            b'n' => s.literal(b"null").map(|()| 0),
            b'0'..=b'9' => digits_u64(s.integer()?),
            _ => None,
        }
    }

    fn result_list(s: &mut Scan<'_>, out: &mut AddSummary) -> Option<()> {
        s.eat(b'[')?;
        if s.eat(b']').is_some() {
            return Some(());
        }
        loop {
            if s.open_object()? {
                return None;
            }
            let mut code = None;
            loop {
                let key = s.str()?;
                s.eat(b':')?;
                if key == b"statusCode" {
                    if code.is_some() {
                        return None;
                    }
                    code = Some(s.str()?);
                } else {
                    s.skip_value()?;
                }
                if s.next(b'}')? {
                    break;
                }
            }
            let code = code?;
            // The usual codes are matched as bytes; any other is kept as text.
            match code {
                c if c == CODE_REGISTERED.as_bytes() => out.count(CODE_REGISTERED),
                c if c == CODE_DUPLICATE.as_bytes() => out.count(CODE_DUPLICATE),
                c => out.count(std::str::from_utf8(c).ok()?),
            }
            if s.next(b']')? {
                return Some(());
            }
        }
    }

    pub(super) fn add_summary(bytes: &[u8]) -> Option<AddSummary> {
        let s = &mut Scan { b: bytes, i: 0 };
        let mut out = AddSummary::default();
        let (mut count_seen, mut list_seen) = (false, false);
        if !s.open_object()? {
            loop {
                let key = s.str()?;
                s.eat(b':')?;
                match key {
                    b"errorCount" if !count_seen => {
                        count_seen = true;
                        out.error_count = error_count(s)?;
                    }
                    b"resultList" if !list_seen => {
                        list_seen = true;
                        result_list(s, &mut out)?;
                    }
                    b"errorCount" | b"resultList" => return None,
                    _ => s.skip_value()?,
                }
                if s.next(b'}')? {
                    break;
                }
            }
        }
        // Only whitespace may follow.
        (s.peek().is_none()).then_some(out)
    }
}

impl MessageType {
    /// The JSON name: `SMS`, `LMS`, `ATA` or `CTA`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageType::Sms => "SMS",
            MessageType::Lms => "LMS",
            MessageType::Ata => "ATA",
            MessageType::Cta => "CTA",
        }
    }
}

/// Every non-2xx answer's body.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `InvalidGroupStatus`.
    pub error_code: String,
    /// Human-readable message.
    #[serde(default)]
    pub error_message: String,
}

/// Accepts `3`, `"3"` (and `null` as 0): the real service has sent both.
fn number_or_digit_string<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumOrStr {
        Num(u64),
        Str(String),
        Null(()),
    }
    match NumOrStr::deserialize(d)? {
        NumOrStr::Num(n) => Ok(n),
        NumOrStr::Str(s) => s.trim().parse().map_err(|_| {
            serde::de::Error::invalid_value(serde::de::Unexpected::Str(&s), &"a count")
        }),
        NumOrStr::Null(()) => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_page_keeps_the_provider_order() {
        let p: MessagePage = serde_json::from_str(
            r#"{"startKey": null, "nextKey": "M4Vb", "limit": 3, "extra": 1,
                "messageList": {
                  "M4Vz": {"messageId": "M4Vz", "groupId": "G", "to": "010", "statusCode": "4000",
                           "reason": null, "replacement": false, "dateReported": "x"},
                  "M4Va": {"groupId": "G", "to": "011", "statusCode": "3104",
                           "reason": "the recipient does not use KakaoTalk"},
                  "M4Vm": {"messageId": "M4Vm", "statusCode": "3000", "replacement": null}}}"#,
        )
        .unwrap();
        assert_eq!(p.next_key.as_deref(), Some("M4Vb"));
        let ids: Vec<_> = p.messages.iter().map(|m| m.message_id.as_str()).collect();
        assert_eq!(ids, ["M4Vz", "M4Va", "M4Vm"]);
        assert_eq!(p.messages[0].reason, "");
        assert!(p.messages[0].is_final() && p.messages[0].is_delivered());
        assert!(p.messages[1].is_final() && !p.messages[1].is_delivered());
        assert!(!p.messages[2].is_final());
        assert!(!p.messages[2].replacement);
        let last: MessagePage =
            serde_json::from_str(r#"{"nextKey": null, "messageList": null}"#).unwrap();
        assert_eq!(last, MessagePage::default());
        for (code, fin) in [
            ("2000", false),
            ("3000", false),
            ("1062", true),
            ("1026", true),
        ] {
            let m = ListedMessage {
                status_code: code.into(),
                ..ListedMessage::default()
            };
            assert_eq!(m.is_final(), fin, "{code}");
        }
    }

    #[test]
    fn error_count_number_or_string() {
        let a: AddMessagesResponse =
            serde_json::from_str(r#"{"errorCount": 2, "resultList": []}"#).unwrap();
        let b: AddMessagesResponse =
            serde_json::from_str(r#"{"errorCount": "2", "resultList": []}"#).unwrap();
        assert_eq!(a.error_count, 2);
        assert_eq!(b.error_count, 2);
        assert!(serde_json::from_str::<AddMessagesResponse>(r#"{"errorCount": "x"}"#).is_err());
    }

    #[test]
    fn message_types_are_named_as_serde_names_them() {
        for t in [
            MessageType::Sms,
            MessageType::Lms,
            MessageType::Ata,
            MessageType::Cta,
        ] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
    }

    #[test]
    fn add_summary_counts_what_the_full_answer_says() {
        let body = br#"{"groupId":"G","errorCount":"2","resultList":[
            {"to":"010","messageId":"M1","statusCode":"2000","statusMessage":"ok"},
            {"statusMessage":"dup \"x\"","statusCode":"1026","to":"011"},
            {"to":"012","statusCode":"1062","messageId":null,"extra":[1,{"a":2}]},
            {"to":"013","statusCode":"10\u0030\u0030"}]}"#;
        let s = AddSummary::from_json(body).unwrap();
        let full: AddMessagesResponse = serde_json::from_slice(body).unwrap();
        assert_eq!(s.error_count, full.error_count);
        assert_eq!(s.results, full.result_list.len());
        assert_eq!((s.registered, s.duplicates), (1, 1));
        assert_eq!(s.failed, vec![(2, "1062".into()), (3, "1000".into())]);
        for r in &full.result_list {
            let reg = Registration::from_result(r);
            assert!(matches!(
                (r.status_code.as_str(), reg),
                ("2000", Registration::Registered { .. })
                    | ("1026", Registration::Duplicate)
                    | ("1062" | "1000", Registration::Failed { .. })
            ));
        }
        assert_eq!(
            AddSummary::from_json(br#"{"resultList":[]}"#).unwrap(),
            AddSummary::default()
        );
        for bad in [
            &br#"{"errorCount":"x","resultList":[]}"#[..],
            br#"{"resultList":[{"to":"010"}]}"#,
            br#"{"resultList":null}"#,
            br#"{"resultList":[{"statusCode":2000}]}"#,
            br#"{"resultList":[{"statusCode":"2000"}"#,
            br#"{"resultList":[{"statusCode":"2000","statusCode":"2000"}]}"#,
        ] {
            assert!(
                AddSummary::from_json(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
            assert!(serde_json::from_slice::<AddMessagesResponse>(bad).is_err());
        }
        // Like the full answer, a positional one is read too.
        let positional = br#"[1, [{"statusCode":"1062"}]]"#;
        assert_eq!(
            AddSummary::from_json(positional).unwrap().failed,
            vec![(0, "1062".into())]
        );
        assert!(serde_json::from_slice::<AddMessagesResponse>(positional).is_ok());
    }

    #[test]
    fn the_scanner_agrees_with_serde_json() {
        let base: Vec<&[u8]> = vec![
            r#"{"k":"한","errorCount":"2","resultList":[{"statusCode":"1000"}]}"#.as_bytes(),
            br#"{"groupId":"G4V","errorCount":1,"resultList":[{"to":"01000000001","messageId":"M4V1","statusCode":"2000","statusMessage":"Registered"},{"to":"010","statusCode":"1062","statusMessage":"Invalid recipient number"}]}"#,
            br#" { "errorCount" : "0" , "resultList" : [ { "statusCode" : "1026" , "n" : -12 , "t" : true , "f" : false , "z" : null , "k" : "x" } ] , "x" : 0 } "#,
            br#"{"resultList":[],"errorCount":null}"#,
        ];
        let alphabet = b"\"{}[],:\\ \n0123456789-.eE+tfnul\x01\xc3\xa9\xffa2000";
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let (mut scanned, mut total) = (0, 0);
        for doc in &base {
            assert!(
                scan::add_summary(doc).is_some(),
                "{}",
                String::from_utf8_lossy(doc)
            );
            for _ in 0..40_000 {
                let mut m = doc.to_vec();
                for _ in 0..1 + next(3) {
                    let at = next(m.len());
                    match next(4) {
                        0 => m[at] = alphabet[next(alphabet.len())],
                        1 => {
                            m.remove(at);
                        }
                        2 => m.insert(at, alphabet[next(alphabet.len())]),
                        _ => {
                            let end = (at + 1 + next(12)).min(m.len());
                            let piece = m[at..end].to_vec();
                            let to = next(m.len());
                            m.splice(to..to, piece);
                        }
                    }
                }
                total += 1;
                if let Some(fast) = scan::add_summary(&m) {
                    scanned += 1;
                    assert_eq!(
                        AddSummary::from_json_serde(&m).ok(),
                        Some(fast),
                        "{}",
                        String::from_utf8_lossy(&m)
                    );
                }
            }
        }
        // The mutations exercise both sides.
        assert!(
            scanned > total / 20 && scanned < total,
            "{scanned} of {total}"
        );
    }

    #[test]
    fn string_ends_are_found_a_block_at_a_time() {
        let naive = |b: &[u8]| b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..40 {
            for _ in 0..2_000 {
                let b: Vec<u8> = (0..len)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        match rng % 16 {
                            0 => b'"',
                            1 => b'\\',
                            2 => (rng >> 8) as u8 % 0x20,
                            3 => 0x80 | (rng >> 8) as u8,
                            _ => 0x20 + (rng >> 8) as u8 % 0x60,
                        }
                    })
                    .collect();
                assert_eq!(scan::string_end(&b), naive(&b), "{b:?}");
            }
        }
    }

    #[test]
    fn message_shape() {
        let m = Message {
            to: "01012345678".into(),
            from: "0212345678".into(),
            r#type: MessageType::Ata,
            text: "hi".into(),
            kakao_options: Some(KakaoOptions {
                pf_id: "pf".into(),
                template_id: "t".into(),
                variables: [("#{name}".to_owned(), "Kim".to_owned())].into(),
            }),
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["type"], "ATA");
        assert_eq!(v["kakaoOptions"]["pfId"], "pf");
        assert_eq!(v["kakaoOptions"]["variables"]["#{name}"], "Kim");
        let back: Message = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn group_shape() {
        let g: Group = serde_json::from_str(
            r#"{"groupId":"G4V1","status":"PENDING","customFields":{"a":"b"},
                "count":{"total":1,"registeredSuccess":1,"registeredFailed":0,"sentTotal":0,
                "sentSuccess":0,"sentFailed":0,"sentPending":0},
                "dateCreated":"2024-01-01T00:00:00Z","dateSent":null,"dateCompleted":null,
                "somethingElse": 1}"#,
        )
        .unwrap();
        assert_eq!(g.status, GroupStatus::Pending);
        assert_eq!(g.count.registered_success, 1);
        assert_eq!(g.date_sent, None);
    }
}
