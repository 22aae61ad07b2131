//! The provider contract (`docs/provider-api.md`), exercised
//! with the real client against the in-process mock on a free port.

#[path = "provider_contract/delivery.rs"]
mod delivery;
#[path = "provider_contract/failures.rs"]
mod failures;
#[path = "provider_contract/groups.rs"]
mod groups;
#[path = "provider_contract/mock_api.rs"]
mod mock_api;
#[path = "provider_contract/signing.rs"]
mod signing;

use std::collections::BTreeMap;
use std::time::Duration;

use groupcast::provider::auth;
use groupcast::provider::{
    Message, MessageType, ProviderClient, ProviderConfig, ProviderError, ProviderErrorKind,
    Registration,
};
use groupcast_rigs::mock::{self, MockConfig, MockHandle};
use serde_json::Value;

const KEY: &str = "contract-key";
const SECRET: &str = "contract-secret";

fn config() -> MockConfig {
    MockConfig {
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        complete_after: Duration::ZERO,
        ..MockConfig::default()
    }
}

async fn start(config: MockConfig) -> MockHandle {
    mock::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn client_with(mock: &MockHandle, key: &str, secret: &str) -> ProviderClient {
    ProviderClient::new(ProviderConfig {
        base_url: mock.base_url(),
        api_key: key.into(),
        api_secret: secret.into(),
        ..ProviderConfig::default()
    })
    .unwrap()
}

fn client(mock: &MockHandle) -> ProviderClient {
    client_with(mock, KEY, SECRET)
}

fn msg(to: &str) -> Message {
    Message {
        to: to.into(),
        from: "0212345678".into(),
        r#type: MessageType::Sms,
        text: "hello".into(),
        kakao_options: None,
    }
}

fn number(i: usize) -> String {
    format!("010{i:08}")
}

fn fields(batch: &str) -> BTreeMap<String, String> {
    [
        ("batchId".to_owned(), batch.to_owned()),
        ("generation".to_owned(), "0".to_owned()),
    ]
    .into()
}

fn codes(regs: &[Registration]) -> Vec<String> {
    regs.iter()
        .map(|r| match r {
            Registration::Registered { .. } => "2000".to_owned(),
            Registration::Duplicate => "1026".to_owned(),
            Registration::Failed { code } => code.clone(),
        })
        .collect()
}

fn assert_err(e: &ProviderError, kind: ProviderErrorKind, status: Option<u16>, code: Option<&str>) {
    assert_eq!(e.kind(), kind, "{e}");
    assert_eq!(e.status(), status, "{e}");
    assert_eq!(e.error_code(), code, "{e}");
}

/// A raw signed (or not) request, for what the client would never send.
async fn raw(
    mock: &MockHandle,
    method: reqwest::Method,
    path: &str,
    authz: Option<String>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", mock.base_url()));
    if let Some(a) = authz {
        req = req.header("Authorization", a);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn signed() -> String {
    auth::authorization(KEY, SECRET, &auth::now_date(), &auth::new_salt())
}
