//! The provider contract (`docs/provider-api.md`), exercised
//! with the real client against the in-process mock on a free port.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use groupcast::mock::{self, Faults, MockConfig, MockHandle};
use groupcast::provider::auth;
use groupcast::provider::{
    CreateGroupRequest, GroupStatus, Message, MessageType, ProviderClient, ProviderConfig,
    ProviderError, ProviderErrorKind, Registration, RetryDecision, MAX_MESSAGES_PER_REQUEST,
};
use serde_json::{json, Value};

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

#[test]
fn signature_matches_independent_vector() {
    // Computed independently:
    // python3 -c 'import hmac,hashlib; print(hmac.new(b"test-secret",
    //   b"2024-05-01T12:34:56.789Z0123456789abcdef0123456789abcdef",
    //   hashlib.sha256).hexdigest())'
    let date = "2024-05-01T12:34:56.789Z";
    let salt = "0123456789abcdef0123456789abcdef";
    let expected = "HMAC-SHA256 apiKey=test-key, date=2024-05-01T12:34:56.789Z, \
                    salt=0123456789abcdef0123456789abcdef, \
                    signature=a13ef3baea286e30569f7ff4f4769b8a39f5fea0465b6afd817327eefc4765e1";
    assert_eq!(
        auth::authorization("test-key", "test-secret", date, salt),
        expected
    );
    // And the verifier accepts exactly that.
    let h = auth::parse_authorization(expected).unwrap();
    h.verify("test-key", "test-secret").unwrap();
    assert!(h.verify("test-key", "other").is_err());
}

#[test]
fn fresh_salt_and_date() {
    let a = auth::new_salt();
    let b = auth::new_salt();
    assert_ne!(a, b);
    assert!((12..=64).contains(&a.len()));
    auth::check_date(&auth::now_date(), SystemTime::now()).unwrap();
}

#[tokio::test]
async fn happy_path_create_add_send_get() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&fields("b1")).await.unwrap();
    assert_eq!(g.status, GroupStatus::Pending);
    assert_eq!(g.custom_fields, fields("b1"));
    assert_eq!(g.count.total, 0);
    assert!(g.group_id.starts_with("G4V"));

    let regs = c
        .add_messages(&g.group_id, &[msg("01011112222"), msg("01033334444")])
        .await
        .unwrap();
    assert_eq!(codes(&regs), ["2000", "2000"]);
    assert!(matches!(&regs[0], Registration::Registered { message_id } if !message_id.is_empty()));

    let got = c.get_group(&g.group_id).await.unwrap();
    assert_eq!(got.status, GroupStatus::Pending);
    assert_eq!(got.count.total, 2);
    assert_eq!(got.count.registered_success, 2);

    let sent = c.send_group(&g.group_id).await.unwrap();
    assert_eq!(sent.status, GroupStatus::Sending);
    assert!(sent.date_sent.is_some());

    // complete_after is 0: the next read sees COMPLETE.
    let done = c.get_group(&g.group_id).await.unwrap();
    assert_eq!(done.status, GroupStatus::Complete);
    assert_eq!(done.count.sent_total, 2);
    assert_eq!(done.count.sent_success, 2);
    assert!(done.date_completed.is_some());

    let ledger = mock.ledger();
    assert_eq!(ledger.groups.len(), 1);
    let lg = &ledger.groups[0];
    assert_eq!(lg.custom_fields, fields("b1"));
    assert_eq!(lg.messages.len(), 2);
    assert_eq!(lg.messages[1].to, "01033334444");
    assert_eq!(lg.messages[1].status_code, "2000");
    assert_eq!(lg.send_calls.len(), 1);
    assert_eq!(lg.send_calls[0].status, 200);
}

