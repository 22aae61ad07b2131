//! The batch protocol, model-checked: every interleaving of workers, crashes,
//! redeliveries, provider failures and lost answers, lost Redis writes, the
//! watchdog and retention, over the scripts' own decisions
//! (`groupcast::protocol`, held to the real scripts by `tests/conformance.rs`).
//! See docs/protocol.md.
//!
//! Each configuration prints one line past the output capture:
//! `model: <config> states=<N> violations=<V> mutants_caught=<C>/<M>`.

#[path = "model/checker.rs"]
mod checker;
#[path = "model/world.rs"]
mod world;

use checker::{check, Report};
use world::{ChunkSpec, Config, Mutant, World};

/// A configuration larger than this is an error, not a silent cut.
const LIMIT: usize = 3_000_000;
const MUTANTS: [Mutant; 4] = [
    Mutant::RecordGroupOverwrites,
    Mutant::GiveBackApproval,
    Mutant::LoadedTwice,
    Mutant::SendWithoutMarker,
];

fn chunk(seq: u32, last: bool, to: &[u8]) -> ChunkSpec {
    ChunkSpec {
        seq,
        last,
        to: to.to_vec(),
    }
}

fn base(name: &'static str) -> Config {
    Config {
        name,
        workers: 2,
        ingest: vec![],
        cap: 3,
        crashes: 0,
        steals: 0,
        failures: 0,
        lost_answers: 0,
        redis_losses: 0,
        everysec: false,
        webhook: false,
        watchdog: 0,
        retention: false,
        mutant: None,
    }
}

/// Writes to the real stderr, past the test harness's output capture.
fn shout(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
    println!("{line}");
}

fn show(name: &str, r: &Report) -> String {
    match &r.violation {
        None => format!("{name}: no violation in {} states", r.states),
        Some((what, path)) => {
            let mut s = format!("{name}: {what}\n  after {} steps:", path.len());
            for (i, step) in path.iter().enumerate() {
                s.push_str(&format!("\n  {:>3}. {step}", i + 1));
            }
            s
        }
    }
}

/// Checks `cfg`, then each mutant on it; prints the summary line and
/// asserts no violation and every mutant caught.
fn run(cfg: Config, mutants: &[Mutant]) {
    let t = std::time::Instant::now();
    let clean = check(World::new(cfg.clone()), LIMIT);
    let mut caught = 0;
    let mut missed = Vec::new();
    for m in mutants {
        let r = check(
            World::new(Config {
                mutant: Some(*m),
                ..cfg.clone()
            }),
            LIMIT,
        );
        if r.violation.is_some() {
            caught += 1;
        } else {
            missed.push(*m);
        }
    }
    let violations = usize::from(clean.violation.is_some());
    shout(&format!(
        "model: {} states={} violations={violations} mutants_caught={caught}/{}",
        cfg.name,
        clean.states,
        mutants.len()
    ));
    shout(&format!(
        "  ({} final states, depth {}, {:.1}s)",
        clean.finals,
        clean.depth,
        t.elapsed().as_secs_f64()
    ));
    assert!(clean.violation.is_none(), "{}", show(cfg.name, &clean));
    assert!(missed.is_empty(), "{}: mutants not caught: {missed:?}", cfg.name);
}

/// Three chunks (one delivered twice) over a cap forcing a rollover, two
/// workers, a crash, a stolen lease, a failed and a lost provider answer.
fn rollover() -> Config {
    Config {
        ingest: vec![
            chunk(0, false, &[1, 2]),
            chunk(1, false, &[3, 4]),
            chunk(2, true, &[5]),
            chunk(1, false, &[3, 4]),
        ],
        crashes: 1,
        steals: 1,
        failures: 1,
        lost_answers: 1,
        webhook: true,
        ..base("rollover-duplicate-crash")
    }
}

/// Redis under `everysec`: a restart that loses the unsynced writes, on top
/// of a crash and a lost answer.
fn everysec() -> Config {
    Config {
        ingest: vec![
            chunk(1, true, &[3]),
            chunk(0, false, &[1, 2]),
        ],
        cap: 2,
        crashes: 1,
        lost_answers: 1,
        redis_losses: 1,
        everysec: true,
        ..base("everysec-lost-writes")
    }
}

/// Three workers, chunks out of order with a wrong `last` (seq 1 flagged
/// last, then seq 2 arrives), the watchdog and retention.
fn three_workers() -> Config {
    Config {
        workers: 3,
        ingest: vec![
            chunk(1, true, &[3]),
            chunk(2, false, &[4]),
            chunk(0, false, &[1, 2]),
        ],
        cap: 2,
        crashes: 1,
        failures: 1,
        watchdog: 1,
        retention: true,
        ..base("three-workers-wrong-last")
    }
}

#[test]
fn model_rollover_duplicate_crash() {
    run(rollover(), &MUTANTS);
}

#[test]
fn model_everysec_lost_writes() {
    run(everysec(), &MUTANTS);
}

#[test]
fn model_three_workers_wrong_last() {
    run(three_workers(), &MUTANTS);
}

/// A mutant on a small configuration: the checker must find a
/// counterexample, printed as a readable sequence of actions.
fn caught(m: Mutant, cfg: Config) {
    let r = check(
        World::new(Config {
            mutant: Some(m),
            ..cfg
        }),
        LIMIT,
    );
    let text = show(&format!("mutant {m:?}"), &r);
    shout(&text);
    assert!(r.violation.is_some(), "{text}");
}

fn small() -> Config {
    Config {
        ingest: vec![chunk(0, false, &[1, 2]), chunk(1, true, &[3])],
        cap: 2,
        crashes: 1,
        failures: 1,
        ..base("small")
    }
}

#[test]
fn mutant_record_group_without_its_check_is_caught() {
    caught(Mutant::RecordGroupOverwrites, small());
}

#[test]
fn mutant_giving_back_an_approval_is_caught() {
    caught(Mutant::GiveBackApproval, small());
}

#[test]
fn mutant_loaded_without_its_key_is_caught() {
    caught(Mutant::LoadedTwice, small());
}

#[test]
fn mutant_send_without_its_marker_is_caught() {
    caught(Mutant::SendWithoutMarker, small());
}
