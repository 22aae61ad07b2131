//! The benchmark harness works end to end on a small size (the full runs are
//! benchmarks, not tests: their numbers are in docs/benchmarks.md).

use std::process::Command;

#[test]
fn bench_runs_a_small_campaign_and_prints_a_verified_json_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_groupcast"))
        .args([
            "bench",
            "--workload",
            "w3",
            "--scale",
            "0.2",
            "--batches",
            "10",
            "--workers",
            "2",
            "--timeout-secs",
            "120",
        ])
        .env_remove("GROUPCAST_LOG")
        .output()
        .expect("run groupcast bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(line["verified"], true, "{line}");
    assert_eq!(line["recipients"], 2_000, "{line}");
    assert_eq!(line["batches"], 10, "{line}");
    for field in [
        "wall_seconds",
        "worker_cpu_seconds",
        "redis_cpu_seconds",
        "mock_cpu_seconds",
        "redis_commands_per_chunk",
        "redis_used_memory_peak",
        "submit_to_loaded_ms_p99",
        "complete_to_send_ms_p99",
    ] {
        assert!(line[field].is_number(), "{field} missing: {line}");
    }
    assert!(line["redis_commands"].as_u64().unwrap_or(0) > 0, "{line}");
}

/// `groupcast bench --user-path` on `server`, small: 3 batches of 200
/// recipients in chunks of 100, three `groupcast submit` runs; its line.
fn user_path(server: &str) -> serde_json::Value {
    user_path_with(server, &[])
}

/// [`user_path`] with more bench flags.
fn user_path_with(server: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_groupcast"))
        .args([
            "bench",
            "--user-path",
            "--server",
            server,
            "--workload",
            "w3",
            "--scale",
            "0.2",
            "--batches",
            "3",
            "--timeout-secs",
            "120",
        ])
        .args(extra)
        .env_remove("GROUPCAST_LOG")
        .output()
        .expect("run groupcast bench --user-path");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench --user-path --server {server} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(line["verified"], true, "{line}");
    assert_eq!(line["mode"], "user-path", "{line}");
    assert_eq!(line["server"], server, "{line}");
    assert_eq!(line["recipients"], 600, "{line}");
    assert_eq!(line["batches"], 3, "{line}");
    // Each submit cut its 200 recipients into two chunks of 100.
    assert_eq!(line["chunks"], 6, "{line}");
    let num = |field: &str| {
        line[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} missing: {line}"))
    };
    let wall = num("wall_seconds");
    let submit = num("submit_seconds");
    assert!(submit > 0.0 && submit <= wall, "{line}");
    // A few MB for a process that streams a 200-line file; far below what
    // holding a large file would take.
    let rss = num("submit_max_rss_mb");
    assert!(rss > 1.0 && rss < 200.0, "{line}");
    assert!(num("producer_cpu_seconds") > 0.0, "{line}");
    // The workers' CPU comes from /proc in 10 ms ticks: a run this small
    // may read 0 (CI saw 0.0 for a 0.26 s run), but never more than two
    // workers can spend in the wall time, one tick each of rounding.
    let workers = num("worker_cpu_seconds");
    assert!(workers >= 0.0 && workers <= 2.0 * wall + 0.02, "{line}");
    assert!(num("redis_commands_per_chunk") > 0.0, "{line}");
    assert!(
        num("redis_used_memory_peak") >= num("redis_used_memory_start"),
        "{line}"
    );
    assert!(num("complete_to_send_ms_p99") >= 0.0, "{line}");
    line
}

#[test]
fn the_user_path_runs_submit_and_default_workers_on_redis() {
    let line = user_path("redis");
    // The workers chose for themselves, from a server without an AOF.
    let chose = line["worker_durability"].as_str().unwrap_or_default();
    assert!(
        chose.contains("--durability auto") && chose.contains("appendonly=no"),
        "{line}"
    );
}

/// Valkey comes from `scripts/ensure-deps --tests` (`scripts/test` runs
/// it); without it this test fails, saying so.
#[test]
fn the_user_path_runs_submit_and_default_workers_on_valkey_with_everysec() {
    let line = user_path("valkey-everysec");
    let chose = line["worker_durability"].as_str().unwrap_or_default();
    assert!(
        chose.contains("--durability auto") && chose.contains("appendfsync=everysec"),
        "{line}"
    );
}

/// Redis 8 comes from `scripts/ensure-deps --tests`: its WAITAOF waits for
/// the fsync, so the default workers wait with it.
#[test]
fn the_user_path_runs_submit_and_default_workers_on_redis8_waiting_for_waitaof() {
    let line = user_path("redis8-everysec");
    let chose = line["worker_durability"].as_str().unwrap_or_default();
    assert!(
        chose.contains("--durability auto") && chose.contains("WAITAOF 1 0"),
        "{line}"
    );
}

/// `--worker-durability none` is the baseline a default run is compared
/// with: the workers take it instead of choosing from the server (which
/// would wait with `WAITAOF` here).
#[test]
fn the_user_path_runs_the_workers_with_the_durability_it_is_given() {
    let line = user_path_with("redis8-everysec", &["--worker-durability", "none"]);
    let chose = line["worker_durability"].as_str().unwrap_or_default();
    assert!(
        chose.contains("--durability none") && !chose.contains("WAITAOF"),
        "{line}"
    );
}
