//! The Redis server itself: whether it answers, its settings and its
//! statistics (for the worker's start-up checks and the benchmark).

use std::time::Duration;

use redis::Value;

use super::{Store, StoreError, StoreResult};

impl Store {
    /// Checks that the server answers `PING`.
    pub async fn ping(&self) -> StoreResult<()> {
        redis::cmd("PING")
            .query_async::<String>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Setting `name` of every master (of the one server when not a
    /// cluster), labelled `host:port` (`server` when not a cluster); `None`
    /// where it cannot be read (`CONFIG GET` refused, a node away).
    pub(crate) async fn config_everywhere(&self, name: &str) -> Vec<(String, Option<String>)> {
        let cmd = redis::cmd("CONFIG").arg("GET").arg(name).clone();
        match self.on_every_master(&cmd).await {
            Ok(replies) => replies
                .into_iter()
                .map(|(node, r)| {
                    let v = r
                        .ok()
                        .and_then(|v| redis::from_redis_value::<Vec<String>>(v).ok())
                        .and_then(|v| v.get(1).cloned());
                    (node, v)
                })
                .collect(),
            Err(_) => vec![("server".to_string(), None)],
        }
    }

    /// Whether this connection may use `WAITAOF` (Redis/Valkey 7.2+, and
    /// allowed by the ACL): `WAITAOF 0 0 0` answers at once where it works.
    pub(crate) async fn waitaof_works(&self) -> StoreResult<bool> {
        match redis::cmd("WAITAOF")
            .arg(0)
            .arg(0)
            .arg(0)
            .query_async::<Value>(&mut self.conn.clone())
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => {
                // Redis away (restarting, a dropped connection) says nothing
                // about WAITAOF: the caller waits and asks again. An answer
                // (unknown command, no permission) is a no.
                let e = StoreError::from(e);
                if e.is_retryable() {
                    Err(e)
                } else {
                    Ok(false)
                }
            }
        }
    }

    /// The server process's `run_id` (`INFO server`): a new one at every
    /// start.
    pub(crate) async fn run_id(&self) -> StoreResult<String> {
        let info = self.info("server").await?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_string())
            .ok_or_else(|| StoreError::Config {
                url: self.target.redacted(),
                reason: "INFO server has no run_id".into(),
            })
    }

    /// A section of `INFO` (of the server the command lands on).
    pub async fn info(&self, section: &str) -> StoreResult<String> {
        Ok(redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Resets the server's statistics (`CONFIG RESETSTAT`): command counts
    /// start again from zero.
    pub async fn reset_stats(&self) -> StoreResult<()> {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The bytes `key` takes (`MEMORY USAGE`; `exact` counts every element
    /// of a collection instead of sampling), `None` when it does not exist.
    pub async fn memory_usage(&self, key: &str, exact: bool) -> StoreResult<Option<u64>> {
        let mut cmd = redis::cmd("MEMORY");
        cmd.arg("USAGE").arg(key);
        if exact {
            cmd.arg("SAMPLES").arg(0);
        }
        Ok(cmd.query_async(&mut self.conn.clone()).await?)
    }

    /// The numeric entries of `MEMORY STATS`.
    pub async fn memory_stats(&self) -> StoreResult<Vec<(String, i64)>> {
        let v: Value = redis::cmd("MEMORY")
            .arg("STATS")
            .query_async(&mut self.conn.clone())
            .await?;
        let mut out = Vec::new();
        if let Value::Array(kv) = &v {
            for p in kv.chunks(2) {
                if let [k, v] = p {
                    if let (Ok(k), Ok(v)) = (
                        redis::from_redis_value::<String>(k.clone()),
                        redis::from_redis_value::<i64>(v.clone()),
                    ) {
                        out.push((k, v));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every key matching `pattern` on the server the command lands on
    /// (`KEYS`: blocks the server while it runs; for small test and bench
    /// keyspaces. [`Store::scan_match`] is the one for production).
    pub async fn keys_matching(&self, pattern: &str) -> StoreResult<Vec<String>> {
        Ok(redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut self.conn.clone())
            .await?)
    }
}

/// Whether a Redis server answers `PING` at `url` within `timeout` (without
/// a connection manager's retries: for probing, not for working).
pub async fn answers(url: &str, timeout: Duration) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let attempt = async {
        let mut c = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING").query_async::<String>(&mut c).await.ok()
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(_)))
}
