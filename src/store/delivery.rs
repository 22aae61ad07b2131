//! Delivery tracking's Redis calls: a page of a group's message list
//! recorded (`track_page.lua`), a generation's tracking ended and the
//! batch's delivery report decided (`delivered.lua`), and the results hash
//! read back for `groupcast results`.

use std::time::Duration;

use redis::Value;

use super::batch::{unexpected, BatchLog};
use super::scripts::SCRIPTS;
use super::StoreResult;

/// One page of a group's message list, as delivery tracking counted it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Messages delivered.
    pub delivered: u64,
    /// Messages failed at delivery.
    pub failed: u64,
    /// Messages counted unknown (only once the delivery window ended).
    pub unknown: u64,
    /// `failed` by code.
    pub failed_by_code: std::collections::BTreeMap<String, u64>,
    /// The provider's text for each failure code on the page (kept once
    /// per batch: the delivery hash's `reason:<code>`; not in `encode`).
    pub reasons: std::collections::BTreeMap<String, String>,
}

impl PageCounts {
    /// `<delivered>|<failed>|<unknown>|<code>=<n>,...` (`delivered.lua` sums them).
    fn encode(&self) -> String {
        let codes: Vec<String> = self
            .failed_by_code
            .iter()
            .map(|(c, n)| format!("{c}={n}"))
            .collect();
        format!(
            "{}|{}|{}|{}",
            self.delivered,
            self.failed,
            self.unknown,
            codes.join(",")
        )
    }
}

/// See [`BatchLog::tracked`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tracked {
    /// Generation → its provider group.
    pub groups: std::collections::BTreeMap<u32, String>,
    /// Failure code → the provider's text for it.
    pub reasons: std::collections::BTreeMap<String, String>,
}

/// What `delivered.lua` said about the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchDelivery {
    /// The delivery report was decided now.
    Decided,
    /// It had been decided before.
    Already,
    /// The batch has no report yet: asked again later.
    Unreported,
    /// Another generation's results are still coming (its tracking decides).
    Tracking,
}

impl BatchLog {
    /// Records one page of generation `gen`'s message list: its counts under
    /// `page` (the page's `startKey`, '' for the first), and `records`
    /// (number → [`crate::results::Record::encode`]). Both hashes live at
    /// least `keep`. Returns false when the generation's results were
    /// counted already (nothing written).
    pub async fn track_page(
        &self,
        gen: u32,
        group_id: &str,
        page: &str,
        counts: &PageCounts,
        keep: Duration,
        records: &[(String, String)],
    ) -> StoreResult<bool> {
        let k = &self.keys;
        let mut call = self.batch_call(&SCRIPTS.track_page);
        call.key("results", &k.results)
            .key("delivery", &k.delivery)
            .arg("gen", gen)
            .arg("group", group_id)
            .arg("page", page)
            .arg("counts", counts.encode())
            .arg("ttl", keep.as_secs())
            .arg("reasons", counts.reasons.len());
        for (code, text) in &counts.reasons {
            call.more_arg(code).more_arg(text);
        }
        for (number, record) in records {
            call.more_arg(number).more_arg(record);
        }
        let v: Value = call.invoke(&mut self.conn.clone()).await?;
        let r = self.reply(&SCRIPTS.track_page, v)?;
        match r.first().map(String::as_str) {
            Some("recorded") => Ok(true),
            Some("delivered") => Ok(false),
            _ => Err(unexpected("track_page", &r)),
        }
    }

    /// Ends tracking of generation `gen` (its pages summed into
    /// `generation_delivered`, once) and decides the batch's delivery
    /// report if it was the last (see `delivered.lua`); with no `gen`,
    /// only decides (a batch with no generation left to track). `keep`:
    /// how long the results live after the report (`--results-retention`).
    pub async fn delivered(
        &self,
        gen: Option<u32>,
        group_id: &str,
        window_ended: bool,
        keep: Duration,
    ) -> StoreResult<BatchDelivery> {
        let k = &self.keys;
        let v: Value = self
            .batch_call(&SCRIPTS.delivered)
            .key("work", &k.work)
            .key("reports", &k.reports)
            .key("results", &k.results)
            .key("delivery", &k.delivery)
            .arg("gen", gen.map(|g| g.to_string()).unwrap_or_default())
            .arg("group", group_id)
            .arg("window_ended", u8::from(window_ended))
            .arg("retention", keep.as_secs())
            .arg("deliver", u8::from(self.policy.deliver))
            .invoke(&mut self.conn.clone())
            .await?;
        let r = self.reply(&SCRIPTS.delivered, v)?;
        match r.as_slice() {
            [_, b, ..] if b == "decided" => Ok(BatchDelivery::Decided),
            [_, b, ..] if b == "already" => Ok(BatchDelivery::Already),
            [_, b, ..] if b == "unreported" => Ok(BatchDelivery::Unreported),
            [_, b, ..] if b == "tracking" => Ok(BatchDelivery::Tracking),
            _ => Err(unexpected("delivered", &r)),
        }
    }