#[tokio::test]
async fn sending_turns_complete_after_delay() {
    let mock = start(MockConfig {
        complete_after: Duration::from_millis(100),
        ..config()
    })
    .await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.add_messages(&g.group_id, &[msg("01011112222")])
        .await
        .unwrap();
    assert_eq!(
        c.send_group(&g.group_id).await.unwrap().status,
        GroupStatus::Sending
    );
    // Bounded poll: the status, not a sleep, is what the test waits for.
    let deadline = Instant::now() + Duration::from_secs(5);
    let done = loop {
        let got = c.get_group(&g.group_id).await.unwrap();
        match got.status {
            GroupStatus::Sending => assert_eq!(got.count.sent_pending, 1),
            GroupStatus::Complete => break got,
            other => panic!("unexpected {other:?}"),
        }
        assert!(Instant::now() < deadline, "never completed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done.count.sent_success, 1);
    assert_eq!(done.count.sent_pending, 0);
    // Completion is dated complete_after after the send.
    let sent = humantime::parse_rfc3339(done.date_sent.as_deref().unwrap()).unwrap();
    let completed = humantime::parse_rfc3339(done.date_completed.as_deref().unwrap()).unwrap();
    assert_eq!(
        completed.duration_since(sent).unwrap(),
        Duration::from_millis(100)
    );
}

#[tokio::test]
async fn delete_pending_then_refusals() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.delete_group(&g.group_id).await.unwrap();
    assert_eq!(
        c.get_group(&g.group_id).await.unwrap().status,
        GroupStatus::Deleted
    );
    // A deleted group takes no messages, cannot be sent, nor deleted again.
    let e = c
        .add_messages(&g.group_id, &[msg("01011112222")])
        .await
        .unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(400),
        Some("InvalidGroupStatus"),
    );
    let e = c.send_group(&g.group_id).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(400),
        Some("DeletedGroup"),
    );
    assert_eq!(e.retry_decision(), RetryDecision::Abort);
    let e = c.delete_group(&g.group_id).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(400),
        Some("NotOperationalStatus"),
    );
}

#[tokio::test]
async fn delete_non_pending_is_400() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let e = c.delete_group(&g.group_id).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(400),
        Some("NotOperationalStatus"),
    );
    assert_eq!(e.endpoint(), "delete");
}

#[tokio::test]
async fn unknown_group_is_404_everywhere() {
    let mock = start(config()).await;
    let c = client(&mock);
    let id = "G4VNOSUCHGROUP";
    for e in [
        c.get_group(id).await.unwrap_err(),
        c.send_group(id).await.unwrap_err(),
        c.delete_group(id).await.unwrap_err(),
        c.add_messages(id, &[msg("01011112222")]).await.unwrap_err(),
    ] {
        assert_err(
            &e,
            ProviderErrorKind::Permanent,
            Some(404),
            Some("ResourceNotFound"),
        );
        assert_eq!(e.retry_decision(), RetryDecision::Abort);
    }
}

#[tokio::test]
async fn add_splits_and_keeps_order() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let n = MAX_MESSAGES_PER_REQUEST * 2 + 345;
    let mut msgs: Vec<Message> = (0..n).map(|i| msg(&number(i))).collect();
    // Markers at known positions in the second and third request.
    msgs[10_005] = msg("not-a-number");
    msgs[20_100] = msg(&number(7)); // duplicate of the 8th message
    let regs = c.add_messages(&g.group_id, &msgs).await.unwrap();
    assert_eq!(regs.len(), n);
    let cs = codes(&regs);
    assert_eq!(cs[10_005], "1062");
    assert_eq!(cs[20_100], "1026");
    assert_eq!(cs.iter().filter(|c| *c == "2000").count(), n - 2);
    let s = mock.ledger_summary();
    assert_eq!(s.totals.requests["add"], 3);
    assert_eq!(s.groups[0].count.total, n as u64);
    assert_eq!(s.groups[0].count.registered_failed, 2);
    let l = mock.ledger();
    assert_eq!(l.groups[0].messages[10_005].to, "not-a-number");
    assert_eq!(l.groups[0].messages[20_100].status_code, "1026");
}

