//! The provider's JSON objects, in the contract's shape (camelCase).
//!
//! Unknown fields are ignored on input (the real service returns many more
//! than this subset), so that pointing the client at it keeps working.

use std::collections::BTreeMap;

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
