//! A send, or its poll, given up for good still ends its batch, truthfully:
//! a send refused for good under its claim is recalled (its group deleted,
//! counted unsent); a send whose answer was lost is found sent by its recall
//! and counted; a send refused by the count check ends unsent at once; a
//! poll refused for good (404) ends with its recipients' fate unknown. Each
//! asserts from the mock's ledger and the webhook: one report, the outcome
//! and counts, nothing sent twice, and no send after a redrive.

use std::time::Duration;

use groupcast::events::Event;
use groupcast::producer::append_chunks;
use groupcast::provider::GroupStatus;
use groupcast::provider::{Message, MessageType};
use groupcast::verify::verify_batch;
use groupcast::worker::WorkerConfig;
use groupcast_rigs::mock::EndpointFault;

use super::cancel::wait_work_handled;
use super::input::{chunk, the_report, wait_dead_letters};
use super::retry::{rig_with_hook, wait_state, wait_until, Hook};
use crate::common::*;

const REFUSED: EndpointFault = EndpointFault {
    status: 403,
    after_effect: false,
};

/// One generation of `n` recipients, flagged last.
async fn one_generation(rig: &Rig, batch: &str, n: usize) {
    let people = recipients(47, n);
    append_chunks(&rig.store, &[chunk(batch, 0, true, people)])
        .await
        .expect("append");
}

/// The `generation_failed` events of `batch`: (op, recall).
async fn give_ups(rig: &Rig, batch: &str) -> Vec<(String, bool)> {
    let events = rig.store.batch(batch).events().await.expect("events");
    events
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|r| match r.event {
            Event::GenerationFailed(e) => Some((e.op, e.recall)),
            _ => None,
        })
        .collect()
}

/// The mock's groups of `batch`: (status, accepted send calls).
fn groups_of(rig: &Rig, batch: &str) -> Vec<(GroupStatus, usize)> {
    rig.mock
        .ledger()
        .groups
        .iter()
        .filter(|g| g.custom_fields.get("batchId").map(String::as_str) == Some(batch))
        .map(|g| {
            let accepted = g.send_calls.iter().filter(|c| c.status == 200).count();
            (g.status, accepted)
        })
        .collect()
}

/// One generation of `n` recipients, ready, its send held at its first
/// step (every read of a group fails, 500) until the caller lets the reads
/// through (`fail_endpoint("get", None)`); returns the generation's group.
async fn ready_with_reads_held(rig: &Rig, batch: &str, n: usize) -> String {
    rig.mock.fail_endpoint(
        "get",
        Some(EndpointFault {
            status: 500,
            after_effect: false,
        }),
    );
    one_generation(rig, batch, n).await;
    let log = rig.store.batch(batch);
    wait_state(&log, "g:0:ready", |s| s.get("g:0:ready").is_some()).await;
    log.group_of(0).await.expect("state").expect("a group")
}

/// Redrives every dead letter, waits until the work they became is
/// handled, and returns how many there were.
async fn redrive_all(rig: &Rig) -> usize {
    let letters = rig.store.dead_letter_entries().await.expect("letters");
    for (shard, letter) in &letters {
        rig.store
            .redrive_letter(*shard, letter)
            .await
            .expect("redrive");
    }
    wait_work_handled(rig).await;
    letters.len()
}

/// The provider refuses the send for good (403) after the claim: the send
/// is given up with its claim in place, so it is recalled: the group is
/// deleted at the provider (never sent), the generation is done `unsent`,
/// and the batch reports `failed` with every registered recipient unsent.
/// A redrive of the dead-lettered send afterwards sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_refused_for_good_is_recalled_and_the_batch_reports_unsent() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    rig.mock.fail_endpoint("send", Some(REFUSED));
    let batch = "send-refused";
    one_generation(&rig, batch, 100).await;
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["registered"], 100, "{report}");
    assert_eq!(report["unsent"], 100, "{report}");
    assert_eq!(report["sent_success"], 0, "{report}");
    assert_eq!(
        give_ups(&rig, batch).await,
        vec![("send".to_string(), true)],
        "given up under its claim: recalled"
    );
    let letters = wait_dead_letters(&rig, 1).await;
    assert!(letters[0].1.contains("403"), "{letters:?}");
    assert_eq!(
        groups_of(&rig, batch),
        vec![(GroupStatus::Deleted, 0)],
        "the group is deleted at the provider, never sent"
    );
    rig.verify(&[batch.to_string()]).await;
    // The provider takes sends again; a redrive of the send finds it given
    // up and sends nothing.
    rig.mock.fail_endpoint("send", None);
    assert_eq!(redrive_all(&rig).await, 1);
    assert_eq!(groups_of(&rig, batch), vec![(GroupStatus::Deleted, 0)]);
    assert_eq!(reports_of(&hook, batch), 1, "one report");
    rig.stop().await;
}

