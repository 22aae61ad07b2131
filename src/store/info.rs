//! What the streams hold: lengths, consumer groups' progress, delayed
//! retries, and trimming what every consumer is done with.

use redis::{AsyncCommands, Value};

use super::{Store, StoreResult};

/// A consumer group's progress on a stream (`XINFO GROUPS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupInfo {
    /// Entries delivered and not yet acknowledged.
    pub pending: Option<u64>,
    /// Entries not yet delivered (unknown to Redis after some deletions).
    pub lag: Option<u64>,
    /// The id of the last entry delivered.
    pub last_delivered: Option<String>,
    /// Consumers registered in the group (0: nobody reads the stream).
    pub consumers: Option<u64>,
}

impl GroupInfo {
    /// Group `group` in an `XINFO GROUPS` reply (RESP2 arrays or RESP3
    /// maps), if it is there.
    fn from_reply(groups: &Value, group: &str) -> Option<GroupInfo> {
        let Value::Array(list) = groups else {
            return None;
        };
        list.iter().find_map(|g| {
            let pairs = pairs(g)?;
            let field = |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .and_then(|(_, v)| redis::from_redis_value::<String>(v.clone()).ok())
            };
            (field("name").as_deref() == Some(group)).then(|| GroupInfo {
                pending: field("pending").and_then(|v| v.parse().ok()),
                lag: field("lag").and_then(|v| v.parse().ok()),
                last_delivered: field("last-delivered-id"),
                consumers: field("consumers").and_then(|v| v.parse().ok()),
            })
        })
    }
}

/// The field/value pairs of one group in an `XINFO GROUPS` reply.
fn pairs(g: &Value) -> Option<Vec<(String, Value)>> {
    let key = |k: &Value| redis::from_redis_value::<String>(k.clone()).ok();
    match g {
        Value::Array(a) => Some(
            a.chunks(2)
                .filter_map(|kv| Some((key(kv.first()?)?, kv.get(1)?.clone())))
                .collect(),
        ),
        Value::Map(m) => Some(
            m.iter()
                .filter_map(|(k, v)| Some((key(k)?, v.clone())))
                .collect(),
        ),
        _ => None,
    }
}

/// The id just after `id` (`<ms>-<seq + 1>`).
fn next_id(id: &str) -> String {
    match id.split_once('-') {
        Some((ms, seq)) => format!("{ms}-{}", seq.parse::<u64>().unwrap_or(0) + 1),
        None => id.to_string(),
    }
}

impl Store {
    /// How many entries `stream` holds (0 when it does not exist).
    pub async fn stream_len(&self, stream: &str) -> StoreResult<u64> {
        Ok(self.conn.clone().xlen(stream).await?)
    }

    /// How many work items wait in `shard`'s delayed set.
    pub(crate) async fn delayed_len(&self, shard: u32) -> StoreResult<u64> {
        Ok(self.conn.clone().zcard(self.keys.delayed(shard)).await?)
    }

    /// Consumer group `group`'s progress on `stream`; `None` when the stream
    /// has no such group. An error when the stream does not exist.
    pub async fn group_info(&self, stream: &str, group: &str) -> StoreResult<Option<GroupInfo>> {
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(stream)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(GroupInfo::from_reply(&groups, group))
    }

    /// How many entries of `stream` consumer group `group` has not read yet:
    /// the group's `lag` (Redis >= 7.0); else the stream's length, when the
    /// group does not exist (nobody has read anything) or Redis cannot say
    /// (an older server, or entries deleted in the middle). The length counts
    /// read entries not yet trimmed too, so it never under-counts. One
    /// `XINFO GROUPS` in the usual case.
    pub async fn unread(&self, stream: &str, group: &str) -> StoreResult<u64> {
        match self.group_if_any(stream, group).await?.and_then(|g| g.lag) {
            Some(lag) => Ok(lag),
            None => self.stream_len(stream).await,
        }
    }

    /// Whether `stream` has any consumer group yet.
    pub async fn has_groups(&self, stream: &str) -> StoreResult<bool> {
        let groups: Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(stream)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(matches!(groups, Value::Array(ref a) if !a.is_empty()))
    }

    /// The instant `keep` before now (ms), on the clock of the server
    /// holding `key`: what is older goes.
    async fn cutoff_at(&self, key: &str, keep: std::time::Duration) -> StoreResult<u64> {
        let now = self.time_ms_at(key).await?;
        Ok(now.saturating_sub(keep.as_millis() as u64))
    }

