//! `GET /messages/v4/list`: a group's messages and their delivery results,
//! a page at a time.

use std::fmt;

use reqwest::Method;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::client::ProviderClient;
use super::error::{ProviderError, ProviderErrorKind};

/// One page of `GET /messages/v4/list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessagePage {
    /// The next page's `startKey`; `None` on the last page.
    #[serde(default)]
    pub next_key: Option<String>,
    /// The page's messages, in the provider's order.
    #[serde(default, rename = "messageList", deserialize_with = "in_order")]
    pub messages: Vec<ListedMessage>,
}

/// A message as the list shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedMessage {
    /// The provider's message id.
    #[serde(default)]
    pub message_id: String,
    /// Its group.
    #[serde(default)]
    pub group_id: String,
    /// The recipient's number.
    pub to: String,
    /// Its status code now (`2000`, `3000`, `4000`, a failure code).
    pub status_code: String,
    /// Why, in the provider's words (may be empty).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub reason: String,
    /// Whether it went out as the SMS fallback of an AlimTalk.
    #[serde(default)]
    pub replacement: bool,
}

/// `messageList` is an object keyed by message id: its values, in the
/// order the provider wrote them (a map type would sort or hash them).
fn in_order<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ListedMessage>, D::Error> {
    struct InOrder;
    impl<'de> Visitor<'de> for InOrder {
        type Value = Vec<ListedMessage>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object of messages keyed by message id")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
            while let Some((id, mut m)) = map.next_entry::<String, ListedMessage>()? {
                if m.message_id.is_empty() {
                    m.message_id = id;
                }
                out.push(m);
            }
            Ok(out)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(InOrder)
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl ProviderClient {
    /// `GET /messages/v4/list?groupId=..&limit=..[&startKey=..]`: one page
    /// of a group's messages (at most `limit`, 1 to 500), from `start_key`
    /// (`None`: the first page).
    pub async fn list_messages(
        &self,
        group_id: &str,
        start_key: Option<&str>,
        limit: u32,
    ) -> Result<MessagePage, ProviderError> {
        const EP: &str = "list_messages";
        let mut url = self.base_url_parsed();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["messages", "v4", "list"]);
        }
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("groupId", group_id)
                .append_pair("limit", &limit.to_string());
            if let Some(k) = start_key {
                q.append_pair("startKey", k);
            }
        }
        let bytes = self.execute(EP, Method::GET, url, None).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ProviderError::new(
                ProviderErrorKind::InvalidResponse,
                EP,
                "answer does not match the contract",
            )
            .with_source(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_the_providers_order_and_tolerates_what_it_does_not_know() {
        let body = r#"{"startKey": null, "nextKey": "M3", "limit": 2, "messageList": {
            "M9": {"messageId": "M9", "groupId": "G", "to": "01000000009", "statusCode": "4000",
                   "reason": null, "replacement": false, "dateCreated": "x", "extra": 1},
            "M1": {"groupId": "G", "to": "01000000001", "statusCode": "3104", "reason": "no KakaoTalk"}}}"#;
        let page: MessagePage = serde_json::from_str(body).unwrap();
        assert_eq!(page.next_key.as_deref(), Some("M3"));
        let ids: Vec<&str> = page.messages.iter().map(|m| m.message_id.as_str()).collect();
        assert_eq!(ids, ["M9", "M1"]);
        assert_eq!(page.messages[0].reason, "");
        assert_eq!(page.messages[1].reason, "no KakaoTalk");
        let last: MessagePage =
            serde_json::from_str(r#"{"nextKey": null, "messageList": {}}"#).unwrap();
        assert_eq!(last, MessagePage::default());
    }
}
