//! The bench's pure parts, without Redis.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::summary::*;
use super::workload::*;
use super::*;
use crate::mock::invariants::LedgerCheck;
use groupcast::events::{Chunk, Event, Recorded};

fn args(extra: &[&str]) -> BenchArgs {
    match crate::cli::parse(&["bench"], extra) {
        crate::cli::Command::Bench(a) => a,
        other => panic!("not bench: {other:?}"),
    }
}

fn plan(extra: &[&str]) -> Plan {
    args(extra).plan().unwrap()
}

#[test]
fn workloads_scaled_and_overridden_make_the_plan() {
    assert_eq!(
        plan(&["--workload", "w1", "--scale", "0.05"]),
        Plan {
            name: "W1".into(),
            recipients: 50_000,
            batches: 1,
            chunk_size: 5_000,
            group_cap: 1_000_000,
            workers: 2,
        }
    );
    let w3 = plan(&["--workload", "w3", "--workers", "3"]);
    assert_eq!(
        (w3.recipients, w3.batches, w3.chunk_size),
        (1_000, 100, 100)
    );
    assert_eq!(w3.workers, 3);
    assert_eq!(plan(&["--workload", "w4"]).group_cap, 100_000);
    assert_eq!(plan(&["--workload", "w5"]).recipients, 10_000_000);
    // No workload: the custom sizes; a tiny scale still sends to one.
    let custom = plan(&[]);
    assert_eq!(
        (custom.name.as_str(), custom.recipients),
        ("custom", 100_000)
    );
    assert_eq!(plan(&["--scale", "0.000001"]).recipients, 1);
    // Flags win over the workload and its scale.
    let p = plan(&[
        "--workload",
        "w2",
        "--scale",
        "0.5",
        "--recipients",
        "7",
        "--batches",
        "3",
        "--chunk-size",
        "2",
        "--group-cap",
        "5",
    ]);
    assert_eq!(
        (p.recipients, p.batches, p.chunk_size, p.group_cap),
        (7, 3, 2, 5)
    );
    assert_eq!(p.total_recipients(), 21);
    assert_eq!(p.batch_ids(), ["bench-0", "bench-1", "bench-2"]);
}

