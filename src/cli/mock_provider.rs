//! `groupcast mock-provider`: serves the mock provider on its own.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{secret_from_env, CliError};
use crate::mock::{Faults, MockConfig};

/// Mock provider flags.
#[derive(Debug, Args)]
pub struct MockProviderArgs {
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, env = "GROUPCAST_MOCK_LISTEN", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// API key the mock accepts. Prefer GROUPCAST_MOCK_API_KEY or
    /// GROUPCAST_MOCK_API_KEY_FILE: a command line is visible to `ps`.
    #[arg(long, env = "GROUPCAST_MOCK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// API secret the mock checks signatures with. Prefer
    /// GROUPCAST_MOCK_API_SECRET or GROUPCAST_MOCK_API_SECRET_FILE: a
    /// command line is visible to `ps`.
    #[arg(long, env = "GROUPCAST_MOCK_API_SECRET", hide_env_values = true)]
    pub api_secret: Option<String>,
    /// Group cap: messages beyond it are answered 1000.
    #[arg(long, default_value_t = 1_000_000)]
    pub cap: u64,
    /// Milliseconds from send to COMPLETE.
    #[arg(long, default_value_t = 200)]
    pub complete_after_ms: u64,
    /// Share of requests answered 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of requests whose effect is committed but whose answer is dropped.
    #[arg(long, default_value_t = 0.0)]
    pub drop_rate: f64,
    /// Added latency per request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Requests per second above which 429 is answered.
    #[arg(long)]
    pub rate_limit: Option<u32>,
}

/// Runs the mock provider until interrupted.
pub async fn run(args: MockProviderArgs) -> Result<(), CliError> {
    let key = match args.api_key {
        Some(k) => k,
        None => secret_from_env("GROUPCAST_MOCK_API_KEY")?.ok_or_else(|| {
            CliError::Usage(
                "set GROUPCAST_MOCK_API_KEY or GROUPCAST_MOCK_API_KEY_FILE (or --api-key)".into(),
            )
        })?,
    };
    let secret = match args.api_secret {
        Some(s) => s,
        None => secret_from_env("GROUPCAST_MOCK_API_SECRET")?.ok_or_else(|| {
            CliError::Usage(
                "set GROUPCAST_MOCK_API_SECRET or GROUPCAST_MOCK_API_SECRET_FILE (or --api-secret)"
                    .into(),
            )
        })?,
    };
    for (name, v) in [
        ("--error-rate", args.error_rate),
        ("--drop-rate", args.drop_rate),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(CliError::Usage(format!(
                "{name} must be between 0 and 1, got {v}"
            )));
        }
    }
    let config = MockConfig {
        api_key: key,
        api_secret: secret,
        cap: args.cap,
        complete_after: Duration::from_millis(args.complete_after_ms),
        faults: Faults {
            error_rate: args.error_rate,
            drop_rate: args.drop_rate,
            latency_ms: args.latency_ms,
            rate_limit_per_sec: args.rate_limit,
            ..Faults::default()
        },
        ..MockConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::Usage(format!("--listen {}: {e}", args.listen)))?;
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    println!(
        "mock provider listening on http://{local} (ledger: http://{local}/_mock/ledger/summary)"
    );
    tokio::select! {
        r = crate::mock::serve(listener, config) => r.map_err(|e| CliError::Failed(format!("mock provider stopped: {e}"))),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