    /// The event recorded under `event_key`, if any (one `HGET`, one `XRANGE`).
    pub async fn recorded(&self, event_key: &str) -> StoreResult<Option<crate::events::Recorded>> {
        let Some(id) = self.appended(event_key).await? else {
            return Ok(None);
        };
        let v: Value = redis::cmd("XRANGE")
            .arg(&self.keys.events)
            .arg(&id)
            .arg(&id)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(super::queue::parse_entries(&v)
            .first()
            .and_then(|e| crate::events::Recorded::from_fields(&e.id, &e.fields).ok()))
    }

    /// Whether delivery tracking has read any page of the batch's groups.
    pub(crate) async fn has_delivery_results(&self) -> StoreResult<bool> {
        let n: u64 = redis::cmd("EXISTS")
            .arg(&self.keys.delivery)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n > 0)
    }

    /// Whether anything of the batch is left to export: its state, or its
    /// results (which may outlive the state: `--results-retention`).
    pub(crate) async fn has_results_or_state(&self) -> StoreResult<bool> {
        let n: u64 = redis::cmd("EXISTS")
            .arg(&self.keys.state)
            .arg(&self.keys.results)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n > 0)
    }

    /// One step of a scan of the results hash: `(next cursor, [(number,
    /// record)])`; cursor 0 starts, and a next cursor of 0 ends.
    pub(crate) async fn scan_results(
        &self,
        cursor: u64,
    ) -> StoreResult<(u64, Vec<(String, String)>)> {
        let (next, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(&self.keys.results)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok((next, pairs))
    }

    /// What delivery tracking kept beside the records: each tracked
    /// generation's provider group, and the provider's text for each
    /// failure code it saw (kept as long as the results).
    pub(crate) async fn tracked(&self) -> StoreResult<Tracked> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&self.keys.delivery)
            .query_async(&mut self.conn.clone())
            .await?;
        let mut t = Tracked::default();
        for (k, v) in all {
            if let Some(gen) = k.strip_suffix("|group").and_then(|g| g.parse().ok()) {
                t.groups.insert(gen, v);
            } else if let Some(code) = k.strip_prefix("reason:") {
                t.reasons.insert(code.to_string(), v);
            }
        }
        Ok(t)
    }

    /// Stores outcome records (results hash field → [`crate::results::Record::encode`])
    /// that tracking does not write: recipients never sent, duplicate
    /// copies. Overwrites, so a repeat changes nothing. The hash lives at
    /// least `keep` unless it has a lifetime already (the delivery report
    /// set it, or tracking did).
    pub(crate) async fn record_outcomes(
        &self,
        records: &[(String, String)],
        keep: Duration,
    ) -> StoreResult<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.cmd("HSET").arg(&self.keys.results);
        for (field, record) in records {
            pipe.arg(field).arg(record);
        }
        pipe.ignore();
        if keep > Duration::ZERO {
            pipe.cmd("EXPIRE")
                .arg(&self.keys.results)
                .arg(keep.as_secs().max(1))
                .arg("NX")
                .ignore();
        }
        let () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// The stored outcome records of `numbers` (None: no record, i.e.
    /// delivered, or not sent through a tracked group).
    pub(crate) async fn results_of(&self, numbers: &[&str]) -> StoreResult<Vec<Option<String>>> {
        if numbers.is_empty() {
            return Ok(Vec::new());
        }
        let v: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&self.keys.results)
            .arg(numbers)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_counts_are_written_as_delivered_lua_reads_them() {
        let mut c = PageCounts {
            delivered: 480,
            failed: 19,
            unknown: 1,
            ..Default::default()
        };
        assert_eq!(c.encode(), "480|19|1|");
        c.failed_by_code.insert("3104".into(), 12);
        c.failed_by_code.insert("3043".into(), 7);
        assert_eq!(c.encode(), "480|19|1|3043=7,3104=12");
    }
}
