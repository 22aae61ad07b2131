//! The mock's state: groups and their messages, kept compactly, plus the
//! JSON views of it (`/_mock/ledger`, `/_mock/ledger/summary`).
//!
//! Messages are stored as one `u64` (the number, packed) and one `u8` (the
//! status code) each, so a million-recipient group costs ~9 MB and an add of
//! 10,000 messages does no per-message allocation under the lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use crate::phone;
use crate::provider::model::{Group, GroupCount, GroupStatus};

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
            Code::Registered => "2000",
            Code::Duplicate => "1026",
            Code::InvalidNumber => "1062",
            Code::Rejected => "1000",
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
            State::Sending => c.sent_pending = ok,
            State::Complete => {
                c.sent_total = ok;
                c.sent_success = ok;
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

fn fmt_date(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Result of one add, enough to write the answer outside the lock.
pub(crate) struct AddOutcome {
    pub group_seq: u64,
    /// Index in the group of the first message of this request.
    pub base_index: u64,
    pub codes: Vec<Code>,
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
    /// would pass for a registration.
    pub(super) fn add<'a>(
        &mut self,
        id: &str,
        msgs: impl ExactSizeIterator<Item = (Option<u64>, &'a str)>,
        cap: u64,
        complete_after: Duration,
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
                    if !g.allow_duplicates {
                        g.registered.insert(k);
                    }
                    g.registered_success += 1;
                    (k, Code::Registered)
                }
            };
            g.tos.push(stored);
            g.codes.push(code as u8);
            codes.push(code);
        }
        Ok(AddOutcome {
            group_seq: g.seq,
            base_index,
            codes,
        })
    }

    /// Triggers a send, recording the call and its answer.
    pub(super) fn send(&mut self, id: &str, complete_after: Duration) -> Result<Group, MockError> {
        let g = self.find(id)?;
        let now = Instant::now();
        g.refresh(now, complete_after);
        let res = match g.state {
            State::Pending => {
                let sys = SystemTime::now();
                g.state = State::Sending;
                g.sent_at = Some((now, sys));
                g.date_sent = Some(fmt_date(sys));
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
        self.groups
            .iter_mut()
            .map(|g| {
                g.refresh(now, complete_after);
                RawGroup {
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
    /// Recipient as received.
    pub to: String,
    /// The code it was answered with (`"2000"`, `"1026"`, `"1062"`, `"1000"`).
    pub status_code: String,
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
    /// `delete`, `other`), faulted ones included.
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
                    .map(|(&k, &c)| LedgerMessage {
                        to: unpack(k, &g.odd),
                        status_code: Code::from_u8(c).status_code().to_owned(),
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
    for (gi, g) in raw.iter().enumerate() {
        let mut by_code = [0u64; 4];
        for (&k, &c) in g.tos.iter().zip(&g.codes) {
            let code = Code::from_u8(c);
            by_code[code as usize] += 1;
            if code == Code::Registered {
                seen.entry(k).or_default().push(gi as u32);
            }
        }
        totals.messages += g.tos.len() as u64;
        totals.registered += by_code[Code::Registered as usize];
        let status_codes = [
            Code::Registered,
            Code::Duplicate,
            Code::InvalidNumber,
            Code::Rejected,
        ]
        .into_iter()
        .filter(|c| by_code[*c as usize] > 0)
        .map(|c| (c.status_code().to_owned(), by_code[c as usize]))
        .collect();
        groups.push(GroupSummary {
            group_id: g.group_id.clone(),
            custom_fields: g.custom_fields.clone(),
            allow_duplicates: g.allow_duplicates,
            status: g.status,
            count: g.count,
            status_codes,
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
        );
        let s = snapshot(l.raw_snapshot(Duration::ZERO));
        assert_eq!(s.groups[0].messages[3].to, "bad");
        assert_eq!(s.groups[0].count.registered_failed, 3);
    }
}
