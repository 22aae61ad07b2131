//! The chaos suite: real `groupcast worker` processes SIGKILLed and restarted
//! at random moments, Redis SIGKILLed and restarted from its AOF, and a
//! provider that answers 5xx, drops answers after acting, rate-limits and
//! stalls, while four batches that roll over the group cap flow through.
//!
//! The workers run with the default `--durability auto`.
//!
//! - `chaos_appendfsync_always` (Valkey): every invariant must hold, from our
//!   events (`verify_batch`, with the provider's view) and from the
//!   provider's ledger; one report per batch; no dead letter.
//! - `chaos_appendfsync_everysec` (Redis 7.0, the fixed window): the same,
//!   but two of the three Redis kills simulate a power loss (the AOF loses
//!   its last second). A violation the ledger shows that `verify_batch` does
//!   not is a failure; beyond that, since adds and sends wait until what they
//!   rely on is on disk, the ledger must be clean, every batch reported, and
//!   `verify_batch` may only say that writes were lost. Findings:
//!   `docs/durability.md`.
//! - `chaos_waitaof_everysec` (Valkey, `--durability waitaof`): the same,
//!   the power loss cutting the AOF back to the last write `WAITAOF`
//!   confirmed.
//! - `chaos_provider_outage`: as `always`, plus a 30 s provider outage (every
//!   request 5xx, longer than the old attempt-counted retry budget) starting
//!   mid-run: every batch must still end with one report, 0 violations, no
//!   dead letter (retries are budgeted in time: `--retry-for`).
//!
//! Rerun a failure with `CHAOS_SEED=<seed> cargo test --release --test chaos`.

// Shared with the product's own integration tests, in the root package.
#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "chaos/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use groupcast::cli::worker::check_server;
use groupcast::provider::GroupStatus;
use groupcast::verify::verify_batch;
use groupcast::worker::durability::{choose_wait, Durability as CliDurability, ServerPersistence};
use groupcast_rigs::mock::invariants;
use harness::{Durability, Plan, Rig, Server};
use rand::Rng;

/// What the ledger and our verification say about one batch.
#[derive(Debug, Default)]
struct Findings {
    /// What the provider's ledger shows broken (the truth).
    ledger: Vec<String>,
    /// What `verify_batch` reports broken (what we detect).
    verify: Vec<String>,
    /// Dead letters of the batch's entries.
    dead: Vec<String>,
    reported: bool,
}

