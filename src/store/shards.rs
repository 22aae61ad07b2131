//! The deployment's shard count, recorded in Redis so that every process of
//! a deployment (workers, `submit`, `status`, other-language producers)
//! agrees on it without being told: `<prefix>:shards` holds it as a decimal
//! string (see [`Keyspace::shard_count`](crate::keys::Keyspace::shard_count)).
//!
//! The first process to connect records it with `SET NX`: its `--shards`,
//! or with `auto` one shard per master on a cluster (the tags of
//! [`shard_tag`](crate::keys::shard_tag) then put one shard on each master
//! of a cluster made by `redis-cli --cluster create`) and 1 on a single
//! server. Later processes read it; one asking for another count is
//! refused, since a batch's keys move with the count.

use redis::AsyncCommands;

use super::{Store, StoreError, StoreResult};
use crate::keys::{Keyspace, ShardCount, MAX_SHARDS};

/// Where a settled shard count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardSource {
    /// The deployment had recorded it.
    Recorded,
    /// This process recorded it: why that count (`--shards`, or which
    /// `auto` default).
    RecordedNow(&'static str),
}

impl Store {
    /// The shard count the deployment recorded, if any.
    pub(crate) async fn recorded_shards(&self) -> StoreResult<Option<u32>> {
        let key = self.keys.shard_count();
        let v: Option<String> = self.conn.clone().get(&key).await?;
        v.map(|v| parse_recorded(&key, &v)).transpose()
    }

    /// The shard count to use when the deployment has none recorded and
    /// the process asks for `auto`: one per master on a cluster, 1 on a
    /// single server, and 1 on a cluster that already holds the ingest
    /// stream of shard `{s0}`: a deployment from before the count was
    /// recorded, whose default was one shard (a count above one never has
    /// the tag `s0` for shard 0), so that its batches keep their keys.
    /// Returns the count and why.
    pub(crate) async fn default_shards(&self) -> StoreResult<(u32, &'static str)> {
        let masters = self.cluster_masters().await?.len();
        if masters == 0 {
            return Ok((1, "a single server"));
        }
        let n = u32::try_from(masters)
            .unwrap_or(MAX_SHARDS)
            .clamp(1, MAX_SHARDS);
        if n > 1 {
            let old = Keyspace::new(self.keys.prefix(), 1).ingest(0);
            let exists: bool = self.conn.clone().exists(&old).await?;
            if exists {
                tracing::warn!(
                    "shards: {old} exists (a deployment from before the shard count was recorded): \
                     keeping 1 shard, not one per master; to spread batches over the masters, \
                     drain and change it (docs/cluster.md, \"Changing the shard count\")"
                );
                return Ok((
                    1,
                    "a cluster holding an earlier one-shard deployment's keys",
                ));
            }
        }
        Ok((n, "one per cluster master"))
    }

    /// Settles the shard count this process uses (see the module docs):
    /// the recorded one, or `asked` (the `auto` default for
    /// [`ShardCount::Auto`]) recorded when none is. Refuses a fixed count
    /// that differs from the recorded one.
    pub async fn settle_shards(&self, asked: ShardCount) -> StoreResult<(u32, ShardSource)> {
        let (n, source) = match self.recorded_shards().await? {
            Some(n) => (n, ShardSource::Recorded),
            None => {
                let (want, why) = match asked {
                    ShardCount::Fixed(n) => (n, "--shards"),
                    ShardCount::Auto => self.default_shards().await?,
                };
                let key = self.keys.shard_count();
                let set: bool = redis::cmd("SET")
                    .arg(&key)
                    .arg(want)
                    .arg("NX")
                    .query_async::<Option<String>>(&mut self.conn.clone())
                    .await?
                    .is_some();
                if set {
                    (want, ShardSource::RecordedNow(why))
                } else {
                    // Another process recorded one between our GET and SET:
                    // its count wins.
                    let n = self.recorded_shards().await?.ok_or_else(|| {
                        StoreError::ShardCount(format!(
                            "{key} was recorded and deleted again while this process started: \
                             try again"
                        ))
                    })?;
                    (n, ShardSource::Recorded)
                }
            }
        };
        match asked {
            ShardCount::Fixed(a) if a != n => Err(StoreError::ShardCount(mismatch(
                &self.keys.shard_count(),
                n,
                a,
            ))),
            _ => Ok((n, source)),
        }
    }

    /// The same store with a keyspace of `shards` shards.
    pub(crate) fn with_shards(mut self, shards: u32) -> Store {
        self.keys = Keyspace::new(self.keys.prefix(), shards);
        self
    }
}

fn parse_recorded(key: &str, v: &str) -> StoreResult<u32> {
    match v.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_SHARDS).contains(&n) => Ok(n),
        _ => Err(StoreError::ShardCount(format!(
            "{key} holds {v:?}, not a shard count from 1 to {MAX_SHARDS}: set it to the count \
             the deployment's keys use (`redis-cli SET {key} N`; see docs/cluster.md)"
        ))),
    }
}

fn mismatch(key: &str, recorded: u32, asked: u32) -> String {
    format!(
        "the deployment uses {recorded} shard(s) (recorded in {key}), not the {asked} asked for: \
         leave --shards out (or GROUPCAST_SHARDS=auto) to use its count. Changing the count moves \
         every batch's keys: drain every batch first, then `redis-cli SET {key} {asked}` and \
         restart every process (docs/cluster.md, \"Changing the shard count\")"
    )
}
