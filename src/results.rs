//! Per-recipient outcomes: the eighth invariant's vocabulary, and the
//! compact record a recipient's outcome is kept as in its batch's results
//! hash (`track_page.lua`; the field is the number).
//!
//! Delivered recipients are counted, not stored: only the others have a
//! record, so a batch with 5 % failures keeps about one record per twenty
//! recipients. A record is `<kind>|<gen>|<code>|<message id>`, `kind` one
//! letter: `R` refused at registration, `F` failed at delivery, `U` no
//! result within the delivery window, `N` not sent (`code`: why, e.g.
//! `cancelled`). A duplicate is kept per copy, under the field
//! `<number>#<seq>` (the number's own field holds its kept copy's
//! outcome): `D|<gen>|<seq>|`, the seq the copy came in.
//!
//! The provider's text for a code is kept once per batch, not per
//! recipient (the delivery hash's `reason:<code>` fields).

use std::fmt;

/// What became of one recipient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The provider reports it delivered (`4000`).
    Delivered,
    /// Refused at registration, or failed at delivery, with a code.
    Failed,
    /// Sent, without a final result within the delivery window.
    Unknown,
    /// A copy of a number the batch already had: never sent.
    Duplicate,
    /// Never sent (its chunk given up, its generation stopped or unsent).
    NotSent,
}

impl Outcome {
    /// Every outcome, in the order reports list them.
    pub const ALL: [Outcome; 5] = [
        Outcome::Delivered,
        Outcome::Failed,
        Outcome::Unknown,
        Outcome::Duplicate,
        Outcome::NotSent,
    ];

    /// Its name in reports, exports and flags.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Failed => "failed",
            Outcome::Unknown => "unknown",
            Outcome::Duplicate => "duplicate",
            Outcome::NotSent => "not_sent",
        }
    }

    /// Parses [`Outcome::name`].
    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.name() == s)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The provider refused to register the message (a `1xxx` code).
    Registration,
    /// The message was sent and its delivery failed (or has no result).
    Delivery,
}

impl Stage {
    /// Its name in exports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Registration => "registration",
            Stage::Delivery => "delivery",
        }
    }
}

/// One stored outcome: a recipient that was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `Failed`, `Unknown`, `NotSent` or `Duplicate`.
    pub outcome: Outcome,
    /// Where a failure happened (`Delivery` for the other outcomes).
    pub stage: Stage,
    /// The generation (provider group) it was in.
    pub gen: u32,
    /// The provider's code (empty for `Unknown` and `Duplicate`); for
    /// `NotSent`, why (a [`NotSentReason`] name).
    pub code: String,
    /// The provider's message id (empty when it never had one).
    pub message_id: String,
    /// The seq of a duplicate copy (None for the other outcomes).
    pub seq: Option<u32>,
}

/// Why recipients that were accepted were never sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSentReason {
    /// Their batch was cancelled before their generation was sent.
    Cancelled,
    /// Their generation's send was given up (`unsent`).
    Unsent,
}

impl NotSentReason {
    /// Its name in records and exports.
    pub fn name(self) -> &'static str {
        match self {
            NotSentReason::Cancelled => "cancelled",
            NotSentReason::Unsent => "unsent",
        }
    }
}

impl Record {
    /// A recipient never sent, for `reason`; `message_id` if the provider
    /// had registered it.
    pub fn not_sent(gen: u32, reason: NotSentReason, message_id: &str) -> Record {
        Record {
            outcome: Outcome::NotSent,
            stage: Stage::Delivery,
            gen,
            code: reason.name().to_string(),
            message_id: message_id.to_string(),
            seq: None,
        }
    }

    /// A copy, in chunk `seq` of generation `gen`, of a number the batch
    /// already had.
    pub fn duplicate(gen: u32, seq: u32) -> Record {
        Record {
            outcome: Outcome::Duplicate,
            stage: Stage::Delivery,
            gen,
            code: String::new(),
            message_id: String::new(),
            seq: Some(seq),
        }
    }

    /// The results hash's field for this record of `number`: the number,
    /// or `<number>#<seq>` for a duplicate copy.
    pub fn field(&self, number: &str) -> String {
        match (self.outcome, self.seq) {
            (Outcome::Duplicate, Some(seq)) => format!("{number}#{seq}"),
            _ => number.to_string(),
        }
    }

    /// The number a results hash field names (see [`Record::field`]).
    pub(crate) fn number_of(field: &str) -> &str {
        field.split_once('#').map_or(field, |(n, _)| n)
    }

