//! The benchmark harness works end to end on a small size (the full runs are
//! benchmarks, not tests: their numbers are in the README).

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
