//! `groupcast verify BATCH`: checks the invariants; exit 0 only if all hold.

use clap::Args;

use super::{secret_from_env, CliError, RedisArgs};
use crate::keys::validate_batch_id;
use crate::provider::{ProviderClient, ProviderConfig};
use crate::verify::verify_batch;

/// Verify flags.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The connection (global flags: `--redis`, `--prefix`, `--shards`, TLS).
    #[command(flatten)]
    pub redis: RedisArgs,
    /// The batch.
    pub batch: String,
    /// The group cap the workers ran with.
    #[arg(long, env = "GROUPCAST_GROUP_CAP", default_value_t = crate::worker::WorkerConfig::GROUP_CAP)]
    pub group_cap: u64,
    /// Provider base URL, to check the provider's own view of every group
    /// (needs GROUPCAST_PROVIDER_API_KEY / _SECRET; skipped without them).
    #[arg(long, env = "GROUPCAST_PROVIDER_URL")]
    pub provider_url: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs verify.
pub(crate) async fn run(args: VerifyArgs) -> Result<(), CliError> {
    validate_batch_id(&args.batch)
        .map_err(|e| CliError::Usage(format!("{:?}: {e}", args.batch)))?;
    let store = args.redis.connect().await?;
    let provider = match (
        &args.provider_url,
        secret_from_env("GROUPCAST_PROVIDER_API_KEY")?,
        secret_from_env("GROUPCAST_PROVIDER_API_SECRET")?,
    ) {
        (Some(url), Some(api_key), Some(api_secret)) => Some(
            ProviderClient::new(ProviderConfig {
                base_url: url.clone(),
                api_key,
                api_secret,
                ..ProviderConfig::default()
            })
            .map_err(|e| CliError::Usage(format!("--provider-url: {e}")))?,
        ),
        _ => None,
    };
    // A batch with nothing recorded would pass every check vacuously: say
    // what it is instead (a mistyped id, another --prefix, or expired).
    let b = &args.batch;
    if store.batch(b).state().await?.fields.is_empty() {
        return Err(CliError::Failed(if store.is_tombstoned(b).await? {
            format!("batch {b}: reported, and its events have expired (--retention): nothing left to verify")
        } else {
            format!("batch {b}: nothing of it is recorded: check the batch id and --prefix")
        }));
    }
    let v = verify_batch(&store, provider.as_ref(), &args.batch, args.group_cap).await?;
    if args.json {
        println!("{}", serde_json::to_string(&v).unwrap_or_default());
    } else {
        for c in &v.checks {
            println!(
                "{} invariant {}: {}",
                if c.ok { "ok  " } else { "FAIL" },
                c.invariant,
                c.detail
            );
        }
        println!(
            "batch {}: {} ({}; provider view {})",
            args.batch,
            if v.passed() {
                "every invariant holds"
            } else {
                "INVARIANTS BROKEN"
            },
            if v.reported {
                "reported"
            } else {
                "not reported yet"
            },
            if provider.is_some() {
                "checked"
            } else {
                "not checked"
            }
        );
    }
    if v.passed() {
        Ok(())
    } else {
        Err(CliError::Failed(format!(
            "{} check(s) failed for batch {}",
            v.failures().len(),
            args.batch
        )))
    }
}
