//! The mock's state: groups and their messages, kept compactly, plus the
//! JSON views of it (`/_mock/ledger`, `/_mock/ledger/summary`).
//!
//! Messages are stored as one `u64` (the number, packed) and one `u8` (the
//! status code) each, so a million-recipient group costs ~9 MB and an add of
//! 10,000 messages does no per-message allocation under the lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::config::Faults;
use super::delivery::{self, Deliveries, DeliveryPlan, Fate};
use groupcast::phone;
use groupcast::provider::model::{self, Group, GroupCount, GroupStatus};

/// A `u64` hasher for keys that are already well-distributed after a
/// multiply-xorshift mix: SipHash would cost more than the rest of an add.
#[derive(Default)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        // murmur3 finaliser
        let mut x = x ^ self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^= x >> 33;
        self.0 = x;
    }
}

type FastSet = HashSet<u64, BuildHasherDefault<MixHasher>>;
type FastMap<V> = HashMap<u64, V, BuildHasherDefault<MixHasher>>;

/// Tag bit of a key that indexes a group's table of invalid numbers.
const ODD_TAG: u64 = 1 << 63;

/// Packs a valid number: length in bits 40.., value below (leading zeros are
/// kept by the length). `None` for a number [`phone::is_valid_number`]
/// refuses.
pub(crate) fn pack(to: &str) -> Option<u64> {
    if !phone::is_valid_number(to) {
        return None;
    }
    let v = to
        .bytes()
        .fold(0u64, |acc, b| acc * 10 + u64::from(b - b'0'));
    Some(((to.len() as u64) << 40) | v)
}

fn unpack(key: u64, odd: &[Box<str>]) -> String {
    if key & ODD_TAG != 0 {
        let i = (key & !ODD_TAG) as usize;
        return odd.get(i).map(|s| s.to_string()).unwrap_or_default();
    }
    let len = (key >> 40) as usize;
    let v = key & ((1 << 40) - 1);
    format!("{v:0len$}")
}

/// Per-message status, stored as a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    Registered = 0,
    Duplicate = 1,
    InvalidNumber = 2,
    Rejected = 3,
}

/// Code bytes from this one on index the group's table of injected
/// registration failure codes.
const TABLE_BASE: u8 = 4;

/// The status code a stored code byte stands for.
pub(crate) fn code_str(b: u8, table: &[Box<str>]) -> &str {
    if b < TABLE_BASE {
        Code::from_u8(b).status_code()
    } else {
        table
            .get(usize::from(b - TABLE_BASE))
            .map_or(Code::Rejected.status_code(), |c| c)
    }
}

/// The `statusMessage` of an add result for a stored code byte.
pub(crate) fn code_message(b: u8, table: &[Box<str>]) -> &'static str {
    if b < TABLE_BASE {
        Code::from_u8(b).status_message()
    } else {
        delivery::reason(code_str(b, table))
    }
}

/// A message's status as the list shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status<'a> {
    /// `"2000"`: registered, the group not sent.
    Registered,
    /// `"3000"`: sent, no final result (yet, or ever).
    Pending,
    /// `"4000"`, this many ms after the send.
    Delivered(u32),
    /// Failed with this code, this many ms after the send.
    Failed(&'a str, u32),
    /// A registration failure (`"1xxx"`): never sent.
    Refused(&'a str),
}

impl<'a> Status<'a> {
    pub(crate) fn code(self) -> &'a str {
        match self {
            Status::Registered => Code::Registered.status_code(),
            Status::Pending => "3000",
            Status::Delivered(_) => "4000",
            Status::Failed(c, _) | Status::Refused(c) => c,
        }
    }

    /// The final code: delivered, failed, or refused at registration
    /// (`None` for a duplicate, which is not a message of its own).
    pub(crate) fn final_code(self) -> Option<&'a str> {
        match self {
            Status::Registered | Status::Pending => None,
            Status::Refused(c) if c == Code::Duplicate.status_code() => None,
            s => Some(s.code()),
        }
    }

    /// When it became final, in ms after the send (delivery results only).
    pub(crate) fn final_offset_ms(self) -> Option<u32> {
        match self {
            Status::Delivered(o) | Status::Failed(_, o) => Some(o),
            _ => None,
        }
    }
}