#[tokio::test]
async fn over_10000_in_one_request_is_413_and_adds_nothing() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let msgs: Vec<Message> = (0..MAX_MESSAGES_PER_REQUEST + 1)
        .map(|i| msg(&number(i)))
        .collect();
    let (status, body) = raw(
        &mock,
        reqwest::Method::PUT,
        &format!("/messages/v4/groups/{}/messages", g.group_id),
        Some(signed()),
        Some(json!({ "messages": msgs })),
    )
    .await;
    assert_eq!(status, 413);
    assert_eq!(body["errorCode"], "RecipientsTooMany");
    assert!(body["errorMessage"].is_string());
    assert_eq!(c.get_group(&g.group_id).await.unwrap().count.total, 0);
    // Exactly 10,000 is fine.
    let (status, body) = raw(
        &mock,
        reqwest::Method::PUT,
        &format!("/messages/v4/groups/{}/messages", g.group_id),
        Some(signed()),
        Some(json!({ "messages": &msgs[..MAX_MESSAGES_PER_REQUEST] })),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["resultList"].as_array().unwrap().len(), 10_000);
    assert_eq!(body["errorCount"], 0);
}

#[tokio::test]
async fn add_to_sent_group_is_400() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let e = c
        .add_messages(&g.group_id, &[msg("01011112222")])
        .await
        .unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(400),
        Some("InvalidGroupStatus"),
    );
    assert_eq!(e.endpoint(), "add");
    assert_eq!(mock.ledger().groups[0].messages.len(), 0);
}

#[tokio::test]
async fn duplicate_recipient_is_1026_unless_allowed() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let regs = c
        .add_messages(&g.group_id, &[msg("01011112222"), msg("01011112222")])
        .await
        .unwrap();
    assert_eq!(codes(&regs), ["2000", "1026"]);
    let regs = c
        .add_messages(&g.group_id, &[msg("01011112222")])
        .await
        .unwrap();
    assert_eq!(regs, [Registration::Duplicate]);
    let got = c.get_group(&g.group_id).await.unwrap();
    assert_eq!(
        (
            got.count.total,
            got.count.registered_success,
            got.count.registered_failed
        ),
        (3, 1, 2)
    );
    // The same number in another group is that group's business...
    let g2 = c.create_group(&BTreeMap::new()).await.unwrap();
    let regs = c
        .add_messages(&g2.group_id, &[msg("01011112222")])
        .await
        .unwrap();
    assert_eq!(codes(&regs), ["2000"]);
    // ...but the ledger reports it as registered twice.
    let s = mock.ledger_summary();
    assert_eq!(s.duplicate_registrations.len(), 1);
    assert_eq!(s.duplicate_registrations[0].to, "01011112222");
    assert_eq!(
        s.duplicate_registrations[0].group_ids,
        [g.group_id.clone(), g2.group_id.clone()]
    );

    let g3 = c
        .create_group_with(&CreateGroupRequest {
            allow_duplicates: true,
            custom_fields: BTreeMap::new(),
        })
        .await
        .unwrap();
    let regs = c
        .add_messages(&g3.group_id, &[msg("01055556666"), msg("01055556666")])
        .await
        .unwrap();
    assert_eq!(codes(&regs), ["2000", "2000"]);
}

#[tokio::test]
async fn invalid_number_is_1062() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let regs = c
        .add_messages(
            &g.group_id,
            &[
                msg("010-1111-2222"),
                msg("01011112222"),
                msg("1234"),
                msg("11011112222"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(codes(&regs), ["1062", "2000", "1062", "1062"]);
    let s = mock.ledger_summary();
    assert_eq!(s.groups[0].status_codes["1062"], 3);
    assert_eq!(s.groups[0].status_codes["2000"], 1);
}

#[tokio::test]
async fn beyond_cap_is_1000() {
    let mock = start(MockConfig { cap: 3, ..config() }).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let msgs: Vec<Message> = (0..5).map(|i| msg(&number(i))).collect();
    let regs = c.add_messages(&g.group_id, &msgs).await.unwrap();
    assert_eq!(codes(&regs), ["2000", "2000", "2000", "1000", "1000"]);
    // A retry of the rejected ones is rejected again, not passed off as 1026.
    let regs = c.add_messages(&g.group_id, &msgs[3..]).await.unwrap();
    assert_eq!(codes(&regs), ["1000", "1000"]);
    let got = c.get_group(&g.group_id).await.unwrap();
    assert_eq!(got.count.registered_success, 3);
}

#[tokio::test]
async fn second_send_is_409_already_sent() {
    // SENDING for a long time: the second send meets GroupInProcessing.
    let mock = start(MockConfig {
        complete_after: Duration::from_secs(3600),
        ..config()
    })
    .await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let e = c.send_group(&g.group_id).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::AlreadySent,
        Some(409),
        Some("GroupInProcessing"),
    );
    assert_eq!(e.retry_decision(), RetryDecision::AlreadyDone);

    // Completed at once: the second send meets AlreadySent.
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let e = c.send_group(&g.group_id).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::AlreadySent,
        Some(409),
        Some("AlreadySent"),
    );
    let calls = &mock.ledger().groups[0].send_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].status, calls[0].error_code.as_deref()),
        (200, None)
    );
    assert_eq!(
        (calls[1].status, calls[1].error_code.as_deref()),
        (409, Some("AlreadySent"))
    );
}

