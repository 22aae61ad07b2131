//! Prometheus metrics: the recorder, real histogram buckets (never summaries,
//! so that several workers can be aggregated), upkeep so that memory stays
//! flat, and an HTTP listener that answers `/metrics` and nothing else.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Histogram buckets, in seconds: from a fast Redis call to a long campaign.
pub const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
];

/// Installs the global recorder (once per process; later calls return the
/// same handle) and starts its upkeep.
pub fn install() -> Option<PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<PrometheusHandle>> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .ok()?
                .install_recorder()
                .ok()?;
            describe();
            let upkeep = handle.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    upkeep.run_upkeep();
                }
            });
            Some(handle)
        })
        .clone()
}

/// Serves `GET /metrics` on `addr` (other paths answer 404).
pub async fn serve(addr: SocketAddr, handle: PrometheusHandle) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let h = handle.clone();
            async move { h.render() }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(local)
}

/// Help texts and units for every metric groupcast emits.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "groupcast_events_appended_total",
        "Events appended to batch logs, by type"
    );
    describe_counter!(
        "groupcast_redis_writes_lost_total",
        "Acknowledged events found missing when read back: Redis lost writes (alert on any)"
    );
    describe_counter!(
        "groupcast_chunks_total",
        "Ingest chunks handled, by outcome"
    );
    describe_counter!(
        "groupcast_recipients_registered_total",
        "Recipients registered at the provider"
    );
    describe_counter!(
        "groupcast_recipients_failed_total",
        "Recipients refused at registration"
    );
    describe_counter!(
        "groupcast_provider_requests_total",
        "Provider HTTP requests, by endpoint and status"
    );
    describe_histogram!(
        "groupcast_provider_request_duration_seconds",
        Unit::Seconds,
        "Provider request latency"
    );
    describe_histogram!(
        "groupcast_rate_limiter_wait_seconds",
        Unit::Seconds,
        "Time spent waiting for the shared rate limiter"
    );
    describe_counter!(
        "groupcast_work_items_total",
        "Work items run, by op and outcome"
    );
    describe_counter!(
        "groupcast_retries_total",
        "Retries scheduled, by op and reason"
    );
    describe_counter!(
        "groupcast_dead_letters_total",
        "Entries dead-lettered, by source stream"
    );
    describe_counter!(
        "groupcast_reclaimed_total",
        "Entries taken over from idle consumers"
    );
    describe_counter!(
        "groupcast_reclaimed_trimmed_total",
        "Pending entries found trimmed away when reclaiming"
    );
    describe_counter!(
        "groupcast_entries_left_pending_total",
        "Entries left pending after a Redis failure"
    );
    describe_counter!(
        "groupcast_sends_refused_total",
        "Sends refused because provider and events disagreed"
    );
    describe_counter!("groupcast_groups_sent_total", "Groups sent, by outcome");
    describe_counter!(
        "groupcast_batches_reported_total",
        "Batches whose report was decided"
    );
    describe_counter!(
        "groupcast_batch_stalls_total",
        "Stalls recorded by the watchdog"
    );
    describe_histogram!(
        "groupcast_batch_duration_seconds",
        Unit::Seconds,
        "Time from a batch's first chunk to its report"
    );
    describe_gauge!(
        "groupcast_worker_in_flight",
        "Entries being handled by this worker"
    );
    describe_gauge!("groupcast_stream_length", "Entries in a stream");
    describe_gauge!(
        "groupcast_stream_pending",
        "Entries delivered but not acknowledged, per consumer group"
    );
    describe_gauge!(
        "groupcast_stream_lag",
        "Entries not yet delivered to a consumer group"
    );
    describe_gauge!(
        "groupcast_delayed_retries",
        "Work entries waiting for a delayed retry"
    );
    describe_gauge!(
        "groupcast_dead_letters",
        "Entries in the dead-letter stream"
    );
    describe_gauge!(
        "groupcast_batches_in_flight",
        "Batches accepted and not reported"
    );
    describe_gauge!(
        "groupcast_batches_stalled",
        "Batches quiet past the stall threshold"
    );
}