/// The status of one stored message: `plan` is set once the group is sent,
/// `elapsed_ms` (since the send) once it is `COMPLETE`: no result comes
/// before that.
fn message_status<'a>(
    key: u64,
    byte: u8,
    table: &'a [Box<str>],
    plan: Option<&'a DeliveryPlan>,
    elapsed_ms: Option<u64>,
) -> Status<'a> {
    if byte != Code::Registered as u8 {
        return Status::Refused(code_str(byte, table));
    }
    let Some(plan) = plan else {
        return Status::Registered;
    };
    let Some(e) = elapsed_ms else {
        return Status::Pending;
    };
    match plan.fate(key) {
        Fate::Delivered(o) if u64::from(o) <= e => Status::Delivered(o),
        Fate::Failed(i, o) if u64::from(o) <= e => Status::Failed(&plan.failure_codes[i], o),
        _ => Status::Pending,
    }
}

/// The ids of a group's messages without their index (the add answer and
/// the list append it as 9 digits: `M4V{nonce}{group_seq:06}{index:09}`).
fn id_prefix(nonce: &str, group_seq: u64) -> String {
    format!("M4V{nonce}{group_seq:06}")
}

impl Code {
    fn from_u8(b: u8) -> Code {
        match b {
            0 => Code::Registered,
            1 => Code::Duplicate,
            2 => Code::InvalidNumber,
            _ => Code::Rejected,
        }
    }
    pub(super) fn status_code(self) -> &'static str {
        match self {
            Code::Registered => model::CODE_REGISTERED,
            Code::Duplicate => model::CODE_DUPLICATE,
            Code::InvalidNumber => model::CODE_INVALID_NUMBER,
            Code::Rejected => model::CODE_REJECTED,
        }
    }
    pub(super) fn status_message(self) -> &'static str {
        match self {
            Code::Registered => "Registered",
            Code::Duplicate => "Duplicate recipient in this group",
            Code::InvalidNumber => "Invalid recipient number",
            Code::Rejected => "Rejected",
        }
    }
}

