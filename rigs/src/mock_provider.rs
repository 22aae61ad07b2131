//! `groupcast mock-provider`: serves the mock provider on its own.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::mock::{Faults, MockConfig};
use groupcast::cli::{secret_from_env, CliError};

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
    /// Share of messages that would be registered but are answered with a
    /// registration failure code instead (decided by the number: a retry
    /// gets the same answer).
    #[arg(long, default_value_t = 0.0)]
    pub registration_failure_rate: f64,
    /// The codes injected registration failures get, comma-separated
    /// (e.g. 1062,1000).
    #[arg(long, value_delimiter = ',', default_value = "1062")]
    pub registration_failure_codes: Vec<String>,
    /// Registered messages become final between this and twice this after
    /// the send (never before the group is COMPLETE), e.g. 500ms, 2s, 1h.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub delivery_delay: Duration,
    /// Share of registered messages whose delivery fails.
    #[arg(long, default_value_t = 0.0)]
    pub delivery_failure_rate: f64,
    /// The codes failed deliveries get, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3104,3043")]
    pub delivery_failure_codes: Vec<String>,
    /// Share of registered messages that never get a final result (they
    /// stay 3000).
    #[arg(long, default_value_t = 0.0)]
    pub never_final_rate: f64,
}

/// Runs the mock provider until interrupted.
pub(crate) async fn run(args: MockProviderArgs) -> Result<(), CliError> {
    let faults = args.faults()?;
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
    let config = MockConfig {
        api_key: key,
        api_secret: secret,
        cap: args.cap,
        complete_after: Duration::from_millis(args.complete_after_ms),
        faults,
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

impl MockProviderArgs {
    /// The faults and delivery hooks the flags ask for, checked.
    fn faults(&self) -> Result<Faults, CliError> {
        let args = self;
        for (name, v) in [
            ("--error-rate", args.error_rate),
            ("--drop-rate", args.drop_rate),
            (
                "--registration-failure-rate",
                args.registration_failure_rate,
            ),
            ("--delivery-failure-rate", args.delivery_failure_rate),
            ("--never-final-rate", args.never_final_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(CliError::Usage(format!(
                    "{name} must be between 0 and 1, got {v}"
                )));
            }
        }
        let faults = Faults {
            error_rate: args.error_rate,
            drop_rate: args.drop_rate,
            latency_ms: args.latency_ms,
            rate_limit_per_sec: args.rate_limit,
            registration_failure_rate: args.registration_failure_rate,
            registration_failure_codes: trimmed(&args.registration_failure_codes),
            delivery_delay_ms: u64::try_from(args.delivery_delay.as_millis()).unwrap_or(u64::MAX),
            delivery_failure_rate: args.delivery_failure_rate,
            delivery_failure_codes: trimmed(&args.delivery_failure_codes),
            never_final_rate: args.never_final_rate,
            ..Faults::default()
        };
        faults.validate().map_err(CliError::Usage)?;
        Ok(faults)
    }
}

/// Codes as given on the command line, without blanks around them.
fn trimmed(codes: &[String]) -> Vec<String> {
    codes
        .iter()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    fn faults(flags: &[&str]) -> Result<Faults, CliError> {
        let Command::MockProvider(a) = crate::cli::parse(&["mock-provider"], flags) else {
            panic!("not mock-provider")
        };
        a.faults()
    }

    #[test]
    fn delivery_flags() {
        assert_eq!(faults(&[]).unwrap(), Faults::default());
        let f = faults(&[
            "--registration-failure-rate",
            "0.1",
            "--registration-failure-codes",
            "1062, 1000",
            "--delivery-delay",
            "2s",
            "--delivery-failure-rate",
            "0.3",
            "--delivery-failure-codes",
            "3104,3107",
            "--never-final-rate",
            "0.05",
        ])
        .unwrap();
        assert_eq!(f.registration_failure_rate, 0.1);
        assert_eq!(f.registration_failure_codes, ["1062", "1000"]);
        assert_eq!(f.delivery_delay_ms, 2_000);
        assert_eq!(f.delivery_failure_rate, 0.3);
        assert_eq!(f.delivery_failure_codes, ["3104", "3107"]);
        assert_eq!(f.never_final_rate, 0.05);
        for bad in [
            &["--never-final-rate", "1.5"][..],
            &["--registration-failure-codes", "2000"],
            &["--registration-failure-codes", "1026"],
            &["--delivery-failure-codes", "4000"],
            &[
                "--delivery-failure-rate",
                "0.8",
                "--never-final-rate",
                "0.5",
            ],
        ] {
            assert!(faults(bad).is_err(), "{bad:?}");
        }
    }
}
