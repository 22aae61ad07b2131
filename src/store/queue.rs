//! The work plumbing on streams: consumer groups, acknowledgements, dead
//! letters, delayed retries and reclaiming entries of crashed consumers.

use redis::Value;

use super::durability::witness::LastAppended;
use super::scripts::SCRIPTS;
use super::{BlockingConn, Store, StoreResult};
use crate::keys::Priority;

/// One stream entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its id.
    pub id: String,
    /// Its field/value pairs.
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    /// Whether this reports stream entry is a delivery report
    /// (`t` = `batch_delivered`, see `delivered.lua`) rather than a
    /// batch's report (no `t`).
    pub fn is_delivery_report(&self) -> bool {
        self.get("t") == Some(b"batch_delivered".as_slice())
    }

    /// A field's value.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_slice())
    }
    /// A field's value as text.
    pub fn text(&self, name: &str) -> Option<String> {
        self.get(name)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Okay => Some(b"OK".to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// [`bytes`], moving a bulk string's buffer out instead of copying it (a
/// chunk payload is read once per entry: no second copy of it).
fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        other => bytes(&other),
    }
}

fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        _ => &[],
    }
}

/// Parses an `XRANGE`-shaped reply: `[[id, [field, value, ...]], ...]`.
/// Entries already deleted come back as `[id, nil]` from some commands; they
/// are returned with no fields.
pub fn parse_entries(v: &Value) -> Vec<Entry> {
    items(v)
        .iter()
        .filter_map(|e| {
            let parts = items(e);
            let id = text(parts.first()?)?;
            let fields = parts
                .get(1)
                .map(items)
                .unwrap_or(&[])
                .chunks(2)
                .filter_map(|kv| Some((text(kv.first()?)?, bytes(kv.get(1)?)?)))
                .collect();
            Some(Entry { id, fields })
        })
        .collect()
}

/// [`parse_entries`] of an owned reply: the values are moved out, not copied.
fn into_entries(v: Value) -> Vec<Entry> {
    let Value::Array(entries) = v else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|e| {
            let Value::Array(parts) = e else {
                return None;
            };
            let mut parts = parts.into_iter();
            let id = text(&parts.next()?)?;
            let fields = match parts.next() {
                Some(Value::Array(kv)) => {
                    let mut fields = Vec::with_capacity(kv.len() / 2);
                    let mut kv = kv.into_iter();
                    while let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                        if let (Some(k), Some(v)) = (text(&k), into_bytes(v)) {
                            fields.push((k, v));
                        }
                    }
                    fields
                }
                _ => Vec::new(),
            };
            Some(Entry { id, fields })
        })
        .collect()
}

/// A work entry waiting in the delayed set, encoded so that `promote.lua`
/// can put its fields back on its lane's work stream:
/// `<op>|<length of d>|<d><c>` for the normal lane, `<op>@<lane>|…` for the
/// others.
/// (Redis' Lua `cmsgpack` cannot read MessagePack binary strings, so the
/// member is framed by hand; Lua string functions are binary-safe.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelayedEntry {
    /// The `op` field.
    pub op: String,
    /// The `d` field.
    pub d: Vec<u8>,
    /// The `c` field (a chunk payload), if any.
    pub c: Option<Vec<u8>>,
    /// The lane whose work stream it goes back to.
    pub lane: Priority,
}

impl DelayedEntry {
    /// Encodes it as a sorted-set member.
    pub fn encode(&self) -> Vec<u8> {
        let c = self.c.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(self.op.len() + 12 + self.d.len() + c.len());
        out.extend_from_slice(self.op.as_bytes());
        if self.lane != Priority::Normal {
            out.push(b'@');
            out.extend_from_slice(self.lane.name().as_bytes());
        }
        out.push(b'|');
        out.extend_from_slice(self.d.len().to_string().as_bytes());
        out.push(b'|');
        out.extend_from_slice(&self.d);
        out.extend_from_slice(c);
        out
    }
}

/// An entry taken over from another consumer, with its delivery count.
#[derive(Debug, Clone)]
pub struct Reclaimed {
    /// The entry.
    pub entry: Entry,
    /// How many times it was delivered (this one included).
    pub deliveries: u64,
}

