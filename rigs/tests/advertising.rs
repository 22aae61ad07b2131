//! Time zones that cannot go wrong, and advertising under Korean law
//! (docs/advertising.md), through the `groupcast` command: the CLI runs
//! with `TZ=UTC` (a container's clock) and sees the batch's zone, never the
//! machine's; an advertising text without `(광고)` or a free opt-out line is
//! refused before anything is appended or sent; `submit --ad` splits the
//! file by night consent, and nobody without it is sent between 21:00 and
//! 08:00 KST. The night rule's arithmetic at fixed instants (20:59:30 KST,
//! 21:00, 08:00) is unit-tested in `src/events/options.rs`; here the
//! worker's holds are checked against the real clock at whatever hour the
//! test runs.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use groupcast::events::options::{AdOptions, BatchOptions, SendWindow};
use groupcast::events::Event;
use jiff::{Timestamp, ToSpan};

const BIN: &str = env!("CARGO_BIN_EXE_groupcast");

/// Runs `groupcast` as on a container: `TZ=UTC`, and `GROUPCAST_TIMEZONE`
/// only when given.
fn groupcast(redis_url: &str, zone: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("GROUPCAST_REDIS_URL", redis_url)
        .env("GROUPCAST_PREFIX", "gct")
        .env("TZ", "UTC")
        .env_remove("GROUPCAST_LOG")
        .env_remove("GROUPCAST_TIMEZONE");
    if let Some(zone) = zone {
        c.env("GROUPCAST_TIMEZONE", zone);
    }
    c.output().expect("run groupcast")
}

/// `groupcast submit --ad` of batch `spring`, as on a container.
fn submit_ad(redis_url: &str, template: &str, recipients: &str) -> Output {
    groupcast(
        redis_url,
        None,
        &[
            "submit",
            "--ad",
            "--batch",
            "spring",
            "--template",
            template,
            "--recipients",
            recipients,
        ],
    )
}

/// The stderr of a command that must have failed with a usage error.
fn refused(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// Every chunk appended to shard 0's normal lane, decoded, in order.
async fn ingested(store: &groupcast::store::Store) -> Vec<groupcast::events::Chunk> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg(store.keys.ingest(0))
        .arg("-")
        .arg("+")
        .query_async(&mut store.raw_conn())
        .await
        .expect("xrange");
    groupcast::store::queue::parse_entries(&v)
        .iter()
        .map(|e| groupcast::events::Chunk::decode(e.get("d").expect("d")).expect("a chunk"))
        .collect()
}

const TEMPLATE: &str = r##"{"type": "ATA", "from": "0212345678", "text": "#{name}님 안녕하세요", "kakaoOptions": {"pfId": "PF", "templateId": "T"}}"##;
const AD_TEMPLATE: &str = r##"{"type": "ATA", "from": "0212345678", "text": "(광고) #{name}님, 봄 세일 20%\n무료수신거부 080-123-4567", "kakaoOptions": {"pfId": "PF", "templateId": "T"}}"##;

fn ms(s: &str) -> i64 {
    s.parse::<Timestamp>().expect("instant").as_millisecond()
}