    /// The record as the results hash keeps it.
    pub fn encode(&self) -> String {
        let kind = match (self.outcome, self.stage) {
            (Outcome::Unknown, _) => 'U',
            (Outcome::NotSent, _) => 'N',
            (Outcome::Duplicate, _) => {
                return format!("D|{}|{}|", self.gen, self.seq.unwrap_or_default())
            }
            (_, Stage::Registration) => 'R',
            (_, Stage::Delivery) => 'F',
        };
        format!("{kind}|{}|{}|{}", self.gen, self.code, self.message_id)
    }

    /// Reads [`Record::encode`]; `None` for anything else.
    pub fn decode(s: &str) -> Option<Record> {
        let mut parts = s.splitn(4, '|');
        let (outcome, stage) = match parts.next()? {
            "R" => (Outcome::Failed, Stage::Registration),
            "F" => (Outcome::Failed, Stage::Delivery),
            "U" => (Outcome::Unknown, Stage::Delivery),
            "N" => (Outcome::NotSent, Stage::Delivery),
            "D" => (Outcome::Duplicate, Stage::Delivery),
            _ => return None,
        };
        let gen = parts.next()?.parse().ok()?;
        let code = parts.next()?.to_string();
        let message_id = parts.next()?.to_string();
        if outcome == Outcome::Duplicate {
            return Some(Record::duplicate(gen, code.parse().ok()?));
        }
        Some(Record {
            outcome,
            stage,
            gen,
            code,
            message_id,
            seq: None,
        })
    }
}

/// What a provider status code says about a message, for delivery tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `4000`.
    Delivered,
    /// A final failure after the send (`2xxx` other than `2000`, `3xxx`
    /// other than `3000`, anything else final).
    FailedAtDelivery,
    /// A registration failure (`1xxx` other than `1026`): never sent.
    RefusedAtRegistration,
    /// `1026`: a second copy of a message already registered in the group
    /// (a retried add): not a recipient of its own.
    RepeatedAdd,
    /// `2000` (registered, not sent yet) or `3000` (handed on, no result).
    Pending,
}

impl Status {
    /// Classifies a provider status code.
    pub fn of(code: &str) -> Status {
        match code {
            "4000" => Status::Delivered,
            "2000" | "3000" => Status::Pending,
            "1026" => Status::RepeatedAdd,
            c if c.starts_with('1') => Status::RefusedAtRegistration,
            _ => Status::FailedAtDelivery,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        for (outcome, stage, code) in [
            (Outcome::Failed, Stage::Registration, "1062"),
            (Outcome::Failed, Stage::Delivery, "3104"),
            (Outcome::Unknown, Stage::Delivery, ""),
        ] {
            let r = Record {
                outcome,
                stage,
                gen: 3,
                code: code.into(),
                message_id: "M4V|odd".into(),
                seq: None,
            };
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
        let n = Record::not_sent(2, NotSentReason::Cancelled, "M1");
        assert_eq!(n.encode(), "N|2|cancelled|M1");
        assert_eq!(Record::decode(&n.encode()), Some(n.clone()));
        assert_eq!(n.field("01012345678"), "01012345678");
        let d = Record::duplicate(1, 17);
        assert_eq!(d.encode(), "D|1|17|");
        assert_eq!(Record::decode(&d.encode()), Some(d.clone()));
        assert_eq!(d.field("01012345678"), "01012345678#17");
        assert_eq!(Record::number_of("01012345678#17"), "01012345678");
        assert_eq!(Record::number_of("01012345678"), "01012345678");
        assert_eq!(Record::decode("D|1|x|"), None);
        assert_eq!(Record::decode("X|0|1|m"), None);
        assert_eq!(Record::decode("F|zero|1|m"), None);
    }

    #[test]
    fn codes_are_classified_as_the_provider_documents_them() {
        assert_eq!(Status::of("4000"), Status::Delivered);
        assert_eq!(Status::of("3000"), Status::Pending);
        assert_eq!(Status::of("2000"), Status::Pending);
        assert_eq!(Status::of("3104"), Status::FailedAtDelivery);
        assert_eq!(Status::of("2230"), Status::FailedAtDelivery);
        assert_eq!(Status::of("1062"), Status::RefusedAtRegistration);
        assert_eq!(Status::of("1026"), Status::RepeatedAdd);
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.name()), Some(o));
        }
    }
}