impl Store {
    /// Creates a consumer group reading `stream` from its start (creating the
    /// stream too). An existing group is fine.
    pub async fn ensure_group(&self, stream: &str, group: &str) -> StoreResult<()> {
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.conn.clone())
            .await;
        match r {
            Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
            other => Ok(other?),
        }
    }

    /// Acknowledges several entries of `stream` in one `XACK`. Returns how
    /// many were still pending.
    pub async fn ack_all(&self, stream: &str, group: &str, ids: &[String]) -> StoreResult<u64> {
        Ok(redis::cmd("XACK")
            .arg(stream)
            .arg(group)
            .arg(ids)
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Acknowledges finished entries of `stream` in one step, each only while
    /// the last event its handling appended ([`LastAppended`], None: no
    /// condition) is still recorded under the entry id Redis answered
    /// (`ack_recorded.lua`: a restart from disk may have taken it back since,
    /// and the entry must then be handled again). Returns the ids left
    /// pending.
    pub async fn ack_recorded(
        &self,
        stream: &str,
        group: &str,
        acks: &[(String, Option<LastAppended>)],
    ) -> StoreResult<Vec<String>> {
        let mut call = SCRIPTS.ack_recorded.call();
        call.key("stream", stream).arg("group", group);
        let mut states: Vec<&str> = Vec::new();
        for (id, after) in acks {
            call.more_arg(id);
            match after {
                None => {
                    call.more_arg(0).more_arg("").more_arg("");
                }
                Some(a) => {
                    let k = match states.iter().position(|s| *s == a.state) {
                        Some(k) => k,
                        None => {
                            states.push(&a.state);
                            call.more_key(&a.state);
                            states.len() - 1
                        }
                    };
                    // KEYS[1] is the stream: the first state hash is KEYS[2].
                    call.more_arg(k + 2).more_arg(&a.key).more_arg(&a.id);
                }
            }
        }
        call.invoke(&mut self.conn.clone()).await
    }

    /// Appends a work item to a work stream: fields `op`, `d` (the encoded
    /// item) and, for a load, `c` (the chunk payload).
    pub async fn enqueue(
        &self,
        work: &str,
        op: &str,
        data: &[u8],
        chunk: Option<&[u8]>,
    ) -> StoreResult<String> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(work).arg("*").arg("op").arg(op).arg("d").arg(data);
        if let Some(c) = chunk {
            cmd.arg("c").arg(c);
        }
        Ok(cmd.query_async(&mut self.conn.clone()).await?)
    }

    /// Appends an entry with these fields to `stream`. Returns its id.
    pub async fn append_entry(
        &self,
        stream: &str,
        fields: &[(String, Vec<u8>)],
    ) -> StoreResult<String> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream).arg("*");
        for (f, v) in fields {
            cmd.arg(f).arg(v.as_slice());
        }
        Ok(cmd.query_async(&mut self.conn.clone()).await?)
    }

    /// Appends several entries to `stream` in one pipelined round trip.
    /// Returns their ids, in order.
    pub(crate) async fn append_entries<F>(
        &self,
        stream: &str,
        entries: &[F],
    ) -> StoreResult<Vec<String>>
    where
        F: AsRef<[(&'static str, Vec<u8>)]>,
    {
        let mut pipe = redis::pipe();
        for fields in entries {
            pipe.cmd("XADD").arg(stream).arg("*");
            for (f, v) in fields.as_ref() {
                pipe.arg(*f).arg(v.as_slice());
            }
        }
        Ok(pipe.query_async(&mut self.conn.clone()).await?)
    }

    /// Puts a dead letter's entry back on `source` (with `fields`) and
    /// deletes it from `dlq`, in one transaction: never both, never neither.
    pub async fn redrive(
        &self,
        dlq: &str,
        id: &str,
        source: &str,
        fields: &[(String, Vec<u8>)],
    ) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("XADD").arg(source).arg("*");
        for (k, v) in fields {
            pipe.arg(k).arg(v.as_slice());
        }
        pipe.cmd("XDEL").arg(dlq).arg(id);
        pipe.query_async::<()>(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// Writes a dead letter and acknowledges the source entry, in one step,
    /// and answers its id. With `after`, the last event the entry's
    /// handling appended, only while that event is still recorded (see
    /// [`Store::ack_recorded`]): None, nothing written, the entry pending.
    pub async fn dead_letter(
        &self,
        dlq: &str,
        source: &str,
        group: &str,
        id: &str,
        fields: &[(String, Vec<u8>)],
        after: Option<&LastAppended>,
    ) -> StoreResult<Option<String>> {
        let mut call = SCRIPTS.dead_letter.call();
        call.key("dead_letters", dlq)
            .key("source", source)
            .arg("group", group)
            .arg("entry", id);
        if let Some(a) = after {
            call.key("state", &a.state)
                .arg("event_key", &a.key)
                .arg("event_id", &a.id);
        }
        for (f, v) in fields {
            call.more_arg(f).more_arg(v.as_slice());
        }
        call.invoke(&mut self.conn.clone()).await
    }

    /// Puts a work entry in the delayed set and acknowledges the delivery that
    /// failed, in one step. With `alive` (a batch's state key, in the same
    /// slot), the same step stamps the batch's `alive` field with the
    /// server's clock (or, for a scheduled send, with the due time): a
    /// heartbeat without an event, for waits that show the batch is
    /// progressing (see `worker::watchdog`). With `load`, the step happens
    /// only while what that load relies on still holds ([`LoadHolds`]);
    /// otherwise nothing is written and the delivery stays pending.
    #[allow(clippy::too_many_arguments)]
    pub async fn retry_later(
        &self,
        delayed: &str,
        source: &str,
        group: &str,
        id: &str,
        delay_ms: u64,
        entry: &DelayedEntry,
        alive: Option<Alive<'_>>,
        load: Option<LoadHolds<'_>>,
    ) -> StoreResult<Rescheduled> {
        let mut call = SCRIPTS.retry_later.call();
        call.key("delayed", delayed)
            .key("source", source)
            .arg("group", group)
            .arg("entry", id)
            .arg("delay", delay_ms)
            .arg("delayed_entry", entry.encode());
        // Both name the same batch's state hash when both are given.
        if let Some(state) = alive.map(|a| a.state).or(load.map(|l| l.state)) {
            call.key("state", state).arg(
                "alive",
                match alive {
                    Some(a) if a.until_due => "due",
                    Some(_) => "now",
                    None => "-",
                },
            );
        }
        if let Some(l) = load {
            call.arg("load_seq", l.seq)
                .arg("load_gen", l.gen)
                .arg("load_group", l.group);
        }
        let due: i64 = call.invoke(&mut self.conn.clone()).await?;
        Ok(if due < 0 {
            Rescheduled::LoadGone
        } else {
            Rescheduled::Scheduled
        })
    }

    /// Renews this consumer's lease on a pending entry it is still handling:
    /// resets the entry's idle time (without counting a delivery), so that it
    /// is not reclaimed as a crashed consumer's. An entry no longer pending,
    /// or no longer this consumer's, is left alone.
    pub async fn renew_lease(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        id: &str,
    ) -> StoreResult<()> {
        SCRIPTS
            .renew_lease
            .call()
            .key("stream", stream)
            .arg("group", group)
            .arg("consumer", consumer)
            .arg("entry", id)
            .invoke::<i64>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Moves up to `limit` due entries of a shard's delayed set back to
    /// their lanes' work streams. Returns how many moved.
    pub async fn promote(&self, shard: u32, limit: usize) -> StoreResult<usize> {
        SCRIPTS
            .promote
            .call()
            .key("delayed", self.keys.delayed(shard))
            .key("normal", self.keys.work_in(shard, Priority::Normal))
            .key("urgent", self.keys.work_in(shard, Priority::Urgent))
            .key("bulk", self.keys.work_in(shard, Priority::Bulk))
            .arg("most", limit)
            .invoke(&mut self.conn.clone())
            .await
    }

    /// Every entry of a stream, read in pages of 1,000.
    pub async fn entries(&self, stream: &str) -> StoreResult<Vec<Entry>> {
        let mut out = Vec::new();
        let mut start = "-".to_string();
        loop {
            let v: Value = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut self.conn.clone())
                .await?;
            let page = parse_entries(&v);
            let n = page.len();
            if let Some(last) = page.last() {
                start = format!("({}", last.id);
            }
            out.extend(page);
            if n < 1000 {
                return Ok(out);
            }
        }
    }

    /// When the earliest delayed entry of a shard is due (ms since the epoch,
    /// by Redis' clock), if any.
    pub async fn next_due(&self, shard: u32) -> StoreResult<Option<u64>> {
        let first: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(self.keys.delayed(shard))
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(first.first().map(|(_, score)| *score as u64))
    }

    /// Takes over entries idle longer than `min_idle_ms` (a crashed or stuck
    /// consumer's), with their delivery counts. Entries trimmed away meanwhile
    /// come back from `XAUTOCLAIM` as deleted ids: Redis has already dropped
    /// them from the pending list, so they are only counted, never looped on.
    pub async fn reclaim(
        &self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle_ms: u64,
        count: usize,
    ) -> StoreResult<(Vec<Reclaimed>, usize)> {
        let v: Value = redis::cmd("XAUTOCLAIM")
            .arg(stream)
            .arg(group)
            .arg(consumer)
            .arg(min_idle_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await?;
        let parts = items(&v);
        let entries = parts.get(1).map(parse_entries).unwrap_or_default();
        let deleted = parts.get(2).map(|d| items(d).len()).unwrap_or(0);
        if entries.is_empty() {
            return Ok((Vec::new(), deleted));
        }
        // Delivery counts of what we now own (XAUTOCLAIM does not return them).
        let first = &entries[0].id;
        let last = &entries[entries.len() - 1].id;
        let pending: Value = redis::cmd("XPENDING")
            .arg(stream)
            .arg(group)
            .arg(first)
            .arg(last)
            .arg(entries.len() * 2 + 10)
            .arg(consumer)
            .query_async(&mut self.conn.clone())
            .await?;
        let counts: std::collections::HashMap<String, u64> = items(&pending)
            .iter()
            .filter_map(|p| {
                let p = items(p);
                let id = text(p.first()?)?;
                let n = match p.get(3)? {
                    Value::Int(n) => *n as u64,
                    other => text(other)?.parse().ok()?,
                };
                Some((id, n))
            })
            .collect();
        let out = entries
            .into_iter()
            .map(|entry| Reclaimed {
                deliveries: counts.get(&entry.id).copied().unwrap_or(1),
                entry,
            })
            .collect();
        Ok((out, deleted))
    }
}

/// Reads up to `count` entries of `stream` after id `after`, waiting up to
/// `block_ms` for one (`XREAD`, no consumer group): for watching a stream
/// such as the reports without polling.
pub async fn read_after(
    conn: &mut BlockingConn,
    stream: &str,
    after: &str,
    count: usize,
    block_ms: u64,
) -> StoreResult<Vec<Entry>> {
    let v: Value = redis::cmd("XREAD")
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block_ms)
        .arg("STREAMS")
        .arg(stream)
        .arg(after)
        .query_async(conn)
        .await?;
    let mut out = Vec::new();
    match &v {
        Value::Array(per_stream) => {
            for s in per_stream {
                if let Some(entries) = items(s).get(1) {
                    out.extend(parse_entries(entries));
                }
            }
        }
        Value::Map(per_stream) => {
            for (_, entries) in per_stream {
                out.extend(parse_entries(entries));
            }
        }
        _ => {}
    }
    Ok(out)
}

/// Reads new entries for `consumer` from several streams (one blocking call).
/// Returns (stream, entry) pairs.
pub async fn read_group(
    conn: &mut BlockingConn,
    group: &str,
    consumer: &str,
    streams: &[String],
    count: usize,
    block_ms: u64,
) -> StoreResult<Vec<(String, Entry)>> {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block_ms)
        .arg("STREAMS")
        .arg(streams);
    for _ in streams {
        cmd.arg(">");
    }
    let v: Value = cmd.query_async(conn).await?;
    let mut out = Vec::new();
    // The reply is owned: its entries' values (chunk payloads) are moved
    // out rather than copied.
    let per_stream: Vec<(Value, Value)> = match v {
        Value::Array(per_stream) => per_stream
            .into_iter()
            .filter_map(|s| {
                let Value::Array(parts) = s else { return None };
                let mut parts = parts.into_iter();
                Some((parts.next()?, parts.next()?))
            })
            .collect(),
        Value::Map(per_stream) => per_stream,
        _ => Vec::new(),
    };
    for (name, entries) in per_stream {
        let Some(name) = text(&name) else { continue };
        for e in into_entries(entries) {
            out.push((name.clone(), e));
        }
    }
    Ok(out)
}

/// What [`Store::retry_later`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rescheduled {
    /// The entry is in the delayed set, the delivery acknowledged.
    Scheduled,
    /// The load it would retry no longer holds ([`LoadHolds`]): nothing was
    /// written and the delivery stays pending, to be handled again.
    LoadGone,
}

/// What the retry of a load relies on: chunk `seq` assigned to generation
/// `gen`, whose group is `group`, in the batch state hash `state` (same
/// slot as the streams). Under `everysec` a restart from disk can lose
/// either between the load's read and its retry; acknowledging the delivery
/// then would leave a chunk its batch no longer counts, with nothing to
/// bring it back.
#[derive(Debug, Clone, Copy)]
pub struct LoadHolds<'a> {
    /// The batch's state key.
    pub state: &'a str,
    /// The chunk.
    pub seq: u32,
    /// Its generation.
    pub gen: u32,
    /// That generation's group.
    pub group: &'a str,
}

/// A batch shown alive by a wait (see [`Store::retry_later`]).
#[derive(Debug, Clone, Copy)]
pub struct Alive<'a> {
    /// The batch's state key.
    pub state: &'a str,
    /// Stamp the wait's due time rather than now: the batch is not quiet
    /// until then (a send held until `send_at` or the end of quiet hours).
    pub until_due: bool,
}

impl<'a> Alive<'a> {
    /// Alive now.
    pub fn now(state: &'a str) -> Self {
        Alive {
            state,
            until_due: false,
        }
    }
}