/// A provider error as the mock answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MockError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl MockError {
    pub(super) fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        MockError {
            status,
            code,
            message: message.into(),
        }
    }
    fn not_found(id: &str) -> Self {
        MockError::new(404, "ResourceNotFound", format!("group {id} not found"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Sending,
    Complete,
    Deleted,
}

struct GroupRec {
    seq: u64,
    group_id: String,
    custom_fields: BTreeMap<String, String>,
    allow_duplicates: bool,
    state: State,
    date_created: String,
    sent_at: Option<(Instant, SystemTime)>,
    date_sent: Option<String>,
    date_completed: Option<String>,
    tos: Vec<u64>,
    codes: Vec<u8>,
    odd: Vec<Box<str>>,
    registered: FastSet,
    registered_success: u64,
    send_calls: Vec<(u16, Option<&'static str>)>,
    /// Injected registration failure codes, indexed by code byte − 4.
    code_table: Vec<Box<str>>,
    /// Decided at the send.
    deliveries: Option<Deliveries>,
    /// Ms from the send to the last refresh, once `COMPLETE`.
    elapsed_ms: Option<u64>,
}

impl GroupRec {
    /// SENDING turns COMPLETE `complete_after` after the send, seen lazily.
    fn refresh(&mut self, now: Instant, complete_after: Duration) {
        if self.state == State::Sending {
            if let Some((at, sys)) = self.sent_at {
                if now.duration_since(at) >= complete_after {
                    self.state = State::Complete;
                    self.date_completed = Some(fmt_date(sys + complete_after));
                }
            }
        }
        if self.state == State::Complete {
            if let Some((at, _)) = self.sent_at {
                self.elapsed_ms = Some(now.saturating_duration_since(at).as_millis() as u64);
            }
        }
    }

    /// The code byte of an injected registration failure code.
    fn intern(&mut self, code: &str) -> u8 {
        if let Some(i) = self.code_table.iter().position(|c| &**c == code) {
            return TABLE_BASE + i as u8;
        }
        if self.code_table.len() >= usize::from(u8::MAX - TABLE_BASE) {
            return Code::Rejected as u8;
        }
        self.code_table.push(code.into());
        TABLE_BASE + (self.code_table.len() - 1) as u8
    }

    fn plan(&self) -> Option<&DeliveryPlan> {
        self.deliveries.as_ref().map(|d| &*d.plan)
    }

    /// Final results so far by code: registration failures (duplicates
    /// aside), then deliveries and delivery failures.
    fn final_codes(&self) -> BTreeMap<String, u64> {
        let mut by_byte = [0u64; 256];
        for &c in &self.codes {
            by_byte[usize::from(c)] += 1;
        }
        let mut out = BTreeMap::new();
        for (b, &n) in by_byte.iter().enumerate().skip(1) {
            if n > 0 && b != Code::Duplicate as usize {
                *out.entry(code_str(b as u8, &self.code_table).to_owned())
                    .or_default() += n;
            }
        }
        if let (Some(d), Some(e)) = (&self.deliveries, self.elapsed_ms) {
            let ok = d.delivered_by(e);
            if ok > 0 {
                *out.entry("4000".to_owned()).or_default() += ok;
            }
            for (code, n) in d.failed_by(e) {
                if n > 0 {
                    *out.entry(code.to_owned()).or_default() += n;
                }
            }
        }
        out
    }

    fn status(&self) -> GroupStatus {
        match self.state {
            State::Pending => GroupStatus::Pending,
            State::Sending => GroupStatus::Sending,
            State::Complete => GroupStatus::Complete,
            State::Deleted => GroupStatus::Deleted,
        }
    }

    fn count(&self) -> GroupCount {
        let total = self.tos.len() as u64;
        let ok = self.registered_success;
        let mut c = GroupCount {
            total,
            registered_success: ok,
            registered_failed: total - ok,
            ..GroupCount::default()
        };
        match self.state {
            State::Pending | State::Deleted => {}
            State::Sending => {
                c.sent_total = ok;
                c.sent_pending = ok;
            }
            State::Complete => {
                c.sent_total = ok;
                match (&self.deliveries, self.elapsed_ms) {
                    (Some(d), Some(e)) => {
                        c.sent_success = d.delivered_by(e);
                        c.sent_failed = d.failed_by(e).map(|(_, n)| n).sum();
                    }
                    _ => c.sent_success = ok,
                }
                c.sent_pending = ok - c.sent_success - c.sent_failed;
            }
        }
        c
    }

    fn to_group(&self) -> Group {
        Group {
            group_id: self.group_id.clone(),
            status: self.status(),
            custom_fields: self.custom_fields.clone(),
            count: self.count(),
            date_created: self.date_created.clone(),
            date_sent: self.date_sent.clone(),
            date_completed: self.date_completed.clone(),
        }
    }
}

pub(crate) fn fmt_date(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Result of one add, enough to write the answer outside the lock.
pub(crate) struct AddOutcome {
    pub group_seq: u64,
    /// Index in the group of the first message of this request.
    pub base_index: u64,
    /// Code bytes (see [`code_str`]).
    pub codes: Vec<u8>,
    /// The group's table of injected codes, for [`code_str`].
    pub table: Vec<Box<str>>,
}

/// One page of `GET /messages/v4/list`, to be written outside the lock.
pub(crate) struct ListPage {
    pub group_id: String,
    /// The group's (the mock keeps no time per message).
    pub date_created: String,
    /// The group's send, for `dateProcessed` of sent messages.
    pub date_sent: Option<String>,
    pub items: Vec<ListItem>,
    /// The id of the first message of the next page.
    pub next_key: Option<String>,
}

/// One message of a [`ListPage`].
pub(crate) struct ListItem {
    pub message_id: String,
    pub to: String,
    pub status_code: String,
    pub reason: &'static str,
    /// Sent (`dateProcessed` is the send's date).
    pub processed: bool,
    /// When its delivery result came (`dateReported`).
    pub reported: Option<SystemTime>,
}

/// Everything the mock remembers.
pub(crate) struct Ledger {
    nonce: String,
    next_seq: u64,
    groups: Vec<GroupRec>,
    by_id: HashMap<String, usize>,
}

impl Ledger {
    pub(super) fn new(nonce: String) -> Self {
        Ledger {
            nonce,
            next_seq: 1,
            groups: Vec::new(),
            by_id: HashMap::new(),
        }
    }

    /// Forgets every group; ids keep increasing so that an id from before
    /// the reset is never reused for a different group.
    pub(super) fn clear(&mut self) {
        self.groups.clear();
        self.by_id.clear();
    }

    fn find(&mut self, id: &str) -> Result<&mut GroupRec, MockError> {
        match self.by_id.get(id) {
            Some(&i) => Ok(&mut self.groups[i]),
            None => Err(MockError::not_found(id)),
        }
    }

    pub(super) fn create(
        &mut self,
        custom_fields: BTreeMap<String, String>,
        allow_duplicates: bool,
    ) -> Group {
        let seq = self.next_seq;
        self.next_seq += 1;
        let now = SystemTime::now();
        let stamp: String = humantime::format_rfc3339_seconds(now)
            .to_string()
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let group_id = format!("G4V{stamp}{}{seq:06}", self.nonce);
        let rec = GroupRec {
            seq,
            group_id: group_id.clone(),
            custom_fields,
            allow_duplicates,
            state: State::Pending,
            date_created: fmt_date(now),
            sent_at: None,
            date_sent: None,
            date_completed: None,
            tos: Vec::new(),
            codes: Vec::new(),
            odd: Vec::new(),
            registered: FastSet::default(),
            registered_success: 0,
            send_calls: Vec::new(),
            code_table: Vec::new(),
            deliveries: None,
            elapsed_ms: None,
        };
        let g = rec.to_group();
        self.by_id.insert(group_id, self.groups.len());
        self.groups.push(rec);
        g
    }

    /// Registers messages given as `(packed key or None, to)`: `None` is an
    /// invalid number (`"1062"`). Dedupe is against this group's `"2000"`
    /// registrations only: a `to` whose earlier attempt failed (say over the
    /// cap) gets the same answer again on a retry instead of a `"1026"` that
    /// would pass for a registration. A message that would be registered
    /// may instead get an injected failure ([`Faults::registration_failure_rate`]).
    pub(super) fn add<'a>(
        &mut self,
        id: &str,
        msgs: impl ExactSizeIterator<Item = (Option<u64>, &'a str)>,
        cap: u64,
        complete_after: Duration,
        faults: &Faults,
    ) -> Result<AddOutcome, MockError> {
        let g = self.find(id)?;
        g.refresh(Instant::now(), complete_after);
        if g.state != State::Pending {
            return Err(MockError::new(
                400,
                "InvalidGroupStatus",
                format!("group {id} is {:?}, not PENDING", g.status()),
            ));
        }
        let n = msgs.len();
        let base_index = g.tos.len() as u64;
        g.tos.reserve(n);
        g.codes.reserve(n);
        let mut codes = Vec::with_capacity(n);
        for (key, to) in msgs {
            let (stored, code) = match key {
                None => {
                    g.odd.push(to.into());
                    (ODD_TAG | (g.odd.len() - 1) as u64, Code::InvalidNumber)
                }
                Some(k) if !g.allow_duplicates && g.registered.contains(&k) => (k, Code::Duplicate),
                Some(k) if g.registered_success >= cap => (k, Code::Rejected),
                Some(k) => {
                    if let Some(c) = delivery::registration_failure(k, faults) {
                        let b = g.intern(c);
                        g.tos.push(k);
                        g.codes.push(b);
                        codes.push(b);
                        continue;
                    }
                    if !g.allow_duplicates {
                        g.registered.insert(k);
                    }
                    g.registered_success += 1;
                    (k, Code::Registered)
                }
            };
            g.tos.push(stored);
            g.codes.push(code as u8);
            codes.push(code as u8);
        }
        Ok(AddOutcome {
            group_seq: g.seq,
            base_index,
            codes,
            table: g.code_table.clone(),
        })
    }

    /// Triggers a send, recording the call and its answer. The fate of
    /// every registered message is decided now, with the delivery settings
    /// of `faults`.
    pub(super) fn send(
        &mut self,
        id: &str,
        complete_after: Duration,
        faults: &Faults,
    ) -> Result<Group, MockError> {
        let g = self.find(id)?;
        let now = Instant::now();
        g.refresh(now, complete_after);
        let res = match g.state {
            State::Pending => {
                let sys = SystemTime::now();
                g.state = State::Sending;
                g.sent_at = Some((now, sys));
                g.date_sent = Some(fmt_date(sys));
                let registered = g
                    .tos
                    .iter()
                    .zip(&g.codes)
                    .filter(|(_, c)| **c == Code::Registered as u8)
                    .map(|(k, _)| *k);
                g.deliveries = Some(Deliveries::decide(
                    DeliveryPlan::from_faults(faults),
                    registered,
                ));
                // The answer says SENDING even with `complete_after` 0, as
                // the real service does: completion is seen on later reads.
                Ok(g.to_group())
            }
            State::Sending => Err(MockError::new(
                409,
                "GroupInProcessing",
                "group is already being sent",
            )),
            State::Complete => Err(MockError::new(409, "AlreadySent", "group was already sent")),
            State::Deleted => Err(MockError::new(400, "DeletedGroup", "group was deleted")),
        };
        let call = match &res {
            Ok(_) => (200, None),
            Err(e) => (e.status, Some(e.code)),
        };
        g.send_calls.push(call);
        res
    }

    pub(super) fn get(&mut self, id: &str, complete_after: Duration) -> Result<Group, MockError> {
        let g = self.find(id)?;
        g.refresh(Instant::now(), complete_after);
        Ok(g.to_group())
    }

    /// One page of a group's messages in index order: at most `limit`
    /// from the one `start_key` names (from the first without), only those
    /// whose status is `status_code` if given. `Ok(None)` for an unknown
    /// group; `400 ValidationError` for a key that names no message of it.
    pub(super) fn list(
        &mut self,
        id: &str,
        start_key: Option<&str>,
        limit: usize,
        status_code: Option<&str>,
        complete_after: Duration,
    ) -> Result<Option<ListPage>, MockError> {
        let Some(&gi) = self.by_id.get(id) else {
            return Ok(None);
        };
        let prefix = id_prefix(&self.nonce, self.groups[gi].seq);
        let g = &mut self.groups[gi];
        g.refresh(Instant::now(), complete_after);
        let len = g.tos.len();
        let start = match start_key {
            None => 0,
            Some(key) => key
                .strip_prefix(&prefix)
                .filter(|i| i.len() == 9 && i.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|i| *i <= len)
                .ok_or_else(|| {
                    MockError::new(
                        400,
                        "ValidationError",
                        format!("startKey {key:?} names no message of group {id}"),
                    )
                })?,
        };
        let plan = g.plan();
        let sent = g.sent_at.map(|(_, sys)| sys);
        let mut items = Vec::with_capacity(limit.min(len - start));
        let mut next_key = None;
        for i in start..len {
            let (k, c) = (g.tos[i], g.codes[i]);
            let status = message_status(k, c, &g.code_table, plan, g.elapsed_ms);
            let code = status.code();
            if status_code.is_some_and(|want| want != code) {
                continue;
            }
            if items.len() == limit {
                next_key = Some(format!("{prefix}{i:09}"));
                break;
            }
            items.push(ListItem {
                message_id: format!("{prefix}{i:09}"),
                to: unpack(k, &g.odd),
                status_code: code.to_owned(),
                reason: match status {
                    Status::Refused(_) => code_message(c, &g.code_table),
                    _ => delivery::reason(code),
                },
                processed: plan.is_some() && c == Code::Registered as u8,
                reported: match (status.final_offset_ms(), sent) {
                    (Some(o), Some(sys)) => {
                        Some(sys + Duration::from_millis(u64::from(o)).max(complete_after))
                    }
                    _ => None,
                },
            });
        }
        Ok(Some(ListPage {
            group_id: g.group_id.clone(),
            date_created: g.date_created.clone(),
            date_sent: g.date_sent.clone(),
            items,
            next_key,
        }))
    }

    pub(super) fn delete(
        &mut self,
        id: &str,
        complete_after: Duration,
    ) -> Result<Group, MockError> {
        let g = self.find(id)?;
        g.refresh(Instant::now(), complete_after);
        if g.state != State::Pending {
            return Err(MockError::new(
                400,
                "NotOperationalStatus",
                format!(
                    "group {id} is {:?}, only PENDING can be deleted",
                    g.status()
                ),
            ));
        }
        g.state = State::Deleted;
        Ok(g.to_group())
    }

    /// Copies the state out (memcpy of the compact vectors), so that the
    /// expensive formatting happens after the lock is released.
    pub(super) fn raw_snapshot(&mut self, complete_after: Duration) -> Vec<RawGroup> {
        let now = Instant::now();
        let nonce = &self.nonce;
        self.groups
            .iter_mut()
            .map(|g| {
                g.refresh(now, complete_after);
                RawGroup {
                    id_prefix: id_prefix(nonce, g.seq),
                    code_table: g.code_table.clone(),
                    plan: g.deliveries.as_ref().map(|d| d.plan.clone()),
                    elapsed_ms: g.elapsed_ms,
                    final_codes: g.final_codes(),
                    group_id: g.group_id.clone(),
                    custom_fields: g.custom_fields.clone(),
                    allow_duplicates: g.allow_duplicates,
                    status: g.status(),
                    count: g.count(),
                    tos: g.tos.clone(),
                    codes: g.codes.clone(),
                    odd: g.odd.clone(),
                    send_calls: g.send_calls.clone(),
                    sent_at_ms: g.sent_at.map(|(_, sys)| unix_ms(sys)),
                }
            })
            .collect()
    }
}

/// A group copied out of the ledger.
pub(crate) struct RawGroup {
    /// Message ids without the index.
    id_prefix: String,
    code_table: Vec<Box<str>>,
    plan: Option<Arc<DeliveryPlan>>,
    elapsed_ms: Option<u64>,
    final_codes: BTreeMap<String, u64>,
    group_id: String,
    custom_fields: BTreeMap<String, String>,
    allow_duplicates: bool,
    status: GroupStatus,
    count: GroupCount,
    tos: Vec<u64>,
    codes: Vec<u8>,
    odd: Vec<Box<str>>,
    send_calls: Vec<(u16, Option<&'static str>)>,
    sent_at_ms: Option<u64>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl RawGroup {
    fn send_calls(&self) -> Vec<SendCall> {
        self.send_calls
            .iter()
            .map(|(status, code)| SendCall {
                status: *status,
                error_code: code.map(str::to_owned),
            })
            .collect()
    }
}

/// `GET /_mock/ledger`: everything, with every message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LedgerSnapshot {
    /// Every group, in creation order.
    pub groups: Vec<LedgerGroup>,
}

/// One group in [`LedgerSnapshot`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerGroup {
    /// Provider id.
    pub group_id: String,
    /// As given at creation.
    pub custom_fields: BTreeMap<String, String>,
    /// As given at creation.
    pub allow_duplicates: bool,
    /// Current status.
    pub status: GroupStatus,
    /// Current counts.
    pub count: GroupCount,
    /// Every message stored, in arrival order.
    pub messages: Vec<LedgerMessage>,
    /// Every send call on this group and how it was answered.
    pub send_calls: Vec<SendCall>,
    /// When the group was sent (the accepted send call), Unix ms.
    #[serde(default)]
    pub sent_at_ms: Option<u64>,
}

/// One stored message.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerMessage {
    /// The id the add answer gave it (`M4V...`).
    #[serde(default)]
    pub message_id: String,
    /// Recipient as received.
    pub to: String,
    /// The code it was answered with (`"2000"`, `"1026"`, `"1062"`,
    /// `"1000"`, or an injected registration failure code).
    pub status_code: String,
    /// Its final code at snapshot time: `"4000"`, a delivery failure code,
    /// or its registration failure code (`"1xxx"`). `None` while it has no
    /// final result (not sent, pending, never final) and for a duplicate
    /// (`"1026"`).
    #[serde(default)]
    pub final_status: Option<String>,
}

/// One send call and its answer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SendCall {
    /// HTTP status answered: 200, 409 or 400.
    pub status: u16,
    /// `errorCode` of a refusal (`GroupInProcessing`, `AlreadySent`, `DeletedGroup`).
    pub error_code: Option<String>,
}

/// `GET /_mock/ledger/summary`: the ledger without per-message lists.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LedgerSummary {
    /// Every group, in creation order.
    pub groups: Vec<GroupSummary>,
    /// Every `to` answered `"2000"` more than once, across all groups.
    /// Empty unless something registered a recipient twice.
    pub duplicate_registrations: Vec<DuplicateRegistration>,
    /// Messages by final code so far across all groups (the sum of
    /// [`GroupSummary::final_status_codes`]).
    #[serde(default)]
    pub final_status_codes: BTreeMap<String, u64>,
    /// Request and fault totals since start (or the last reset).
    pub totals: Totals,
}

/// One group in [`LedgerSummary`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GroupSummary {
    /// Provider id.
    pub group_id: String,
    /// As given at creation.
    pub custom_fields: BTreeMap<String, String>,
    /// As given at creation.
    pub allow_duplicates: bool,
    /// Current status.
    pub status: GroupStatus,
    /// Current counts.
    pub count: GroupCount,
    /// Stored messages by status code, e.g. `{"2000": 9998, "1062": 2}`.
    pub status_codes: BTreeMap<String, u64>,
    /// Messages by final code so far (as [`LedgerMessage::final_status`]),
    /// e.g. `{"4000": 9000, "3104": 998, "1062": 2}`.
    #[serde(default)]
    pub final_status_codes: BTreeMap<String, u64>,
    /// Every send call on this group and how it was answered.
    pub send_calls: Vec<SendCall>,
    /// When the group was sent (the accepted send call), Unix ms.
    #[serde(default)]
    pub sent_at_ms: Option<u64>,
}

