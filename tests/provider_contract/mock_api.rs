//! The mock's own HTTP surface (ledger, faults, reset, error bodies) and the
//! client's metrics.

use std::collections::BTreeMap;

use groupcast_rigs::mock::{self, Faults};
use serde_json::{json, Value};

use crate::{client, config, fields, msg, raw, signed, start};

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
