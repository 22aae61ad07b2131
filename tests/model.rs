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
/// A mutant is caught within this many states (breadth first: the shortest
/// counterexample), or not at all.
const MUTANT_LIMIT: usize = 150_000;
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
    if clean.violation.is_some() {
        shout(&show(cfg.name, &clean));
    }
    let mut caught = 0;
    let mut missed = Vec::new();
    for m in mutants {
        let r = check(
            World::new(Config {
                mutant: Some(*m),
                ..cfg.clone()
            }),
            MUTANT_LIMIT,
        );
        if r.violation
            .as_ref()
            .is_some_and(|(v, _)| !v.starts_with("more than"))
        {
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
    assert!(
        missed.is_empty(),
        "{}: mutants not caught: {missed:?}",
        cfg.name
    );
}

/// Three chunks (one delivered twice) over a cap forcing a rollover, two
/// workers, a crash between any two steps, a report webhook.
fn rollover() -> Config {
    Config {
        ingest: vec![
            chunk(0, false, &[1, 2]),
            chunk(1, false, &[3]),
            chunk(2, true, &[4]),
            chunk(1, false, &[3]),
        ],
        crashes: 1,
        webhook: true,
        ..base("rollover-duplicate-crash")
    }
}

/// Two chunks out of order, a failed and a lost provider answer, a stolen
/// lease.
fn faults() -> Config {
    Config {
        ingest: vec![chunk(1, true, &[3]), chunk(0, false, &[1, 2])],
        cap: 2,
        steals: 1,
        failures: 1,
        lost_answers: 1,
        ..base("out-of-order-provider-faults")
    }
}

/// Three workers, chunks out of order with a wrong `last` (seq 1 flagged
/// last, then seq 2 arrives and is rejected), a provider failure, the
/// watchdog and retention.
fn three_workers() -> Config {
    Config {
        workers: 3,
        ingest: vec![
            chunk(1, true, &[3]),
            chunk(2, false, &[4]),
            chunk(0, false, &[1]),
        ],
        cap: 2,
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
fn model_out_of_order_provider_faults() {
    run(faults(), &MUTANTS);
}

#[test]
fn model_three_workers_wrong_last() {
    run(three_workers(), &MUTANTS);
}

/// A finding, kept as a test until it is fixed (docs/protocol.md): under
/// `everysec`, Redis loses a chunk's assignment after `accept.lua`; the
/// worker goes on to `park.lua`, which parks it without its assignment and
/// acknowledges the ingest entry; the load released later is dropped as
/// stale, and nothing ever accepts the chunk again: the batch never ends.
#[test]
fn finding_a_lost_assignment_before_park_strands_the_chunk() {
    let cfg = Config {
        workers: 1,
        ingest: vec![chunk(1, true, &[3]), chunk(0, false, &[1, 2])],
        cap: 2,
        redis_losses: 1,
        everysec: true,
        ..base("everysec-lost-assignment")
    };
    let r = check(World::new(cfg), LIMIT);
    let text = show("everysec-lost-assignment", &r);
    shout(&text);
    assert!(
        r.violation
            .as_ref()
            .is_some_and(|(v, _)| v.contains("no report")),
        "{text}"
    );
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

/// One generation of two chunks; a stolen lease makes two racers.
fn racers() -> Config {
    Config {
        ingest: vec![chunk(0, false, &[1, 2]), chunk(1, true, &[3])],
        cap: 3,
        crashes: 1,
        steals: 1,
        ..base("racers")
    }
}

#[test]
fn mutant_record_group_without_its_check_is_caught() {
    caught(Mutant::RecordGroupOverwrites, racers());
}

#[test]
fn mutant_giving_back_an_approval_is_caught() {
    caught(Mutant::GiveBackApproval, small());
}

#[test]
fn mutant_loaded_without_its_key_is_caught() {
    caught(Mutant::LoadedTwice, racers());
}

#[test]
fn mutant_send_without_its_marker_is_caught() {
    caught(Mutant::SendWithoutMarker, small());
}