/// `t` written as Korean local time with its `+09:00` offset (the form the
/// real service's SDKs send), rolling the date over past 15:00 UTC.
fn with_kst_offset(t: SystemTime) -> String {
    let local = humantime::format_rfc3339_seconds(t + Duration::from_secs(9 * 3600)).to_string();
    format!("{}+09:00", local.trim_end_matches('Z'))
}

/// The date check on a clock the test controls: every hour of a day, across a
/// month and a year boundary, in UTC and in an offset form.
#[test]
fn date_check_holds_at_every_hour() {
    let days = [
        humantime::parse_rfc3339("2026-11-30T00:00:00Z").unwrap(),
        humantime::parse_rfc3339("2026-12-31T00:00:00Z").unwrap(),
        humantime::parse_rfc3339("2028-02-28T00:00:00Z").unwrap(),
    ];
    for day in days {
        for quarter in 0..96u64 {
            let now = day + Duration::from_secs(quarter * 900);
            let ten_ago = now - Duration::from_secs(600);
            let kst = with_kst_offset(ten_ago);
            assert_eq!(auth::parse_date(&kst), Some(ten_ago), "{kst}");
            auth::check_date(&kst, now).unwrap_or_else(|e| panic!("{kst}: {e}"));
            let utc = humantime::format_rfc3339_millis(ten_ago).to_string();
            auth::check_date(&utc, now).unwrap_or_else(|e| panic!("{utc}: {e}"));
            let far = with_kst_offset(now - Duration::from_secs(1200));
            assert_eq!(
                auth::check_date(&far, now),
                Err(auth::AuthError::RequestTimeTooSkewed),
                "{far}"
            );
        }
    }
}

