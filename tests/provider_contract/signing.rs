//! Signing requests, and the provider refusing bad credentials, skewed
//! dates, replays and malformed headers.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use groupcast::provider::{auth, ProviderErrorKind};

use crate::{assert_err, client_with, config, raw, signed, start, KEY, SECRET};

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
