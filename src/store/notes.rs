//! Notes on a batch's state that no event records (`note.lua`): chunks that
//! came after the batch ended, and the provider refusing the credentials.
//! `status` and the board show them. And a dead letter's deletion
//! (`dlq purge`).

use super::scripts::SCRIPTS;
use super::{Store, StoreResult};
use crate::projection::field;

impl Store {
    /// Counts one more chunk that arrived after batch `batch` had ended
    /// (reported, cancelled or closed) and answers the batch's count so
    /// far; 0 when the batch has not ended or has no state any more (past
    /// its retention): then nothing is counted.
    pub(crate) async fn count_chunk_after_end(&self, batch: &str) -> StoreResult<u64> {
        let state = self.keys.batch(batch).state;
        SCRIPTS
            .note
            .call()
            .key("state", &state)
            .arg("mode", "ended")
            .arg("field", field::AFTER_END)
            .invoke(&mut self.conn.clone())
            .await
    }

    /// Notes on batch `batch` that the provider refused the credentials of
    /// one of its calls (`why`: the provider's answer). Answers whether it
    /// was noted (false: the batch has no state).
    pub(crate) async fn note_credentials_refused(
        &self,
        batch: &str,
        why: &str,
    ) -> StoreResult<bool> {
        let state = self.keys.batch(batch).state;
        let noted: u64 = SCRIPTS
            .note
            .call()
            .key("state", &state)
            .arg("mode", "set")
            .arg("field", field::CREDS_REFUSED)
            .arg("value", why)
            .invoke(&mut self.conn.clone())
            .await?;
        Ok(noted == 1)
    }

    /// Deletes dead letter `id` of shard `shard` for good. Answers whether
    /// it was there.
    pub(crate) async fn purge_letter(&self, shard: u32, id: &str) -> StoreResult<bool> {
        let deleted: u64 = redis::cmd("XDEL")
            .arg(self.keys.dead_letters(shard))
            .arg(id)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(deleted == 1)
    }
}