/// A recipient registered (`"2000"`) more than once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateRegistration {
    /// The recipient.
    pub to: String,
    /// The group of each registration, once per registration.
    pub group_ids: Vec<String>,
}

/// Request and fault totals.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// API requests received by endpoint (`create`, `add`, `send`, `get`,
    /// `delete`, `messages` (the message list), `other`), faulted ones
    /// included.
    pub requests: BTreeMap<String, u64>,
    /// Faults injected.
    pub faults: FaultTotals,
    /// Messages stored across all groups.
    pub messages: u64,
    /// Messages answered `"2000"` across all groups.
    pub registered: u64,
}

/// Faults injected, by kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FaultTotals {
    /// Answered `500` without effect.
    pub errors: u64,
    /// Took effect, answer dropped.
    pub drops: u64,
    /// Answered `429`.
    pub rate_limited: u64,
    /// Hung by a stall.
    pub stalled: u64,
}

pub(crate) fn snapshot(raw: Vec<RawGroup>) -> LedgerSnapshot {
    LedgerSnapshot {
        groups: raw
            .into_iter()
            .map(|g| LedgerGroup {
                messages: g
                    .tos
                    .iter()
                    .zip(&g.codes)
                    .enumerate()
                    .map(|(i, (&k, &c))| {
                        let status =
                            message_status(k, c, &g.code_table, g.plan.as_deref(), g.elapsed_ms);
                        LedgerMessage {
                            message_id: format!("{}{i:09}", g.id_prefix),
                            to: unpack(k, &g.odd),
                            status_code: code_str(c, &g.code_table).to_owned(),
                            final_status: status.final_code().map(str::to_owned),
                        }
                    })
                    .collect(),
                send_calls: g.send_calls(),
                sent_at_ms: g.sent_at_ms,
                group_id: g.group_id,
                custom_fields: g.custom_fields,
                allow_duplicates: g.allow_duplicates,
                status: g.status,
                count: g.count,
            })
            .collect(),
    }
}