    /// Removes the tombstones of shard `shard` older than `remember` (by
    /// the shard's clock); returns how many.
    pub(crate) async fn forget_tombstones(
        &self,
        shard: u32,
        remember: std::time::Duration,
    ) -> StoreResult<u64> {
        let key = self.keys.reported(shard);
        let before = self.cutoff_at(&key, remember).await?;
        let n: u64 = redis::cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(format!("({before}"))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n)
    }

    /// Removes the dead letters of shard `shard` older than `keep` (by the
    /// shard's clock, which stamped their ids); returns how many. A dead
    /// letter may carry a chunk's recipients: it goes with the batches'
    /// own events, after the retention.
    pub(crate) async fn forget_dead_letters(
        &self,
        shard: u32,
        keep: std::time::Duration,
    ) -> StoreResult<u64> {
        let key = self.keys.dead_letters(shard);
        let before = self.cutoff_at(&key, keep).await?;
        let n: u64 = redis::cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg(before)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n)
    }

    /// Whether batch `batch` has a tombstone (it reported, and is
    /// remembered).
    pub async fn is_tombstoned(&self, batch: &str) -> StoreResult<bool> {
        let key = self.keys.reported(self.keys.shard_of(batch));
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(&key)
            .arg(batch)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(score.is_some())
    }

    /// Trims `stream` below the oldest entry `group` still needs: the oldest
    /// pending one, or else the first not yet delivered.
    pub(crate) async fn trim_acknowledged(&self, stream: &str, group: &str) -> StoreResult<()> {
        self.trim_acknowledged_since(stream, group, None)
            .await
            .map(drop)
    }

    /// [`Store::trim_acknowledged`], unless the group is as `seen` (what an
    /// earlier trim returned) showed it: then nothing was acknowledged since
    /// (no entry was delivered, and pending entries leave only by an
    /// acknowledgement), so the trim would remove nothing, and it costs one
    /// command instead of three. Returns what to pass next time.
    pub async fn trim_acknowledged_since(
        &self,
        stream: &str,
        group: &str,
        seen: Option<&TrimMark>,
    ) -> StoreResult<Option<TrimMark>> {
        let Some(info) = self.group_info(stream, group).await? else {
            return Ok(None);
        };
        let Some(last_delivered) = info.last_delivered else {
            return Ok(None);
        };
        let mark = info.pending.map(|pending| TrimMark {
            last_delivered: last_delivered.clone(),
            pending,
        });
        if mark.is_some() && mark.as_ref() == seen {
            return Ok(mark);
        }
        let mut conn = self.conn.clone();
        let pending: Value = redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .query_async(&mut conn)
            .await?;
        let oldest_pending = match &pending {
            Value::Array(a) => a
                .get(1)
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok()),
            _ => None,
        };
        // Everything at or below last-delivered that is not pending was acked.
        let keep_from = match oldest_pending {
            Some(p) => p,
            None => next_id(&last_delivered),
        };
        let _: i64 = redis::cmd("XTRIM")
            .arg(stream)
            .arg("MINID")
            .arg(&keep_from)
            .query_async(&mut conn)
            .await?;
        Ok(mark)
    }
}

/// A consumer group as a trim of its stream found it (see
/// [`Store::trim_acknowledged_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrimMark {
    last_delivered: String,
    pending: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_group_is_found_by_name_in_either_protocol() {
        let resp2 = Value::Array(vec![
            Value::Array(vec![
                bulk("name"),
                bulk("other"),
                bulk("pending"),
                Value::Int(9),
            ]),
            Value::Array(vec![
                bulk("name"),
                bulk("loaders"),
                bulk("consumers"),
                Value::Int(3),
                bulk("pending"),
                Value::Int(2),
                bulk("last-delivered-id"),
                bulk("5-1"),
                bulk("lag"),
                Value::Nil,
            ]),
        ]);
        let want = GroupInfo {
            pending: Some(2),
            lag: None,
            last_delivered: Some("5-1".into()),
            consumers: Some(3),
        };
        assert_eq!(GroupInfo::from_reply(&resp2, "loaders"), Some(want.clone()));
        let resp3 = Value::Array(vec![Value::Map(vec![
            (bulk("name"), bulk("loaders")),
            (bulk("consumers"), Value::Int(3)),
            (bulk("pending"), Value::Int(2)),
            (bulk("last-delivered-id"), bulk("5-1")),
            (bulk("lag"), Value::Nil),
        ])]);
        assert_eq!(GroupInfo::from_reply(&resp3, "loaders"), Some(want));
        assert_eq!(GroupInfo::from_reply(&resp2, "operators"), None);
    }

    #[test]
    fn the_next_id_follows_in_the_same_millisecond() {
        assert_eq!(next_id("1700000000000-7"), "1700000000000-8");
        assert_eq!(next_id("garbage"), "garbage");
    }
}
