//! A group's life: create, add, send, get, delete, and every refusal on
//! the way (unknown group, too many messages, duplicates, invalid numbers,
//! the cap, a second send).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use groupcast::provider::{
    CreateGroupRequest, GroupStatus, Message, ProviderErrorKind, Registration, RetryDecision,
    MAX_MESSAGES_PER_REQUEST,
};
use groupcast_rigs::mock::MockConfig;
use serde_json::json;

use crate::{assert_err, client, codes, config, fields, msg, number, raw, signed, start};

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