/// The send goes out but its answer is lost (500), and the worker gives up
/// at once (`--max-attempts 1`): the recall finds the group no longer
/// pending (the provider refuses to delete it), so the send is recorded as
/// sent and polled: the batch reports `completed`, sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_given_up_after_it_went_out_is_found_sent_by_its_recall() {
    let config = WorkerConfig {
        max_attempts: 1,
        ..test_config()
    };
    let (rig, hook) = rig_with_hook(2, config, mock_config()).await;
    rig.mock.fail_endpoint(
        "send",
        Some(EndpointFault {
            status: 500,
            after_effect: true,
        }),
    );
    let batch = "send-answer-lost";
    one_generation(&rig, batch, 100).await;
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["sent_success"], 100, "{report}");
    assert_eq!(report["unsent"], 0, "{report}");
    assert_eq!(report["unknown"], 0, "{report}");
    assert_eq!(
        give_ups(&rig, batch).await,
        vec![("send".to_string(), true)]
    );
    assert_eq!(
        groups_of(&rig, batch),
        vec![(GroupStatus::Complete, 1)],
        "sent once"
    );
    rig.mock.fail_endpoint("send", None);
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// The provider holds a message our events do not know of: the count check
/// refuses the send before any claim, so nothing went out. The generation
/// is done `unsent` at once and its group deleted; the batch reports
/// `failed`. `verify` still names the refused send (the provider and our
/// events disagree), and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_refused_by_the_count_check_ends_unsent() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "count-refused";
    let group = ready_with_reads_held(&rig, batch, 50).await;
    let foreign = Message {
        to: "01099990000".into(),
        from: "0212345678".into(),
        r#type: MessageType::Sms,
        text: "not ours".into(),
        kakao_options: None,
    };
    rig.provider
        .add_messages(&group, &[foreign])
        .await
        .expect("a foreign add");
    rig.mock.fail_endpoint("get", None);
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["unsent"], 50, "{report}");
    assert_eq!(
        give_ups(&rig, batch).await,
        vec![("send".to_string(), false)],
        "refused before any claim: nothing to recall"
    );
    wait_until("the group is deleted", Duration::from_secs(20), || async {
        groups_of(&rig, batch) == vec![(GroupStatus::Deleted, 0)]
    })
    .await;
    let v = verify_batch(&rig.store, Some(&rig.provider), batch, rig.config.group_cap)
        .await
        .expect("verify");
    let failures: Vec<String> = v.failures().iter().map(|c| c.detail.clone()).collect();
    assert!(
        failures.len() == 1 && failures[0].contains("send refused"),
        "only the refused send: {failures:#?}"
    );
    assert_eq!(redrive_all(&rig).await, 1);
    assert_eq!(groups_of(&rig, batch), vec![(GroupStatus::Deleted, 0)]);
    rig.stop().await;
}

/// The group was sent, then every read of it is answered 404: the poll is
/// given up, the generation is done `unknown`, and the batch reports
/// `partial` with its registered recipients' fate unknown, sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poll_refused_for_good_ends_with_the_outcome_unknown() {
    // Groups stay SENDING long enough for the 404 to come first.
    let mock = groupcast_rigs::mock::MockConfig {
        complete_after: Duration::from_secs(3600),
        ..mock_config()
    };
    let (rig, hook) = rig_with_hook(2, test_config(), mock).await;
    let batch = "poll-404";
    one_generation(&rig, batch, 100).await;
    let log = rig.store.batch(batch);
    wait_state(&log, "g:0:sent", |s| s.get("g:0:sent").is_some()).await;
    rig.mock.fail_endpoint(
        "get",
        Some(EndpointFault {
            status: 404,
            after_effect: false,
        }),
    );
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "partial", "{report}");
    assert_eq!(report["registered"], 100, "{report}");
    assert_eq!(report["unknown"], 100, "{report}");
    assert_eq!(report["unsent"], 0, "{report}");
    assert_eq!(
        give_ups(&rig, batch).await,
        vec![("poll".to_string(), false)]
    );
    assert_eq!(groups_of(&rig, batch), vec![(GroupStatus::Sending, 1)]);
    rig.mock.fail_endpoint("get", None);
    rig.verify(&[batch.to_string()]).await;
    assert_eq!(redrive_all(&rig).await, 1);
    assert_eq!(groups_of(&rig, batch), vec![(GroupStatus::Sending, 1)]);
    assert_eq!(reports_of(&hook, batch), 1, "one report");
    rig.stop().await;
}

/// The generation's group is deleted at the provider with no cancel on
/// record (a cancel Redis lost after its delete went out, or a deletion by
/// hand in the provider's console): the send finds it deleted and gives up;
/// the generation ends `unsent` and the batch reports `failed`, where it
/// used to wait for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_deleted_behind_our_back_ends_unsent() {
    let (rig, hook) = rig_with_hook(2, test_config(), mock_config()).await;
    let batch = "deleted-behind";
    let group = ready_with_reads_held(&rig, batch, 30).await;
    rig.provider.delete_group(&group).await.expect("delete");
    rig.mock.fail_endpoint("get", None);
    let report = the_report(&rig, &hook, batch).await;
    assert_eq!(report["outcome"], "failed", "{report}");
    assert_eq!(report["unsent"], 30, "{report}");
    assert_eq!(
        give_ups(&rig, batch).await,
        vec![("send".to_string(), false)]
    );
    let letters = wait_dead_letters(&rig, 1).await;
    assert!(
        letters[0].1.contains("no cancel is on record"),
        "{letters:?}"
    );
    assert_eq!(groups_of(&rig, batch), vec![(GroupStatus::Deleted, 0)]);
    rig.verify(&[batch.to_string()]).await;
    rig.stop().await;
}

/// How many times the webhook got `batch`'s report (its delivery report,
/// if any, has another key).
fn reports_of(hook: &Hook, batch: &str) -> usize {
    hook.receipts()
        .iter()
        .filter(|(k, _)| k == &format!("{batch}:report"))
        .count()
}
