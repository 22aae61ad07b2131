//! The message list (`GET /messages/v4/list`) and the mock's delivery
//! hooks: injected registration failures and delivery results.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use groupcast::provider::{
    Group, GroupStatus, ListedMessage, Message, ProviderClient, Registration,
};
use groupcast_rigs::mock::{Faults, LedgerMessage, MockHandle};
use reqwest::Method;

use crate::{client, codes, config, msg, number, raw, signed, start};

/// Every page of a group, with the size of each page.
async fn list_all(
    c: &ProviderClient,
    group_id: &str,
    limit: u32,
) -> (Vec<ListedMessage>, Vec<usize>) {
    let mut all = Vec::new();
    let mut sizes = Vec::new();
    let mut key: Option<String> = None;
    loop {
        let page = c
            .list_messages(group_id, key.as_deref(), limit)
            .await
            .unwrap();
        sizes.push(page.messages.len());
        all.extend(page.messages);
        match page.next_key {
            Some(k) => key = Some(k),
            None => return (all, sizes),
        }
        assert!(sizes.len() < 10_000, "paging never ends");
    }
}

fn messages(n: usize) -> Vec<Message> {
    (0..n).map(|i| msg(&number(i))).collect()
}

/// Reads the group until it is COMPLETE (bounded).
async fn complete(c: &ProviderClient, group_id: &str) -> Group {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let g = c.get_group(group_id).await.unwrap();
        if g.status == GroupStatus::Complete {
            return g;
        }
        assert!(
            Instant::now() < deadline,
            "group {group_id} never completed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The ledger's messages of one group, by message id.
fn ledger_messages(mock: &MockHandle, group_id: &str) -> HashMap<String, LedgerMessage> {
    mock.ledger()
        .groups
        .into_iter()
        .find(|g| g.group_id == group_id)
        .expect("group in the ledger")
        .messages
        .into_iter()
        .map(|m| (m.message_id.clone(), m))
        .collect()
}

/// The list and the ledger agree on every message: same number, and the
/// ledger's final status is the listed code exactly when that is final.
fn assert_agree(listed: &[ListedMessage], ledger: &HashMap<String, LedgerMessage>) {
    assert_eq!(listed.len(), ledger.len());
    for m in listed {
        let l = &ledger[&m.message_id];
        assert_eq!(l.to, m.to, "{}", m.message_id);
        let expected = (m.is_final() && m.status_code != "1026").then(|| m.status_code.clone());
        assert_eq!(l.final_status, expected, "{}", m.message_id);
    }
}

async fn list_raw(mock: &MockHandle, query: &str) -> (u16, serde_json::Value) {
    raw(
        mock,
        Method::GET,
        &format!("/messages/v4/list?{query}"),
        Some(signed()),
        None,
    )
    .await
}

#[tokio::test]
async fn list_pages_every_message_once_with_the_add_ids() {
    let mock = start(config()).await;
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let regs = c.add_messages(&g.group_id, &messages(1_234)).await.unwrap();
    let ids: Vec<String> = regs
        .iter()
        .map(|r| match r {
            Registration::Registered { message_id } => message_id.clone(),
            other => panic!("{other:?}"),
        })
        .collect();

    let (listed, sizes) = list_all(&c, &g.group_id, 500).await;
    assert_eq!(sizes, [500, 500, 234]);
    let listed_ids: Vec<&str> = listed.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(
        listed_ids, ids,
        "every message once, in add order, same ids"
    );
    assert_eq!(
        listed
            .iter()
            .map(|m| &m.message_id)
            .collect::<HashSet<_>>()
            .len(),
        1_234
    );
    for (i, m) in listed.iter().enumerate() {
        assert_eq!(m.to, number(i));
        assert_eq!(m.group_id, g.group_id);
        assert_eq!(m.status_code, "2000", "not sent yet");
        assert!(!m.is_final());
    }

    for bad in ["0", "501", "x", "-1"] {
        let (status, body) = list_raw(&mock, &format!("groupId={}&limit={bad}", g.group_id)).await;
        assert_eq!(status, 400, "limit {bad}: {body}");
        assert_eq!(body["errorCode"], "ValidationError");
    }
    let e = c.list_messages(&g.group_id, None, 0).await.unwrap_err();
    assert_eq!(e.status(), Some(400));
    let (status, body) = list_raw(
        &mock,
        &format!("groupId={}&startKey=nonsense&limit=5", g.group_id),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Without a limit: 100; the raw answer's shape.
    let (status, body) = list_raw(&mock, &format!("groupId={}", g.group_id)).await;
    assert_eq!(status, 200);
    assert_eq!(body["limit"], 100);
    assert_eq!(body["startKey"], serde_json::Value::Null);
    let list = body["messageList"].as_object().unwrap();
    assert_eq!(list.len(), 100);
    let first = &list[&ids[0]];
    assert_eq!(first["messageId"], ids[0].as_str());
    assert_eq!(first["replacement"], false);
    assert_eq!(first["dateReported"], serde_json::Value::Null);
    assert_eq!(body["nextKey"], ids[100].as_str());
    // A page starts at its key.
    let page = c
        .list_messages(&g.group_id, Some(&ids[1_000]), 500)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 234);
    assert_eq!(page.messages[0].message_id, ids[1_000]);
    assert_eq!(page.next_key, None);

    // An unknown group: 200, empty.
    let page = c.list_messages("G4Vnope", None, 10).await.unwrap();
    assert!(page.messages.is_empty() && page.next_key.is_none());
    // The list is a provider route: authenticated like the others.
    let (status, _) = raw(
        &mock,
        Method::GET,
        &format!("/messages/v4/list?groupId={}", g.group_id),
        None,
        None,
    )
    .await;
    assert_eq!(status, 403);
    assert!(mock.ledger_summary().totals.requests["messages"] >= 8);
}

#[tokio::test]
async fn delivery_results_match_the_group_count() {
    let mock = start(config()).await;
    mock.set_faults(Faults {
        delivery_failure_rate: 0.3,
        never_final_rate: 0.1,
        ..Faults::default()
    });
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    c.add_messages(&g.group_id, &messages(2_000)).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    let done = complete(&c, &g.group_id).await;

    let (listed, _) = list_all(&c, &g.group_id, 500).await;
    assert_eq!(listed.len(), 2_000);
    let mut by_code: BTreeMap<&str, u64> = BTreeMap::new();
    for m in &listed {
        *by_code.entry(m.status_code.as_str()).or_default() += 1;
        assert!(
            ["4000", "3000", "3104", "3043"].contains(&m.status_code.as_str()),
            "{m:?}"
        );
        assert_eq!(m.is_final(), m.status_code != "3000");
        if !m.is_delivered() && m.is_final() {
            assert!(!m.reason.is_empty());
        }
    }
    let delivered = by_code.get("4000").copied().unwrap_or(0);
    let pending = by_code.get("3000").copied().unwrap_or(0);
    let failed = 2_000 - delivered - pending;
    assert!((120..=280).contains(&pending), "never final: {pending}");
    assert!((450..=750).contains(&failed), "failed: {failed}");
    assert!(
        by_code.contains_key("3104") && by_code.contains_key("3043"),
        "{by_code:?}"
    );
    assert_eq!(done.count.sent_total, 2_000);
    assert_eq!(done.count.sent_success, delivered);
    assert_eq!(done.count.sent_failed, failed);
    assert_eq!(done.count.sent_pending, pending);
    assert_eq!(done.count.sent_replacement, 0);
    assert_agree(&listed, &ledger_messages(&mock, &g.group_id));
    let summary = mock.ledger_summary();
    assert_eq!(summary.final_status_codes["4000"], delivered);
    assert_eq!(
        summary.groups[0].final_status_codes.values().sum::<u64>(),
        delivered + failed
    );

    // The statusCode filter pages through the matching messages only.
    let (status, body) = list_raw(
        &mock,
        &format!("groupId={}&limit=500&statusCode=3000", g.group_id),
    )
    .await;
    assert_eq!(status, 200);
    let list = body["messageList"].as_object().unwrap();
    assert_eq!(list.len() as u64, pending);
    assert!(list.values().all(|m| m["statusCode"] == "3000"));
    assert_eq!(body["nextKey"], serde_json::Value::Null);

    // A long delay, set now, holds every result of a group sent after it;
    // the group sent before keeps its results.
    mock.set_faults(Faults {
        delivery_delay_ms: 3_600_000,
        ..Faults::default()
    });
    let late = c.create_group(&BTreeMap::new()).await.unwrap();
    c.add_messages(&late.group_id, &messages(700))
        .await
        .unwrap();
    c.send_group(&late.group_id).await.unwrap();
    let late_done = complete(&c, &late.group_id).await;
    assert_eq!(late_done.count.sent_total, 700);
    assert_eq!(late_done.count.sent_pending, 700);
    assert_eq!(
        late_done.count.sent_success + late_done.count.sent_failed,
        0
    );
    let (late_listed, _) = list_all(&c, &late.group_id, 500).await;
    assert_eq!(late_listed.len(), 700);
    assert!(late_listed
        .iter()
        .all(|m| m.status_code == "3000" && !m.is_final()));
    assert_agree(&late_listed, &ledger_messages(&mock, &late.group_id));
    assert_eq!(c.get_group(&g.group_id).await.unwrap().count, done.count);
}

#[tokio::test]
async fn registration_failures_are_decided_by_the_number() {
    let mock = start(config()).await;
    // Over HTTP too; settings that make no sense are refused.
    let http = reqwest::Client::new();
    for (body, status) in [
        (serde_json::json!({"neverFinalRate": 2.0}), 400),
        (
            serde_json::json!({"registrationFailureCodes": ["2000"]}),
            400,
        ),
        (serde_json::json!({"deliveryFailureCodes": []}), 400),
        (
            serde_json::json!({"registrationFailureRate": 0.25,
                               "registrationFailureCodes": ["1062", "1000"]}),
            200,
        ),
    ] {
        let r = http
            .post(format!("{}/_mock/faults", mock.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
    }
    assert_eq!(mock.faults().registration_failure_rate, 0.25);
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let batch = messages(2_000);
    let first = codes(&c.add_messages(&g.group_id, &batch).await.unwrap());
    let failed = first.iter().filter(|c| *c != "2000").count();
    assert!((350..=650).contains(&failed), "{failed}");
    assert!(first
        .iter()
        .all(|c| ["2000", "1062", "1000"].contains(&c.as_str())));
    assert!(first.contains(&"1062".to_owned()) && first.contains(&"1000".to_owned()));

    // A retried add: the same failures, and 1026 for the registered ones.
    let again = codes(&c.add_messages(&g.group_id, &batch).await.unwrap());
    for (a, b) in first.iter().zip(&again) {
        if a == "2000" {
            assert_eq!(b, "1026");
        } else {
            assert_eq!(a, b);
        }
    }
    // Another group: the same numbers get the same answers.
    let other = c.create_group(&BTreeMap::new()).await.unwrap();
    let there = codes(&c.add_messages(&other.group_id, &batch).await.unwrap());
    assert_eq!(first, there);

    let read = c.get_group(&g.group_id).await.unwrap();
    assert_eq!(read.count.registered_success, 2_000 - failed as u64);
    assert_eq!(read.count.registered_failed, 2_000 + failed as u64);
    // The list says what the answers said.
    let (listed, _) = list_all(&c, &g.group_id, 500).await;
    assert_eq!(listed.len(), 4_000);
    let listed_codes: Vec<&str> = listed.iter().map(|m| m.status_code.as_str()).collect();
    let answered: Vec<&str> = first.iter().chain(&again).map(String::as_str).collect();
    assert_eq!(listed_codes, answered);
    assert_agree(&listed, &ledger_messages(&mock, &g.group_id));
    let summary = mock.ledger_summary();
    assert_eq!(
        summary.groups[0].status_codes["1026"],
        2_000 - failed as u64,
        "{:?}",
        summary.groups[0].status_codes
    );

    // After the send the registration failures stay as they were.
    c.send_group(&g.group_id).await.unwrap();
    let done = complete(&c, &g.group_id).await;
    assert_eq!(done.count.sent_success, 2_000 - failed as u64);
    let (after, _) = list_all(&c, &g.group_id, 500).await;
    for (m, code) in after.iter().zip(&answered) {
        match *code {
            "2000" => assert_eq!(m.status_code, "4000"),
            c => assert_eq!(m.status_code, c),
        }
    }
    assert_agree(&after, &ledger_messages(&mock, &g.group_id));
}

#[tokio::test]
async fn client_reads_every_page_and_agrees_with_the_ledger() {
    let mock = start(config()).await;
    mock.set_faults(Faults {
        registration_failure_rate: 0.1,
        delivery_failure_rate: 0.2,
        delivery_failure_codes: vec!["3104".into(), "3107".into(), "3054".into()],
        never_final_rate: 0.05,
        ..Faults::default()
    });
    let c = client(&mock);
    let g = c.create_group(&BTreeMap::new()).await.unwrap();
    let mut batch = messages(1_500);
    batch.push(msg("not a number"));
    c.add_messages(&g.group_id, &batch).await.unwrap();
    c.send_group(&g.group_id).await.unwrap();
    complete(&c, &g.group_id).await;
    let (listed, sizes) = list_all(&c, &g.group_id, 137).await;
    assert_eq!(sizes.len(), 1_501usize.div_ceil(137));
    let ledger = ledger_messages(&mock, &g.group_id);
    assert_agree(&listed, &ledger);
    let finals: BTreeMap<String, u64> =
        listed
            .iter()
            .filter(|m| m.is_final())
            .fold(BTreeMap::new(), |mut acc, m| {
                *acc.entry(m.status_code.clone()).or_default() += 1;
                acc
            });
    assert_eq!(mock.ledger_summary().groups[0].final_status_codes, finals);
    assert!(
        finals.contains_key("3107") && finals.contains_key("1062"),
        "{finals:?}"
    );
}