pub(crate) fn summary(raw: Vec<RawGroup>, totals: Totals) -> LedgerSummary {
    // key → indexes of the groups that registered it, one per registration
    let mut seen: FastMap<Vec<u32>> = FastMap::default();
    let mut groups = Vec::with_capacity(raw.len());
    let mut totals = totals;
    let mut final_status_codes: BTreeMap<String, u64> = BTreeMap::new();
    for (gi, g) in raw.iter().enumerate() {
        let mut by_code = [0u64; 256];
        for (&k, &c) in g.tos.iter().zip(&g.codes) {
            by_code[usize::from(c)] += 1;
            if c == Code::Registered as u8 {
                seen.entry(k).or_default().push(gi as u32);
            }
        }
        totals.messages += g.tos.len() as u64;
        totals.registered += by_code[Code::Registered as usize];
        let mut status_codes: BTreeMap<String, u64> = BTreeMap::new();
        for (b, &n) in by_code.iter().enumerate() {
            if n > 0 {
                *status_codes
                    .entry(code_str(b as u8, &g.code_table).to_owned())
                    .or_default() += n;
            }
        }
        for (c, n) in &g.final_codes {
            *final_status_codes.entry(c.clone()).or_default() += n;
        }
        groups.push(GroupSummary {
            group_id: g.group_id.clone(),
            custom_fields: g.custom_fields.clone(),
            allow_duplicates: g.allow_duplicates,
            status: g.status,
            count: g.count,
            status_codes,
            final_status_codes: g.final_codes.clone(),
            send_calls: g.send_calls(),
            sent_at_ms: g.sent_at_ms,
        });
    }
    let mut duplicate_registrations: Vec<DuplicateRegistration> = seen
        .into_iter()
        .filter(|(_, gs)| gs.len() > 1)
        .map(|(k, gs)| DuplicateRegistration {
            to: unpack(k, &[]),
            group_ids: gs
                .into_iter()
                .map(|gi| raw[gi as usize].group_id.clone())
                .collect(),
        })
        .collect();
    duplicate_registrations.sort_by(|a, b| a.to.cmp(&b.to));
    LedgerSummary {
        groups,
        duplicate_registrations,
        final_status_codes,
        totals,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trip() {
        for n in ["01012345678", "0212345678", "021234567", "00000000000"] {
            assert_eq!(unpack(pack(n).unwrap(), &[]), n);
        }
        assert_ne!(pack("0212345678"), pack("00212345678"));
        assert_eq!(pack("12345678901"), None);
    }

    #[test]
    fn add_codes_and_cap() {
        let mut l = Ledger::new("T".into());
        let g = l.create(BTreeMap::new(), false);
        let tos = [
            "01000000001",
            "01000000002",
            "01000000001",
            "bad",
            "01000000003",
        ];
        let out = l
            .add(
                &g.group_id,
                tos.iter().map(|t| (pack(t), *t)),
                2,
                Duration::ZERO,
                &Faults::default(),
            )
            .unwrap();
        assert_eq!(
            out.codes,
            [
                Code::Registered,
                Code::Registered,
                Code::Duplicate,
                Code::InvalidNumber,
                Code::Rejected
            ]
            .map(|c| c as u8)
        );
        let s = snapshot(l.raw_snapshot(Duration::ZERO));
        assert_eq!(s.groups[0].messages[3].to, "bad");
        assert_eq!(s.groups[0].count.registered_failed, 3);
    }

    #[test]
    fn million_message_group_is_counted_without_rehashing() {
        let faults = Faults {
            delivery_failure_rate: 0.3,
            never_final_rate: 0.1,
            ..Faults::default()
        };
        let mut l = Ledger::new("T".into());
        let g = l.create(BTreeMap::new(), false);
        let tos: Vec<String> = (0..1_000_000).map(|i| format!("010{i:08}")).collect();
        for chunk in tos.chunks(10_000) {
            l.add(
                &g.group_id,
                chunk.iter().map(|t| (pack(t), t.as_str())),
                u64::MAX,
                Duration::ZERO,
                &faults,
            )
            .unwrap();
        }
        let started = Instant::now();
        l.send(&g.group_id, Duration::ZERO, &faults).unwrap();
        let sent_in = started.elapsed();
        let started = Instant::now();
        let mut last = None;
        for _ in 0..100 {
            last = Some(l.get(&g.group_id, Duration::ZERO).unwrap());
        }
        let read_in = started.elapsed() / 100;
        let c = last.unwrap().count;
        eprintln!("send {sent_in:?}, one read {read_in:?}");
        assert_eq!(c.sent_total, 1_000_000);
        assert_eq!(c.sent_success + c.sent_failed + c.sent_pending, 1_000_000);
        assert!((290_000..310_000).contains(&c.sent_failed), "{c:?}");
        assert!((90_000..110_000).contains(&c.sent_pending), "{c:?}");
        // The list's first page agrees with the fates.
        let page = l
            .list(&g.group_id, None, 500, None, Duration::ZERO)
            .unwrap()
            .unwrap();
        assert_eq!(page.items.len(), 500);
        assert_eq!(page.next_key.as_deref(), Some("M4VT000001000000500"));
    }
}