#[tokio::test]
async fn quiet_hours_on_a_utc_machine_need_a_zone_and_take_groupcast_timezone() {
    let (server, store) = common::store(1).await;
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let template = write(dir.path(), "t.json", TEMPLATE);
    let recipients = write(dir.path(), "r.csv", "to,name\n01012345678,Kim\n");
    let args = |batch: &'static str| {
        vec![
            "submit".to_string(),
            "--batch".into(),
            batch.into(),
            "--template".into(),
            template.clone(),
            "--recipients".into(),
            recipients.clone(),
            "--quiet-hours".into(),
            "21:00-08:00".into(),
        ]
    };
    let run = |zone, a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        groupcast(&url, zone, &a)
    };
    // No zone but the machine's UTC: refused, saying how to give one.
    let why = refused(&run(None, args("no-zone")));
    assert!(
        why.contains("--timezone") && why.contains("GROUPCAST_TIMEZONE=Asia/Seoul"),
        "{why}"
    );
    // A zone that does not exist is refused too.
    let why = refused(&run(Some("Seoul"), args("bad-zone")));
    assert!(why.contains("GROUPCAST_TIMEZONE=\"Seoul\""), "{why}");
    assert!(ingested(&store).await.is_empty(), "nothing appended");

    // The deployment's zone: the window is Seoul's, and said so.
    let text = ok_stdout(&run(Some("Asia/Seoul"), args("seoul")));
    assert!(
        text.contains("quiet hours 21:00-08:00 Asia/Seoul"),
        "{text}"
    );
    let chunks = ingested(&store).await;
    assert_eq!(chunks.len(), 1);
    let quiet = chunks[0].options.quiet_hours.clone().expect("quiet hours");
    assert_eq!(quiet.tz, "Asia/Seoul");
    // Held to 08:00 KST (23:00 UTC), not to 08:00 UTC (17:00 KST); free at
    // 08:30 KST, which a window taken in UTC would still hold.
    let w = chunks[0].options.resolve().expect("valid");
    assert_eq!(
        w.release_at(ms("2026-12-01T21:30:00+09:00")),
        ms("2026-12-02T08:00:00+09:00")
    );
    let morning = ms("2026-12-02T08:30:00+09:00");
    assert_eq!(w.release_at(morning), morning);
    // --timezone still wins over the deployment's zone.
    let mut explicit = args("new-york");
    explicit.extend(["--timezone".into(), "America/New_York".into()]);
    let text = ok_stdout(&run(Some("Asia/Seoul"), explicit));
    assert!(
        text.contains("quiet hours 21:00-08:00 America/New_York"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_audit_show_a_batchs_times_in_its_zone_with_the_offset() {
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let url = rig.server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let template = write(dir.path(), "t.json", TEMPLATE);
    let recipients = write(dir.path(), "r.csv", "to,name\n01012345678,Kim\n");
    // An hour ahead, on a whole minute, written in UTC.
    let at = Timestamp::from_second((Timestamp::now() + 1.hour()).as_second() / 60 * 60)
        .expect("instant");
    let at_text = at.to_string();
    let text = ok_stdout(&groupcast(
        &url,
        Some("Asia/Seoul"),
        &[
            "submit",
            "--batch",
            "shown",
            "--template",
            &template,
            "--recipients",
            &recipients,
            "--quiet-hours",
            "21:00-08:00",
            "--send-at",
            &at_text,
        ],
    ));
    let seoul = at
        .in_tz("Asia/Seoul")
        .expect("zone")
        .strftime("%Y-%m-%d %H:%M +09:00")
        .to_string();
    assert!(text.contains(&format!("send at {seoul}")), "{text}");
    wait_until(Duration::from_secs(30), "the chunk accepted", || async {
        rig.store
            .batch("shown")
            .state()
            .await
            .map(|p| p.int("seqs") == 1)
            .unwrap_or(false)
    })
    .await;
    // Another process, with no zone of its own: the batch's zone shows.
    let status = ok_stdout(&groupcast(&url, None, &["status", "shown"]));
    assert!(
        status.contains(&format!("send at {seoul}"))
            && status.contains("quiet hours 21:00-08:00 Asia/Seoul"),
        "{status}"
    );
    let last = status
        .lines()
        .find(|l| l.starts_with("last event "))
        .unwrap_or_else(|| panic!("no last event: {status}"));
    assert!(last.contains(" +09:00 ("), "{last}");
    let audit = ok_stdout(&groupcast(&url, None, &["audit", "shown"]));
    let rows: Vec<&str> = audit.lines().filter(|l| l.contains("chunk_")).collect();
    assert!(!rows.is_empty(), "{audit}");
    for row in rows {
        assert!(row.contains(" +09:00"), "{row}");
        assert!(!row.contains("+00:00"), "a UTC time shown: {row}");
    }
    rig.stop().await;
}

#[tokio::test]
async fn submit_refuses_an_advertising_text_without_its_marks_before_appending() {
    let (server, store) = common::store(1).await;
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let recipients = write(
        dir.path(),
        "r.csv",
        "to,name,night_consent\n01012345678,Kim,Y\n01012345679,Lee,N\n",
    );
    for (text, says) in [
        ("#{name}님, 봄 세일\\n무료수신거부 080-123-4567", "(광고)"),
        ("(광고) #{name}님, 봄 세일", "무료수신거부"),
        (
            "(광고) #{name}님, 봄 세일\\n무료수신거부 #{optout}",
            "written out",
        ),
    ] {
        let template = write(
            dir.path(),
            "t.json",
            &format!(r#"{{"type": "SMS", "from": "0212345678", "text": "{text}"}}"#),
        );
        let why = refused(&submit_ad(&url, &template, &recipients));
        assert!(why.contains(says) && why.contains("--ad"), "{text}: {why}");
    }
    // A bad consent value: its line, and nothing appended.
    let template = write(dir.path(), "ad.json", AD_TEMPLATE);
    let bad = write(
        dir.path(),
        "bad.csv",
        "to,name,night_consent\n01012345678,Kim,Y\n01012345679,Lee,maybe\n",
    );
    let why = refused(&submit_ad(&url, &template, &bad));
    assert!(
        why.contains("bad.csv:3") && why.contains("night_consent") && why.contains("\"maybe\""),
        "{why}"
    );
    assert!(ingested(&store).await.is_empty(), "nothing appended");
}

/// A producer that appends an advertising chunk itself, with a text
/// lacking `(광고)`: the worker rejects it (a dead letter with the reason)
/// and the provider never hears of the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_advertising_chunk_without_its_marks_before_the_provider() {
    let rig = Rig::start(1, test_config(), mock_config()).await;
    let mut chunks = groupcast::producer::cut("no-mark", &template(), recipients(3, 20), 10);
    for c in &mut chunks {
        c.options = BatchOptions {
            ad: Some(AdOptions::default()),
            ..BatchOptions::default()
        };
    }
    groupcast::producer::append_chunks(&rig.store, &chunks)
        .await
        .expect("append");
    wait_until(
        Duration::from_secs(30),
        "both chunks dead-lettered",
        || async { dead_letters(&rig.store).await.len() == 2 },
    )
    .await;
    for (_, reason) in dead_letters(&rig.store).await {
        assert!(reason.contains("must begin with (광고)"), "{reason}");
    }
    assert!(
        rig.mock.ledger().groups.is_empty(),
        "the provider got a call for a refused advertising batch"
    );
    rig.stop().await;
}

/// Whether `t` is inside 21:00-08:00 in Seoul (by the wall clock there,
/// computed here without the product's code).
fn korean_night(t: Timestamp) -> bool {
    let hour = t.in_tz("Asia/Seoul").expect("zone").hour();
    !(8..21).contains(&hour)
}

/// The 08:00 in Seoul that ends the night containing `t`.
fn morning_after(t: Timestamp) -> i64 {
    let local = t.in_tz("Asia/Seoul").expect("zone");
    let day = if local.hour() >= 21 {
        local.date().tomorrow().expect("date")
    } else {
        local.date()
    };
    day.at(8, 0, 0, 0)
        .in_tz("Asia/Seoul")
        .expect("zone")
        .timestamp()
        .as_millisecond()
}

/// `submit --ad` splits the file by its `night_consent` column into two
/// batches that name each other; the consenting recipients are sent at
/// once at any hour, the others never between 21:00 and 08:00 KST: sent
/// now in the day, or held to 08:00 KST at night, none dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_ad_splits_by_night_consent_and_holds_only_the_others_at_night() {
    let rig = Rig::start(2, test_config(), mock_config()).await;
    let url = rig.server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let template = write(dir.path(), "ad.json", AD_TEMPLATE);
    let consenting = ["01011110001", "01011110002", "01011110003"];
    let others = ["01022220001", "01022220002", "01022220003"];
    let recipients = write(
        dir.path(),
        "r.csv",
        &format!(
            "to,name,night_consent\n{},Kim,Y\n{},Lee,N\n{},Park,동의\n{},Choi,\n{},Jung,1\n{},Kang,미동의\n{},Kim,N\n",
            consenting[0], others[0], consenting[1], others[1], consenting[2], others[2],
            // A repeat of a consenting number, saying no: sent once, as
            // its first row says.
            consenting[0],
        ),
    );
    let submitted = Timestamp::now();
    let text = ok_stdout(&submit_ad(&url, &template, &recipients));
    assert!(
        text.contains("submitted batch spring: 3 recipients")
            && text.contains("submitted batch spring.night-consent: 3 recipients")
            && text
                .contains("advertising: 3 recipient(s) without night-time consent in batch spring")
            && text.contains("3 with it in batch spring.night-consent"),
        "{text}"
    );
    let chunks = ingested(&rig.store).await;
    let numbers = |batch: &str| {
        let mut v: Vec<String> = chunks
            .iter()
            .filter(|c| c.batch == batch)
            .flat_map(|c| c.recipients.iter().map(|r| r.to.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(numbers("spring"), others);
    assert_eq!(numbers("spring.night-consent"), consenting);
    for c in &chunks {
        assert!(
            c.recipients
                .iter()
                .all(|r| !r.vars.contains_key("night_consent")),
            "the consent column travels with the recipients"
        );
    }

    // The consenting half goes at once, whatever the hour.
    let consent_batch = vec!["spring.night-consent".to_string()];
    rig.wait_reported(&consent_batch, Duration::from_secs(30))
        .await;
    // Each batch shows the rule and the other.
    let status = ok_stdout(&groupcast(&url, None, &["status", "spring"]));
    assert!(
        status.contains(
            "held 21:00-08:00 Asia/Seoul (night rule), paired with batch spring.night-consent"
        ),
        "{status}"
    );
    let status = ok_stdout(&groupcast(&url, None, &["status", "spring.night-consent"]));
    assert!(
        status.contains("night-time consent (not held at night), paired with batch spring"),
        "{status}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&groupcast(&url, None, &["status", "spring", "--json"]).stdout)
            .expect("json");
    assert_eq!(v["options"]["advertising"]["pair"], "spring.night-consent");
    assert_eq!(v["options"]["advertising"]["heldAtNight"], true);

    // The others: sent in the day, held to 08:00 KST at night.
    let holds = || async {
        rig.store
            .batch("spring")
            .events()
            .await
            .expect("events")
            .into_iter()
            .filter_map(|r| match r.map(|r| r.event) {
                Ok(Event::SendScheduled(e)) => Some((e.at_ms, e.reason)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let reported = || async {
        rig.store
            .batch("spring")
            .state()
            .await
            .map(|p| p.get("report").is_some())
            .unwrap_or(false)
    };
    wait_until(
        Duration::from_secs(30),
        "batch spring sent or held",
        || async { reported().await || !holds().await.is_empty() },
    )
    .await;
    let now = Timestamp::now();
    if korean_night(submitted) && korean_night(now) {
        assert!(!reported().await, "sent at night");
        assert!(!holds().await.is_empty(), "not held at night");
    }
    // A hold (at night, or one that began at 21:00 while the test ran)
    // lasts to 08:00 KST.
    let night_of = if korean_night(submitted) {
        submitted
    } else {
        now
    };
    for (at_ms, reason) in holds().await {
        assert_eq!(
            at_ms as i64,
            morning_after(night_of),
            "held until 08:00 KST"
        );
        assert_eq!(reason, "quiet_hours");
    }
    if !holds().await.is_empty() {
        // Shown to a person in Korean time, whatever the machine's zone.
        let morning = Timestamp::from_millisecond(morning_after(night_of)).expect("instant");
        let shown = morning
            .in_tz("Asia/Seoul")
            .expect("zone")
            .strftime("held until %Y-%m-%d 08:00 +09:00")
            .to_string();
        let status = ok_stdout(&groupcast(&url, None, &["status", "spring"]));
        assert!(status.contains(&shown), "{shown}: {status}");
    }
    // Whoever was sent: the consenting at any time, the others never at
    // night; nobody twice, nobody dropped from the batch's state.
    let ledger = rig.mock.ledger();
    let mut sent_at: BTreeMap<String, u64> = BTreeMap::new();
    for g in &ledger.groups {
        if let Some(at) = g.sent_at_ms {
            for m in &g.messages {
                assert!(
                    sent_at.insert(m.to.clone(), at).is_none(),
                    "{} sent twice",
                    m.to
                );
            }
        }
    }
    for n in consenting {
        assert!(sent_at.contains_key(n), "{n} (consenting) was not sent");
    }
    for n in others {
        if let Some(at) = sent_at.get(n) {
            let t = Timestamp::from_millisecond(*at as i64).expect("instant");
            assert!(
                !korean_night(t),
                "{n} (no consent) was sent at {t}, at night in Korea"
            );
        }
    }
    let p = rig.store.batch("spring").state().await.expect("state");
    assert_eq!(p.int("recipients"), 3, "nobody dropped");
    let w = p
        .get(groupcast::projection::field::OPTIONS)
        .and_then(SendWindow::from_canonical)
        .expect("options");
    assert!(w.night_rule_applies());
    rig.stop().await;
}