/// Runs the chaos until every batch has reported and every planned Redis
/// kill happened, then waits for the streams to drain. Returns whether it
/// finished (false: the deadline passed; the dump was printed).
async fn run(rig: &mut Rig, redis_kill_kinds: &[bool]) -> bool {
    let plan = rig.plan.clone();
    let deadline = rig.started + plan.deadline;
    let mut submitted = vec![false; plan.batches.len()];
    let mut last_submit = Instant::now();
    for (k, (_, _, _, after)) in plan.batches.iter().enumerate() {
        if after.is_zero() {
            let chunks = rig.chunks(k);
            rig.submit(&chunks).await;
            submitted[k] = true;
            last_submit = Instant::now();
        }
    }
    rig.spawn_workers();
    let mut down: Vec<(usize, Instant)> = Vec::new();
    let mut last_redis_kill: Option<Instant> = None;
    let mut quiet_since: Option<Instant> = None;
    let mut kills = plan.redis_kills_at.iter().zip(redis_kill_kinds).peekable();
    // The planned provider outage: when it began, and whether it is over.
    let mut outage_began: Option<Instant> = None;
    let mut outage_over = plan.outage.is_none();
    loop {
        rig.check_workers_alive().await;
        let now = Instant::now();
        for (k, (b, _, _, after)) in plan.batches.iter().enumerate() {
            if !submitted[k] && rig.started.elapsed() >= *after {
                let chunks = rig.chunks(k);
                rig.submit(&chunks).await;
                rig.log(format!("submitted {b} ({} chunk entries)", chunks.len()));
                submitted[k] = true;
                last_submit = Instant::now();
            }
        }
        // Restart killed workers when their time comes.
        let (due, later): (Vec<_>, Vec<_>) = down.into_iter().partition(|(_, at)| *at <= now);
        down = later;
        for (slot, _) in due {
            rig.spawn_worker(slot);
        }
        let progress = rig.progress().await;
        if let Some((at, lasts)) = plan.outage {
            match outage_began {
                None if progress.is_some_and(|p| p >= at) => {
                    rig.provider_outage(true);
                    outage_began = Some(Instant::now());
                }
                Some(t) if !outage_over && t.elapsed() >= lasts => {
                    rig.provider_outage(false);
                    outage_over = true;
                }
                _ => {}
            }
        }
        let all_in = submitted.iter().all(|s| *s);
        if let (Some(p), Some((at, power_loss))) = (progress, kills.peek().copied()) {
            // A power loss must not eat the input itself: it comes at least
            // 1.5 s after the last submission (an upstream whose appends were
            // lost would have to resubmit; that is not what is tested here).
            let input_safe = !*power_loss || last_submit.elapsed() > Duration::from_millis(1_500);
            // Kills at least 3 s apart, so each one hits a running pipeline.
            let spaced =
                last_redis_kill.is_none_or(|t: Instant| t.elapsed() > Duration::from_secs(3));
            if p >= *at && input_safe && spaced {
                last_redis_kill = Some(Instant::now());
                kills.next();
                let ms = rig.rng.random_range(300..2_000);
                rig.log(format!("progress {:.0}%", p * 100.0));
                rig.kill_redis(Duration::from_millis(ms), *power_loss).await;
                continue;
            }
        }
        if all_in && kills.peek().is_none() && outage_over {
            if let Some(pending) = rig.unreported().await {
                if pending.is_empty() {
                    break;
                }
                // Nothing left to run, yet batches unreported: stuck.
                if rig.quiescent().await == Some(true) {
                    let since = *quiet_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(3) {
                        rig.log(format!(
                            "stuck: nothing left to run, {pending:?} unreported"
                        ));
                        eprintln!("{}", rig.dump().await);
                        return false;
                    }
                } else {
                    quiet_since = None;
                }
            }
        }
        if Instant::now() > deadline {
            rig.log("deadline passed before every batch reported");
            eprintln!("{}", rig.dump().await);
            return false;
        }
        // One chaos action.
        let roll: f64 = rig.rng.random();
        if roll < 0.4 && rig.workers.len() > 1 {
            if let Some(slot) = rig.kill_random_worker().await {
                let back = Duration::from_millis(rig.rng.random_range(0..1_500));
                down.push((slot, Instant::now() + back));
            }
        } else if roll < 0.55 {
            let ms = rig.rng.random_range(800..3_000);
            rig.open_stall(ms);
        }
        let pause = rig.rng.random_range(200..800);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // Every worker back; wait for the streams to drain (losing groups'
    // deletes, late duplicates) so that nothing happens after the checks.
    for (slot, _) in down {
        rig.spawn_worker(slot);
    }
    rig.log("every batch reported; waiting for the streams to drain");
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        rig.check_workers_alive().await;
        if rig.quiescent().await == Some(true) {
            return true;
        }
        if Instant::now() > drain_deadline {
            rig.log("the streams did not drain in 60 s");
            eprintln!("{}", rig.dump().await);
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Everysec: waits (bounded) until every batch has reported or nothing is
/// left that could make it report (the streams are quiet). Returns whether
/// every batch reported.
async fn settle(rig: &mut Rig, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut quiet_checks = 0;
    loop {
        rig.check_workers_alive().await;
        if let Some(p) = rig.unreported().await {
            if p.is_empty() {
                return true;
            }
        }
        quiet_checks = if rig.quiescent().await == Some(true) {
            quiet_checks + 1
        } else {
            0
        };
        if quiet_checks >= 10 || Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Compares the ledger's truth with our verification, per batch.
async fn findings(rig: &Rig) -> BTreeMap<String, Findings> {
    let cap = rig.plan.cap;
    let summary = rig.mock.ledger_summary();
    let mut out: BTreeMap<String, Findings> = rig
        .plan
        .batches
        .iter()
        .map(|(b, ..)| (b.clone(), Findings::default()))
        .collect();

    // The ledger, per batch (the same rules as `mock::invariants::check`).
    let batch_of: BTreeMap<&str, String> = summary
        .groups
        .iter()
        .map(|g| {
            (
                g.group_id.as_str(),
                g.custom_fields.get("batchId").cloned().unwrap_or_default(),
            )
        })
        .collect();
    let mut used: BTreeMap<(String, String), Vec<&groupcast_rigs::mock::GroupSummary>> =
        BTreeMap::new();
    for g in &summary.groups {
        if g.status == GroupStatus::Deleted
            || (g.count.total == 0 && g.status == GroupStatus::Pending && g.send_calls.is_empty())
        {
            continue;
        }
        let batch = g.custom_fields.get("batchId").cloned().unwrap_or_default();
        let gen = g
            .custom_fields
            .get("generation")
            .cloned()
            .unwrap_or_default();
        used.entry((batch, gen)).or_default().push(g);
    }
    let send_at: BTreeMap<&str, u64> = rig
        .plan
        .batches
        .iter()
        .enumerate()
        .filter_map(|(k, (b, ..))| Some((b.as_str(), rig.send_at_ms(k)?)))
        .collect();
    let mut registered: BTreeMap<String, u64> = BTreeMap::new();
    for ((batch, gen), groups) in &used {
        let f = out.entry(batch.clone()).or_default();
        if let Some(at) = send_at.get(batch.as_str()) {
            for g in groups {
                if let Some(sent) = g.sent_at_ms.filter(|sent| sent < at) {
                    f.ledger.push(format!(
                        "gen {gen}: group {} sent {} ms before the batch's send_at",
                        g.group_id,
                        at - sent
                    ));
                }
            }
        }
        if groups.len() != 1 {
            f.ledger.push(format!(
                "gen {gen}: {} groups hold messages: {:?}",
                groups.len(),
                groups
                    .iter()
                    .map(|g| format!(
                        "{} {:?} {} registered",
                        g.group_id, g.status, g.count.registered_success
                    ))
                    .collect::<Vec<_>>()
            ));
        }
        for g in groups {
            let ok = g.send_calls.iter().filter(|c| c.status == 200).count();
            if ok != 1 {
                f.ledger
                    .push(format!("gen {gen}: group {} sent {ok} times", g.group_id));
            }
            if g.count.registered_success > cap {
                f.ledger.push(format!(
                    "gen {gen}: group {} holds {} (cap {cap})",
                    g.group_id, g.count.registered_success
                ));
            }
            *registered.entry(batch.clone()).or_default() += g.count.registered_success;
        }
    }
    let mut dup_per_batch: BTreeMap<String, usize> = BTreeMap::new();
    for d in &summary.duplicate_registrations {
        for b in d
            .group_ids
            .iter()
            .filter_map(|g| batch_of.get(g.as_str()))
            .collect::<BTreeSet<_>>()
        {
            *dup_per_batch.entry(b.clone()).or_default() += 1;
        }
    }
    for (b, n) in dup_per_batch {
        out.entry(b).or_default().ledger.push(format!(
            "{n} recipient(s) registered in more than one group"
        ));
    }
    for (b, n, ..) in &rig.plan.batches {
        let got = registered.get(b).copied().unwrap_or(0);
        if got != *n as u64 {
            out.entry(b.clone()).or_default().ledger.push(format!(
                "{got} recipients registered in used groups, the batch has {n}"
            ));
        }
    }
    // Our per-batch attribution must not miss what the shared check finds.
    let global = invariants::check(&summary, cap);
    if !global.ok() {
        assert!(
            out.values().any(|f| !f.ledger.is_empty()),
            "ledger violations not attributed to a batch: {:?}",
            global.violations
        );
    }

    // Our side: verify_batch with the provider client.
    for (b, ..) in &rig.plan.batches {
        let v = verify_batch(&rig.store, Some(&rig.provider), b, cap)
            .await
            .expect("verify_batch");
        let f = out.entry(b.clone()).or_default();
        f.reported = v.reported;
        f.verify = v
            .failures()
            .iter()
            .map(|c| format!("invariant {}: {}", c.invariant, c.detail))
            .collect();
        if !v.reported {
            f.verify.push("no report".into());
        }
    }
    // Dead letters, by the batch of the entry they hold.
    for (source, reason, batch) in dead_letters(rig).await {
        out.entry(batch.unwrap_or_else(|| "?".into()))
            .or_default()
            .dead
            .push(format!("{source}: {reason}"));
    }
    out
}

/// Every dead letter: (source stream, reason, batch if known).
async fn dead_letters(rig: &Rig) -> Vec<(String, String, Option<String>)> {
    let v: redis::Value = redis::cmd("XRANGE")
        .arg(rig.store.keys.dead_letters(0))
        .arg("-")
        .arg("+")
        .query_async(&mut rig.store.raw_conn())
        .await
        .expect("xrange dead letters");
    groupcast::store::queue::parse_entries(&v)
        .into_iter()
        .map(|e| {
            let batch = e.get("f:d").and_then(|d| {
                groupcast::events::Chunk::decode(d)
                    .map(|c| c.batch)
                    .ok()
                    .or_else(|| {
                        groupcast::events::decode_payload::<groupcast::worker::ops::WorkItem>(
                            "work item",
                            d,
                        )
                        .ok()
                        .map(|w| w.batch)
                    })
            });
            (
                e.text("source").unwrap_or_default(),
                e.text("reason").unwrap_or_default(),
                batch,
            )
        })
        .collect()
}

/// Writes to the real stderr, past the test harness's output capture, so
/// that the summary line shows in every `cargo test` log.
fn shout(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn summary_line(rig: &Rig, violations: usize, extra: &str) -> String {
    let f = rig.mock.ledger_summary().totals.faults;
    format!(
        "chaos: seed={} kills={} redis_restarts={} faults={{errors:{},drops:{},rate_limited:{},stalled:{}}} batches={} recipients={} violations={violations}{extra} elapsed={:.1}s",
        rig.seed,
        rig.stats.worker_kills,
        rig.stats.redis_restarts,
        f.errors,
        f.drops,
        f.rate_limited,
        f.stalled,
        rig.plan.batches.len(),
        rig.plan.recipients(),
        rig.started.elapsed().as_secs_f64()
    )
}

/// On Valkey (a server with `WAITAOF`): the workers' `--durability auto`
/// sees `appendfsync always` and does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_appendfsync_always() {
    always("chaos_appendfsync_always", |rng| {
        let mut plan = Plan::random(Durability::Always, rng, 2);
        plan.server = Server::Valkey;
        plan
    })
    .await;
}

/// A provider outage (every request 5xx) of 30 s, longer than the old retry
/// budget (8 attempts, spent in 13-25 s), in the middle of the chaos: every
/// batch still ends with one report, with no violation and no dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_provider_outage() {
    always("chaos_provider_outage", |rng| {
        let mut plan = Plan::random(Durability::Always, rng, 1);
        let lasts = Duration::from_secs(30);
        plan.outage = Some((rng.random_range(0.2..0.6), lasts));
        plan.deadline += lasts;
        plan
    })
    .await;
}

/// The `appendfsync always` checks: every invariant, one report per batch,
/// no dead letter, no acknowledged write lost.
async fn always(name: &str, plan: impl FnOnce(&mut rand::rngs::StdRng) -> Plan) {
    let seed = harness::seed();
    eprintln!(
        "chaos: seed={seed} (rerun: CHAOS_SEED={seed} cargo test --release --test chaos {name})"
    );
    let mut rng = harness::rng(seed);
    let plan = plan(&mut rng);
    let kinds = vec![false; plan.redis_kills_at.len()];
    let mut rig = Rig::start(seed, rng, plan).await;
    rig.log(format!("plan: {:?}", rig.plan));
    // The start-up check finds nothing to say about this server.
    let warnings = check_server(&rig.store, CliDurability::Always).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    let finished = run(&mut rig, &kinds).await;
    assert!(
        finished,
        "chaos: seed={seed}: the run did not finish (dump above)"
    );
    rig.stop_samplers().await;
    rig.kill_all_workers().await;
    rig.calm_provider();

    let found = findings(&rig).await;
    let mut violations = 0;
    let mut report = String::new();
    for (b, f) in &found {
        violations += f.ledger.len() + f.verify.len() + f.dead.len();
        if !f.ledger.is_empty() || !f.verify.is_empty() || !f.dead.is_empty() {
            report += &format!("{b}: {f:#?}\n");
        }
    }
    for (kind, lost) in &rig.stats.redis_losses {
        assert_eq!(
            *lost, 0,
            "seed={seed}: appendfsync always lost {lost} acknowledged canary writes on a {kind}"
        );
    }
    let extra = match rig.plan.outage {
        Some((_, lasts)) => {
            assert_eq!(
                rig.stats.outages, 1,
                "seed={seed}: the planned outage did not happen"
            );
            format!(" outage={}s", lasts.as_secs())
        }
        None => String::new(),
    };
    let line = summary_line(&rig, violations, &extra);
    shout(&line);
    if violations > 0 {
        eprintln!("{}", rig.dump().await);
    }
    assert_eq!(violations, 0, "seed={seed}:\n{report}");
    assert!(
        rig.stats.redis_restarts >= 1,
        "seed={seed}: redis never restarted"
    );
}

/// On Debian's Redis 7.0 (no `WAITAOF`): `--durability auto` waits the
/// fixed window; a power loss cuts the AOF back one second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_appendfsync_everysec() {
    everysec("chaos_appendfsync_everysec", Server::Redis, "auto").await;
}

/// On Redis 8.0, whose WAITAOF waits for the fsync: the workers'
/// `--durability auto` measures that and waits with WAITAOF (asserted
/// below); adds and sends wait for it, group-committed, and a power loss
/// cuts the AOF back to the last write that WAITAOF confirmed (the probe in
/// the harness): what such a server may lose. This checks that every add
/// and send waits for a confirmation that covers every event it relies on,
/// its own process's or another's. (Valkey 8.1.8's WAITAOF confirms before
/// the fsync: its `auto` waits the window, like Redis 7.0's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_waitaof_everysec() {
    everysec("chaos_waitaof_everysec", Server::Redis8, "auto").await;
}

async fn everysec(name: &str, server: Server, worker_durability: &'static str) {
    let seed = harness::seed();
    eprintln!(
        "chaos: seed={seed} (rerun: CHAOS_SEED={seed} cargo test --release --test chaos {name})"
    );
    let mut rng = harness::rng(seed);
    let mut plan = Plan::random(Durability::Everysec, &mut rng, 3);
    plan.server = server;
    plan.worker_durability = worker_durability;
    let mut rig = Rig::start(seed, rng, plan).await;
    rig.log(format!("plan: {:?}", rig.plan));
    // A worker expecting `always` warns about this server; one expecting
    // `everysec` does not.
    let warnings = check_server(&rig.store, CliDurability::Always).await;
    assert!(
        warnings.len() == 1
            && warnings[0].contains("appendfsync=everysec, weaker than --durability Always"),
        "{warnings:?}"
    );
    assert!(check_server(&rig.store, CliDurability::Everysec)
        .await
        .is_empty());
    if server == Server::Redis8 {
        // What the workers' `auto` chooses here.
        let p = ServerPersistence::read(&rig.store)
            .await
            .expect("persistence");
        let (wait, why) = choose_wait(CliDurability::Auto, 0, &p).expect("auto chooses");
        assert_eq!(
            wait,
            groupcast::worker::DurableWait::WaitAof { replicas: 0 },
            "{why}"
        );
    }
    // One plain SIGKILL (the page cache keeps what Redis wrote), then two
    // simulated power losses (the last second of the AOF is gone).
    let finished = run(&mut rig, &[false, true, true]).await;
    if !finished {
        rig.log("not every batch reported during the chaos; settling");
    }
    let all_reported = settle(&mut rig, Duration::from_secs(30)).await;
    rig.stop_samplers().await;
    rig.kill_all_workers().await;
    rig.calm_provider();

    let found = findings(&rig).await;
    let (mut broken, mut detected, mut lost_flagged) = (0, 0, 0);
    let mut silent = Vec::new();
    let mut failures = Vec::new();
    let mut report = String::new();
    for (b, f) in &found {
        let ledger_bad = !f.ledger.is_empty();
        // A failed check of verify_batch; "no report" alone says that
        // something is stuck, not what broke.
        let verify_bad = f.verify.iter().any(|v| v != "no report");
        let lost = f
            .verify
            .iter()
            .any(|v| v.contains("Redis lost acknowledged writes"));
        if ledger_bad || verify_bad || !f.dead.is_empty() {
            report += &format!("{b}: {f:#?}\n");
        }
        lost_flagged += usize::from(lost);
        if ledger_bad {
            broken += 1;
            if verify_bad {
                detected += 1;
            } else {
                silent.push(b.clone());
            }
        }
        // A dead letter is acceptable only for a batch whose verification
        // fails loudly.
        if !f.dead.is_empty() && !verify_bad {
            silent.push(format!("{b} (dead letters)"));
        }
        // Beyond detection: the adds and sends wait until what they rely on
        // is on disk (`--durability`), so a lost second breaks nothing at the
        // provider; what verify may say is only that writes were lost.
        if ledger_bad {
            failures.push(format!(
                "{b}: the provider's ledger shows broken invariants"
            ));
        }
        if !f.reported {
            failures.push(format!("{b}: not reported"));
        }
        let other: Vec<_> = f
            .verify
            .iter()
            .filter(|v| *v != "no report" && !v.contains("Redis lost acknowledged writes"))
            .collect();
        if !other.is_empty() {
            failures.push(format!("{b}: verify failed: {other:?}"));
        }
    }
    let losses: Vec<String> = rig
        .stats
        .redis_losses
        .iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    // Acknowledgement flushes and dead letters that left entries pending
    // because their handling's last event was gone (`ack_recorded.lua`,
    // `dead_letter.lua`; one log line each): entries handled again after a
    // loss.
    let withheld = rig.worker_log_lines("handling appended is gone");
    let extra = format!(
        " broken_batches={broken} detected={detected} silent={} lost_writes_flagged={lost_flagged} ack_flushes_withheld={withheld} all_reported={all_reported} canary_lost=[{}] aof_bytes_cut={:?}",
        silent.len(),
        losses.join(","),
        rig.stats.power_loss_bytes
    );
    let violations: usize = found.values().map(|f| f.ledger.len()).sum();
    let line = summary_line(&rig, violations, &extra);
    eprintln!("{report}");
    shout(&line);
    assert!(
        silent.is_empty(),
        "seed={seed}: violations the ledger shows but verify_batch does not: {silent:?}\n{report}\n{}",
        rig.dump().await
    );
    // The power losses did take acknowledged writes away (else this test
    // tests nothing). A second back (the window path) always takes canary
    // increments; the last WAITAOF confirmation of a server that confirms
    // within a tick is only milliseconds back, so there the AOF bytes cut
    // away (acknowledged, not confirmed) are the measure.
    assert_eq!(
        rig.stats.power_loss_bytes.len(),
        2,
        "seed={seed}: {:?}",
        rig.stats.power_loss_bytes
    );
    // One loss may land when the pipeline is idle (a scheduled batch waits
    // for its send_at, the others are done): nothing unconfirmed to cut.
    assert!(
        rig.stats
            .power_loss_bytes
            .iter()
            .any(|dropped| *dropped > 0),
        "seed={seed}: no simulated power loss cut anything away: {:?}",
        rig.stats.power_loss_bytes
    );
    if server == Server::Redis {
        for (kind, lost) in &rig.stats.redis_losses {
            if *kind == "power-loss" {
                assert!(
                    *lost > 0,
                    "seed={seed}: a simulated power loss lost nothing"
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed={seed}: {failures:#?}\n{report}\n{}",
        rig.dump().await
    );
}
