//! The provider's JSON objects, in the contract's shape (camelCase).
//!
//! Unknown fields are ignored on input (the real service returns many more
//! than this subset), so that pointing the client at it keeps working.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{SeqAccess, Visitor};
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

/// Appends `s` as a JSON string, byte for byte as `serde_json` writes it.
#[inline]
pub fn write_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    write_json_str_content(out, s);
    out.push(b'"');
}

/// Appends `s` escaped as inside a JSON string (without the quotes), byte
/// for byte as `serde_json` escapes it: `"`, `\` and control characters only.
#[inline]
pub fn write_json_str_content(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    if !bytes.iter().any(|&b| needs_escape(b)) {
        out.extend_from_slice(bytes);
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !needs_escape(b) {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\x08' => out.extend_from_slice(b"\\b"),
            b'\x0c' => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

#[inline]
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
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
    fn json_strings_are_serde_jsons() {
        let mut all: String = (0u8..0x80).map(char::from).collect();
        all.push_str("é한\u{2028}\u{7f}\"\\");
        for s in [all.as_str(), "", "plain", "a\"b", "\\", "\u{1}x\u{1f}"] {
            let mut out = Vec::new();
            write_json_str(&mut out, s);
            assert_eq!(out, serde_json::to_vec(s).unwrap(), "{s:?}");
        }
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
