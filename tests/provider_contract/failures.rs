//! Failures the client must survive: server errors, rate limits, dropped
//! answers, stalls and refused connections.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::provider::{
    GroupStatus, Message, ProviderClient, ProviderConfig, ProviderErrorKind, Registration,
    RetryDecision,
};
use groupcast_rigs::mock::{Faults, MockConfig};
use serde_json::json;

use crate::{assert_err, client, config, fields, msg, number, raw, signed, start, KEY, SECRET};

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