#[test]
fn plans_the_bench_cannot_run_are_refused() {
    for bad in [
        &["--chunk-size", "0"][..],
        &["--chunk-size", "10001"],
        &["--recipients", "50000001", "--batches", "2"],
    ] {
        assert!(
            matches!(args(bad).plan(), Err(CliError::Usage(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn the_appends_hold_every_recipient_once_in_numbered_chunks() {
    // Three appends a batch: two of fifty chunks and one of 3 (the last short).
    let p = plan(&["--recipients", "307", "--batches", "2", "--chunk-size", "3"]);
    let template = bench_template();
    let mut numbers = BTreeSet::new();
    for (index, batch) in p.batch_ids().iter().enumerate() {
        let starts: Vec<usize> = p.append_starts().collect();
        assert_eq!(starts, [0, 150, 300]);
        let appends: Vec<Vec<Chunk>> = starts
            .iter()
            .map(|from| p.append_chunks(&template, index, batch, *from))
            .collect();
        assert_eq!(
            appends.iter().map(Vec::len).collect::<Vec<_>>(),
            [50, 50, 3]
        );
        let chunks: Vec<&Chunk> = appends.iter().flatten().collect();
        let seqs: Vec<u32> = chunks.iter().map(|c| c.seq).collect();
        assert_eq!(seqs, (0..103).collect::<Vec<u32>>());
        let last: Vec<u32> = chunks.iter().filter(|c| c.last).map(|c| c.seq).collect();
        assert_eq!(last, [102]);
        assert_eq!(chunks[102].recipients.len(), 1);
        for c in &chunks {
            assert_eq!(&c.batch, batch);
            for r in &c.recipients {
                assert!(numbers.insert(r.to.clone()), "{} twice", r.to);
            }
        }
    }
    assert_eq!(numbers.len(), 614);
}

#[test]
fn counters_are_read_from_proc_and_info() {
    // The command name may hold spaces and parentheses; utime and stime
    // are in clock ticks (100 a second).
    let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 1";
    assert_eq!(cpu_seconds_in_stat(stat), 4.0);
    assert_eq!(cpu_seconds_in_stat("garbage"), 0.0);

    let cpu = "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:2.500000\r\n";
    assert_eq!(info_field(cpu, "used_cpu_sys"), Some(1.25));
    assert_eq!(info_field(cpu, "used_cpu"), None);
    assert_eq!(redis_cpu_seconds(cpu), 3.75);

    let stats = "# Commandstats\r\n\
        cmdstat_evalsha:calls=42,usec=900,usec_per_call=21.43,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_info:calls=99,usec=1,usec_per_call=0.01,rejected_calls=0,failed_calls=0\r\n\
        cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n";
    assert_eq!(
        commands_by_name(stats),
        BTreeMap::from([("config|resetstat".into(), 1), ("evalsha".into(), 42)])
    );
}

#[test]
fn cpu_is_measured_between_two_readings() {
    let start = CpuSeconds {
        workers: 1.0,
        redis: 0.5,
        mock: 0.25,
        producer: 0.0,
    };
    let end = CpuSeconds {
        workers: 5.0,
        redis: 1.5,
        mock: 1.25,
        producer: 2.0,
    };
    let used = end.since(start);
    assert_eq!(
        used,
        CpuSeconds {
            workers: 4.0,
            redis: 1.0,
            mock: 1.0,
            producer: 2.0,
        }
    );
    // Two cores: half of all the CPU, unless the mock alone took longer.
    assert_eq!(used.wall_bound(), 4.0);
    let mock_bound = CpuSeconds {
        mock: 9.0,
        ..CpuSeconds::default()
    };
    assert_eq!(mock_bound.wall_bound(), 9.0);
}

fn recorded(ms: u64, type_name: &str, payload: serde_json::Value) -> Recorded {
    let bytes = rmp_serde::to_vec_named(&payload).unwrap();
    Recorded {
        id: format!("{ms}-0"),
        key: String::new(),
        event: Event::decode(type_name, &bytes).unwrap(),
    }
}

#[test]
fn latencies_pair_each_event_with_what_started_it() {
    let loaded = |ms: u64, seq: u32| {
        recorded(
            ms,
            "chunk_loaded",
            json!({"gen": 0, "seq": seq, "group_id": "G1", "registered": 1, "duplicates": 0, "failed": []}),
        )
    };
    let events = [
        loaded(1_300, 0),
        loaded(1_450, 1),
        // Not appended by this run: no latency.
        loaded(1_500, 9),
        recorded(1_600, "generation_ready", json!({"gen": 0, "chunks": 2})),
        recorded(
            1_640,
            "send_triggered",
            json!({"gen": 0, "group_id": "G1", "outcome": "sent"}),
        ),
        // A generation that was never ready: no latency.
        recorded(
            1_700,
            "send_triggered",
            json!({"gen": 1, "group_id": "G2", "outcome": "sent"}),
        ),
    ];
    let mut l = Latencies::default();
    l.add_batch(&BTreeMap::from([(0, 1_000), (1, 1_050)]), None, &events);
    assert_eq!(l.submit_to_loaded_ms, [300, 400]);
    assert_eq!(l.complete_to_send_ms, [40]);
    // Submitted at the first append; no chunk_assigned, group or report.
    let s = l.stages[0];
    assert_eq!(
        (s.submitted, s.accepted, s.loaded, s.sent, s.reported),
        (Some(1_000), None, Some(1_500), Some(1_700), None)
    );
}

#[test]
fn a_batchs_stages_are_its_first_accept_and_the_last_of_each_later_step() {
    let events = [
        recorded(
            1_010,
            "chunk_assigned",
            json!({"seq": 1, "gen": 0, "count": 1, "last": false, "digest": "d1"}),
        ),
        recorded(
            1_005,
            "chunk_assigned",
            json!({"seq": 0, "gen": 0, "count": 1, "last": false, "digest": "d0"}),
        ),
        recorded(1_020, "group_created", json!({"gen": 0, "group_id": "G1"})),
        recorded(1_090, "group_created", json!({"gen": 1, "group_id": "G2"})),
        recorded(
            1_100,
            "chunk_loaded",
            json!({"gen": 0, "seq": 0, "group_id": "G1", "registered": 1, "duplicates": 0, "failed": []}),
        ),
        recorded(
            1_200,
            "send_triggered",
            json!({"gen": 0, "group_id": "G1", "outcome": "sent"}),
        ),
        recorded(
            1_350,
            "group_completed",
            json!({"gen": 0, "group_id": "G1", "status": "COMPLETE", "sent_success": 1, "sent_failed": 0}),
        ),
    ];
    let mut stages = vec![BatchStages::of(Some(1_000), &events)];
    let s = stages[0];
    assert_eq!(s.accepted, Some(1_005), "the first accept");
    assert_eq!(s.group_recorded, Some(1_090), "the last group");
    assert_eq!(s.completed, Some(1_350));
    // A second batch, slower everywhere, reported.
    stages.push(BatchStages {
        submitted: Some(0),
        accepted: Some(100),
        group_recorded: Some(300),
        loaded: Some(400),
        sent: Some(500),
        completed: Some(900),
        reported: Some(1_000),
    });
    let b = stage_breakdown(&stages);
    assert_eq!(b["submitted_to_accepted"]["p50"], 100);
    assert_eq!(b["submitted_to_accepted"]["p99"], 100);
    assert_eq!(b["accepted_to_group_recorded"]["batches"], 2);
    assert_eq!(b["group_recorded_to_loaded"]["p50"], 100);
    // Only the second batch was reported.
    assert_eq!(b["completed_to_reported"]["batches"], 1);
    assert_eq!(b["submitted_to_reported"]["p50"], 1_000);
    assert_eq!(
        stage_breakdown(&[])["submitted_to_reported"],
        serde_json::Value::Null
    );
}

#[test]
fn percentiles_of_sorted_values() {
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(percentile(&v, 0.5), 51);
    assert_eq!(percentile(&v, 0.99), 99);
    assert_eq!(percentile(&v, 1.0), 100);
    assert_eq!(percentile(&[7], 0.99), 7);
    assert_eq!(percentile(&[], 0.5), 0);
}

#[test]
fn the_largest_keys_come_first() {
    let k = |key: &str, bytes: u64| KeySize {
        key: key.into(),
        bytes,
    };
    assert_eq!(
        largest_keys(vec![k("a", 1), k("b", 30), k("c", 2), k("d", 30)], 3),
        [k("b", 30), k("d", 30), k("c", 2)]
    );
}

#[test]
fn violations_name_every_broken_rule() {
    let ledger = LedgerCheck {
        registered: BTreeMap::from([("bench-0".into(), 10)]),
        ..LedgerCheck::default()
    };
    assert!(violations(&[], &ledger, 10).is_empty());

    let failed = [FailedCheck {
        batch: "bench-0".into(),
        invariant: 2,
        detail: "gen 0: 2 send event(s)".into(),
    }];
    let ledger = LedgerCheck {
        violations: vec!["0101 registered more than once".into()],
        ..ledger
    };
    assert_eq!(
        violations(&failed, &ledger, 12),
        [
            "bench-0: invariant 2: gen 0: 2 send event(s)",
            "0101 registered more than once",
            "10 of 12 recipients registered at the provider",
        ]
    );
}

#[test]
fn the_result_line_is_the_measures_summed_and_rounded() {
    let p = plan(&["--workload", "w1", "--scale", "0.05"]);
    let m = Measured {
        chunks: 10,
        wall_seconds: 0.5,
        cpu: CpuSeconds {
            workers: 0.25,
            redis: 0.0125,
            mock: 0.2,
            producer: 0.1,
        },
        commands: BTreeMap::from([("evalsha".into(), 42), ("xadd".into(), 202)]),
        memory: MemoryUse {
            start: 1_000.0,
            peak: 5_000.5,
            end: 1_200.0,
            retained_event_bytes: 6_616,
            scripts: 28_360,
            largest_keys: vec![KeySize {
                key: "bench:{s0}:work".into(),
                bytes: 6_194,
            }],
            stats_end: serde_json::Map::from_iter([("keys.count".to_string(), json!(6))]),
            dedupe_bytes_per_recipient: 7.0625,
            results_bytes_per_recipient: 4.25,
        },
        latencies: Latencies {
            submit_to_loaded_ms: vec![449, 429, 431],
            complete_to_send_ms: vec![2],
            stages: Vec::new(),
        },
        verified: true,
        kind: RunKind::in_process(),
    };
    let line = result_line(&p, &m);
    assert_eq!(
        line,
        json!({
            "mode": "in-process",
            "server": "redis",
            "workload": "W1",
            "recipients": 50_000,
            "chunks": 10,
            "batches": 1,
            "group_cap": 1_000_000,
            "workers": 2,
            "wall_seconds": 0.5,
            "recipients_per_second": 100_000.0,
            "worker_cpu_seconds": 0.25,
            "worker_cpu_seconds_per_million": 5.0,
            "redis_cpu_seconds": 0.013,
            "redis_commands": 244,
            "redis_commands_per_chunk": 24.4,
            "redis_commands_by_name": {"evalsha": 42, "xadd": 202},
            "mock_cpu_seconds": 0.2,
            "producer_cpu_seconds": 0.1,
            // 0.5 s over max(0.2, 0.5625 / 2).
            "wall_over_bound": 1.778,
            "redis_used_memory_start": 1_000,
            "redis_used_memory_peak": 5_000,
            "redis_used_memory_end": 1_200,
            "retained_event_bytes": 6_616,
            "redis_used_memory_scripts": 28_360,
            "largest_keys_end": [["bench:{s0}:work", 6_194]],
            "redis_memory_stats_end": {"keys.count": 6},
            "dedupe_bytes_per_recipient": 7.063,
            "results_bytes_per_recipient": 4.25,
            "submit_seconds": null,
            "submit_runs": null,
            "submit_max_rss_mb": null,
            "worker_durability": null,
            "submit_to_loaded_ms_p50": 431,
            "submit_to_loaded_ms_p99": 449,
            "complete_to_send_ms_p50": 2,
            "complete_to_send_ms_p99": 2,
            "stages_ms": stage_breakdown(&[]),
            "verified": true,
        })
    );
}

#[test]
fn a_user_path_line_has_the_submits_and_no_append_latencies() {
    let p = plan(&["--workload", "w3", "--scale", "0.1", "--user-path"]);
    let m = Measured {
        chunks: 100,
        wall_seconds: 2.0,
        kind: RunKind {
            mode: "user-path",
            server: "valkey-everysec".into(),
            submit: Some(SubmitUse {
                runs: 1,
                seconds: 1.23456,
                max_rss_bytes: 12 * 1024 * 1024 + 512 * 1024,
                cpu_seconds: 0.5,
            }),
            durability: Some("--durability auto: ...".into()),
        },
        latencies: Latencies {
            submit_to_loaded_ms: vec![],
            complete_to_send_ms: vec![3],
            stages: Vec::new(),
        },
        ..Measured::default()
    };
    let line = result_line(&p, &m);
    assert_eq!(line["mode"], "user-path");
    assert_eq!(line["server"], "valkey-everysec");
    assert_eq!(line["submit_seconds"], 1.235);
    assert_eq!(line["submit_runs"], 1);
    assert_eq!(line["submit_max_rss_mb"], 12.5);
    assert_eq!(line["worker_durability"], "--durability auto: ...");
    assert_eq!(line["submit_to_loaded_ms_p50"], serde_json::Value::Null);
    assert_eq!(line["complete_to_send_ms_p99"], 3);
}

#[test]
fn the_user_path_takes_a_server_and_no_worker_tuning() {
    let a = args(&["--user-path", "--server", "valkey-always"]);
    assert!(a.user_path);
    assert_eq!(a.server, ServerKind::ValkeyAlways);
    assert_eq!(args(&["--user-path"]).server, ServerKind::Redis);
    let parse = |argv: &[&str]| {
        BenchArgs::augment_args(clap::Command::new("groupcast"))
            .try_get_matches_from(std::iter::once(&"groupcast").chain(argv))
            .map(|_| ())
    };
    assert!(parse(&["--user-path", "--concurrency", "4"]).is_err());
    assert!(parse(&["--user-path", "--lanes"]).is_err());
    assert!(
        parse(&["--server", "redis"]).is_err(),
        "--server needs --user-path"
    );
    assert!(parse(&["--user-path", "--server", "valkey"]).is_err());
}