#[tokio::test]
async fn auth_failures_are_403_with_the_right_code() {
    let mock = start(config()).await;

    let e = client_with(&mock, "wrong-key", SECRET)
        .create_group(&BTreeMap::new())
        .await
        .unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(403),
        Some("InvalidAPIKey"),
    );
    let e = client_with(&mock, KEY, "wrong-secret")
        .create_group(&BTreeMap::new())
        .await
        .unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Permanent,
        Some(403),
        Some("SignatureDoesNotMatch"),
    );
    // No credential in the error.
    assert!(!e.to_string().contains(SECRET) && !e.to_string().contains("wrong-secret"));

    let post = reqwest::Method::POST;
    let path = "/messages/v4/groups";
    // Validly signed, but dated 20 minutes ago / ahead.
    for offset in [-1200i64, 1200] {
        let t = if offset < 0 {
            SystemTime::now() - Duration::from_secs(offset.unsigned_abs())
        } else {
            SystemTime::now() + Duration::from_secs(offset as u64)
        };
        let date = humantime::format_rfc3339_millis(t).to_string();
        let h = auth::authorization(KEY, SECRET, &date, &auth::new_salt());
        let (status, body) = raw(&mock, post.clone(), path, Some(h), None).await;
        assert_eq!(
            (status, body["errorCode"].as_str()),
            (403, Some("RequestTimeTooSkewed"))
        );
    }
    // Within the window (10 minutes off, with an offset form) is fine, at
    // whatever hour this runs (the +09:00 form rolls the date over at 15:00 UTC).
    let date = with_kst_offset(SystemTime::now() - Duration::from_secs(600));
    let h = auth::authorization(KEY, SECRET, &date, &auth::new_salt());
    let (status, _) = raw(&mock, post.clone(), path, Some(h), None).await;
    assert_eq!(status, 200, "{date}");

    // Replay: the same header twice.
    let h = signed();
    let (status, _) = raw(&mock, post.clone(), path, Some(h.clone()), None).await;
    assert_eq!(status, 200);
    let (status, body) = raw(&mock, post.clone(), path, Some(h), None).await;
    assert_eq!(
        (status, body["errorCode"].as_str()),
        (403, Some("DuplicatedSignature"))
    );

    // Malformed or missing headers.
    let sig = "0".repeat(64);
    for bad in [
        Some(format!("Bearer {sig}")),
        Some(format!(
            "HMAC-SHA256 apiKey={KEY}, salt=0123456789abcdef, signature={sig}"
        )),
        Some(format!(
            "HMAC-SHA256 apiKey={KEY}, date=yesterday, salt=0123456789abcdef, signature={sig}"
        )),
        Some(format!(
            "HMAC-SHA256 apiKey={KEY}, date={}, salt=short, signature={sig}",
            auth::now_date()
        )),
        None,
    ] {
        let (status, body) = raw(&mock, post.clone(), path, bad.clone(), None).await;
        assert_eq!(
            (status, body["errorCode"].as_str()),
            (403, Some("InvalidAuthorizationHeader")),
            "{bad:?}"
        );
        assert!(body["errorMessage"].is_string());
    }
    // Nothing was created by any refused request.
    assert_eq!(mock.ledger().groups.len(), 2);
}

#[tokio::test]
async fn server_error_is_transient_without_effect() {
    let mock = start(MockConfig {
        faults: Faults {
            error_rate: 1.0,
            ..Faults::default()
        },
        ..config()
    })
    .await;
    let c = client(&mock);
    let e = c.create_group(&BTreeMap::new()).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::Transient,
        Some(500),
        Some("InternalError"),
    );
    assert_eq!(e.retry_decision(), RetryDecision::RetryWithBackoff);
    let s = mock.ledger_summary();
    assert!(s.groups.is_empty());
    assert_eq!(s.totals.faults.errors, 1);
    assert_eq!(s.totals.requests["create"], 1);
}

