//! What the HTTP front door (`groupcast serve`) keeps of a batch, beside
//! its state: the batch's definition (its template and options, given once
//! by `POST /v1/batches`) and the digest of each seq it was given, in the
//! hash [`BatchKeys::front`](crate::keys::BatchKeys::front) on the batch's
//! shard slot.
//!
//! Why a record of its own: the scripts decide a chunk only once a loader
//! reads it, so a conflicting repeat of a seq still unread would be
//! refused later, in a dead letter, while its request was answered "taken".
//! The digests let the front door refuse it at once. They guard only what
//! comes through HTTP: a chunk appended straight to the stream is decided
//! by the scripts, as always. The hash expires `keep` after its last
//! change (the workers' retention).

use std::time::Duration;

use super::{Store, StoreResult};

/// The field that holds the definition.
const DEFINITION: &str = "def";

/// What recording a value under a field found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// It was not there: recorded now.
    New,
    /// The same value was there already.
    Same,
    /// Another value was there (returned): nothing changed.
    Other(String),
}

impl Store {
    /// Records `value` under `field` of batch `batch`'s front-door hash
    /// unless a value is there, and says what was there. One round trip.
    async fn record_once(
        &self,
        batch: &str,
        field: &str,
        value: &str,
        keep: Duration,
    ) -> StoreResult<Recorded> {
        let key = self.keys.batch(batch).front;
        // HSETNX then HGET: the value under a field never changes once set
        // (only `forget_seq` removes it), so the read needs no transaction.
        let (set, now, _): (bool, Option<String>, bool) = redis::pipe()
            .hset_nx(&key, field, value)
            .hget(&key, field)
            .pexpire(&key, keep.as_millis().try_into().unwrap_or(i64::MAX))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match now {
            _ if set => Recorded::New,
            Some(v) if v == value => Recorded::Same,
            Some(v) => Recorded::Other(v),
            // Removed between the two commands: taken as recorded by us.
            None => Recorded::New,
        })
    }

    /// Records batch `batch`'s definition (`definition`, JSON) unless it
    /// has one.
    pub(crate) async fn define_batch(
        &self,
        batch: &str,
        definition: &str,
        keep: Duration,
    ) -> StoreResult<Recorded> {
        self.record_once(batch, DEFINITION, definition, keep).await
    }

    /// Batch `batch`'s definition, if the front door recorded one.
    pub(crate) async fn batch_definition(&self, batch: &str) -> StoreResult<Option<String>> {
        let key = self.keys.batch(batch).front;
        Ok(redis::cmd("HGET")
            .arg(key)
            .arg(DEFINITION)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Records that seq `seq` of batch `batch` was given with content
    /// `digest`, unless the seq was given before, and says what it was.
    pub(crate) async fn claim_seq(
        &self,
        batch: &str,
        seq: u32,
        digest: &str,
        keep: Duration,
    ) -> StoreResult<Recorded> {
        self.record_once(batch, &format!("s:{seq}"), digest, keep)
            .await
    }

    /// Forgets seq `seq` of batch `batch` (its chunk could not be appended:
    /// the seq may come again with any content).
    pub(crate) async fn forget_seq(&self, batch: &str, seq: u32) -> StoreResult<()> {
        let key = self.keys.batch(batch).front;
        let _: u64 = redis::cmd("HDEL")
            .arg(key)
            .arg(format!("s:{seq}"))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}