#[tokio::test]
async fn rate_limit_is_429_with_retry_after() {
    let mock = start(MockConfig {
        faults: Faults {
            rate_limit_per_sec: Some(0),
            retry_after_secs: 7,
            ..Faults::default()
        },
        ..config()
    })
    .await;
    let c = client(&mock);
    let e = c.create_group(&BTreeMap::new()).await.unwrap_err();
    assert_err(
        &e,
        ProviderErrorKind::RateLimited,
        Some(429),
        Some("TooManyRequests"),
    );
    assert_eq!(
        e.retry_decision(),
        RetryDecision::RetryAfter(Duration::from_secs(7))
    );
    assert_eq!(mock.ledger_summary().totals.faults.rate_limited, 1);

    // A limit of 2 per second lets some through and refuses the rest.
    mock.set_faults(Faults {
        rate_limit_per_sec: Some(2),
        ..Faults::default()
    });
    let mut ok = 0;
    let mut limited = 0;
    for _ in 0..6 {
        match c.get_group("G4VNONE").await {
            Err(e) if e.kind() == ProviderErrorKind::RateLimited => {
                assert_eq!(
                    e.retry_decision(),
                    RetryDecision::RetryAfter(Duration::from_secs(1))
                );
                limited += 1
            }
            Err(e) if e.status() == Some(404) => ok += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(ok >= 2 && limited >= 1, "ok {ok} limited {limited}");
}

#[tokio::test]
async fn error_count_as_string_parses() {
    let mock = start(MockConfig {
        error_count_as_string: true,
        ..config()
    })
    .await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let (status, body) = raw(
        &mock,
        reqwest::Method::PUT,
        &format!("/messages/v4/groups/{}/messages", g.group_id),
        Some(signed()),
        Some(json!({"messages": [msg("01011112222"), msg("bad")]})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["errorCount"], "1");
    let resp = c
        .add_messages_once(
            &g.group_id,
            &[msg("01011112222"), msg("bad"), msg("01099998888")],
        )
        .await
        .unwrap();
    assert_eq!(resp.error_count, 2);
    assert_eq!(resp.result_list[2].status_code, "2000");
}

#[tokio::test]
async fn dropped_add_then_retry_registers_nothing_twice() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&fields("drop")).await.unwrap();
    let msgs: Vec<Message> = (0..50).map(|i| msg(&number(i))).collect();

    mock.set_faults(Faults {
        drop_rate: 1.0,
        ..Faults::default()
    });
    let e = c.add_messages(&g.group_id, &msgs).await.unwrap_err();
    assert_eq!(e.kind(), ProviderErrorKind::Transient, "{e}");
    assert_eq!(e.status(), None, "a drop is not a status: {e}");
    assert_eq!(e.retry_decision(), RetryDecision::RetryWithBackoff);

    mock.set_faults(Faults::default());
    let regs = c.add_messages(&g.group_id, &msgs).await.unwrap();
    assert!(
        regs.iter().all(|r| *r == Registration::Duplicate),
        "{regs:?}"
    );

    let l = mock.ledger();
    let m = &l.groups[0].messages;
    assert_eq!(m.len(), 100);
    for (i, entry) in m.iter().enumerate() {
        assert_eq!(entry.to, number(i % 50));
        assert_eq!(entry.status_code, if i < 50 { "2000" } else { "1026" });
    }
    let s = mock.ledger_summary();
    assert!(s.duplicate_registrations.is_empty());
    assert_eq!(s.totals.faults.drops, 1);
    assert_eq!(s.groups[0].count.registered_success, 50);
}

#[tokio::test]
async fn dropped_send_then_retry_is_409_and_first_counts() {
    let mock = start(MockConfig {
        complete_after: Duration::from_secs(3600),
        ..config()
    })
    .await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.add_messages(&g.group_id, &[msg("01011112222")])
        .await
        .unwrap();
    mock.set_faults(Faults {
        drop_rate: 1.0,
        ..Faults::default()
    });
    let e = c.send_group(&g.group_id).await.unwrap_err();
    assert_eq!(e.kind(), ProviderErrorKind::Transient, "{e}");
    mock.set_faults(Faults::default());
    let e = c.send_group(&g.group_id).await.unwrap_err();
    assert_eq!(e.kind(), ProviderErrorKind::AlreadySent, "{e}");
    assert_eq!(e.retry_decision(), RetryDecision::AlreadyDone);

    let calls = &mock.ledger().groups[0].send_calls;
    assert_eq!(calls.iter().filter(|c| c.status == 200).count(), 1);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].status, 409);
    assert_eq!(
        c.get_group(&g.group_id).await.unwrap().status,
        GroupStatus::Sending
    );
}

#[tokio::test]
async fn stall_and_client_timeout_are_transient() {
    let mock = start(config()).await;
    let c = ProviderClient::new(ProviderConfig {
        base_url: mock.base_url(),
        api_key: KEY.into(),
        api_secret: SECRET.into(),
        request_timeout: Duration::from_millis(200),
        ..ProviderConfig::default()
    })
    .unwrap();
    mock.set_faults(Faults {
        stall_ms: 2_000,
        ..Faults::default()
    });
    let started = Instant::now();
    let e = c.create_group(&BTreeMap::new()).await.unwrap_err();
    assert_eq!(e.kind(), ProviderErrorKind::Transient, "{e}");
    assert!(started.elapsed() < Duration::from_millis(1_900));
    assert_eq!(mock.faults().stall_ms, 2_000);
    assert_eq!(mock.ledger_summary().totals.faults.stalled, 1);

    // A short stall delays (at least stall_ms) but answers. (The client is
    // built first: building one loads the TLS roots, which can take longer
    // than the stall window.)
    let c = client(&mock);
    mock.set_faults(Faults {
        stall_ms: 300,
        latency_ms: 10,
        ..Faults::default()
    });
    let started = Instant::now();
    let e = c.get_group("G4VNONE").await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e}");
    assert!(
        started.elapsed() >= Duration::from_millis(310),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn connection_refused_is_transient() {
    let mock = start(config()).await;
    let url = mock.base_url();
    mock.shutdown().await.unwrap();
    let c = ProviderClient::new(ProviderConfig {
        base_url: url,
        ..ProviderConfig::default()
    })
    .unwrap();
    let e = c.get_group("G4V1").await.unwrap_err();
    assert_eq!(e.kind(), ProviderErrorKind::Transient, "{e}");
    assert_eq!(e.status(), None);
}

#[tokio::test]
async fn ledger_faults_and_reset_over_http() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&fields("http")).await.unwrap();
    c.add_messages(&g.group_id, &[msg("01011112222"), msg("x")])
        .await
        .unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let _ = c.send_group(&g.group_id).await;

    let http = reqwest::Client::new();
    let base = mock.base_url();
    let l: mock::LedgerSnapshot = http
        .get(format!("{base}/_mock/ledger"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(l, mock.ledger());
    assert_eq!(l.groups[0].group_id, g.group_id);
    assert_eq!(l.groups[0].send_calls.len(), 2);

    let raw_summary: Value = http
        .get(format!("{base}/_mock/ledger/summary"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(raw_summary["groups"][0]["statusCodes"]["1062"], 1);
    assert_eq!(raw_summary["groups"][0]["sendCalls"][1]["status"], 409);
    assert_eq!(raw_summary["totals"]["requests"]["send"], 2);
    assert!(raw_summary["groups"][0].get("messages").is_none());
    let s: mock::LedgerSummary = serde_json::from_value(raw_summary).unwrap();
    assert_eq!(s.totals.registered, 1);
    assert_eq!(s.totals.messages, 2);

    let f: Value = http
        .post(format!("{base}/_mock/faults"))
        .json(&json!({"errorRate": 0.25, "retryAfterSecs": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(f["errorRate"], 0.25);
    assert_eq!(mock.faults().retry_after_secs, 3);
    let f: Faults = http
        .get(format!("{base}/_mock/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(f.error_rate, 0.25);

    let r = http
        .post(format!("{base}/_mock/reset"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert!(mock.ledger().groups.is_empty());
    assert_eq!(mock.faults(), Faults::default());
    assert_eq!(mock.ledger_summary().totals.requests["create"], 0);
    // Ids are not reused after a reset.
    let g2 = c.create_group(&BTreeMap::new()).await.unwrap();
    assert_ne!(g2.group_id, g.group_id);
}

#[tokio::test]
async fn malformed_bodies_get_error_bodies() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let (status, body) = raw(
        &mock,
        reqwest::Method::PUT,
        &format!("/messages/v4/groups/{}/messages", g.group_id),
        Some(signed()),
        Some(json!({"nope": 1})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(body["errorCode"].is_string() && body["errorMessage"].is_string());
    let (status, body) = raw(&mock, reqwest::Method::GET, "/nowhere", None, None).await;
    assert_eq!(
        (status, body["errorCode"].as_str()),
        (404, Some("ResourceNotFound"))
    );
}

/// The client records its metrics: run everything on one thread inside a
/// local recorder.
#[test]
fn client_records_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let mock = start(config()).await;
            let c = client(&mock);
            let g = c.create_group(&BTreeMap::new()).await.unwrap();
            c.get_group(&g.group_id).await.unwrap();
            c.get_group("G4VNONE").await.unwrap_err();
            mock.set_faults(Faults {
                drop_rate: 1.0,
                ..Faults::default()
            });
            c.get_group(&g.group_id).await.unwrap_err();
        })
    });
    let text = handle.render();
    for line in [
        r#"groupcast_provider_requests_total{endpoint="create",status="200"} 1"#,
        r#"groupcast_provider_requests_total{endpoint="get",status="200"} 1"#,
        r#"groupcast_provider_requests_total{endpoint="get",status="404"} 1"#,
        r#"groupcast_provider_requests_total{endpoint="get",status="error"} 1"#,
        r#"groupcast_provider_request_duration_seconds_count{endpoint="get"} 3"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}
