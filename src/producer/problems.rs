//! What is wrong with the rows of a recipients file, and what to do: each
//! problem ([`Problem`]) and the file's, listed and counted by kind
//! ([`Problems`]), in memory bounded however many there are.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::usage;
use super::InputError;
use crate::events::{clip, QUOTE_MAX};

/// How many problems of a file are listed (in file order); all are counted.
pub const LISTED: usize = 100;

/// What is wrong with one row, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The line of the row (from 1).
    line: usize,
    /// The field, when the problem is one field's.
    field: Option<String>,
    /// A short name of the kind of problem, to count them by.
    kind: &'static str,
    /// What is wrong and what to do.
    what: String,
}

impl Problem {
    /// A problem with the field `field` of the row on `line`.
    pub(crate) fn field(line: usize, field: &str, kind: &'static str, what: String) -> Problem {
        Problem {
            line,
            field: Some(clip(field, QUOTE_MAX)),
            kind,
            what,
        }
    }

    /// A problem with the row on `line` as a whole.
    pub(crate) fn row(line: usize, kind: &'static str, what: String) -> Problem {
        Problem {
            line,
            field: None,
            kind,
            what,
        }
    }

    /// The line of the row (from 1).
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// The field, when the problem is one field's.
    pub(crate) fn field_name(&self) -> Option<&str> {
        self.field.as_deref()
    }

    /// The kind of problem (`missing variable`, `repeated number`, ...).
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// What is wrong and what to do.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    /// As printed: `path:line: field `name`: what`.
    fn show(&self, path: &Path) -> String {
        match &self.field {
            Some(f) => format!(
                "{}:{}: field `{f}`: {}",
                path.display(),
                self.line,
                self.what
            ),
            None => format!("{}:{}: {}", path.display(), self.line, self.what),
        }
    }
}

/// The problems of a file: the first [`LISTED`] in file order, every one
/// counted by kind (memory bounded however many there are).
#[derive(Debug, Default)]
pub(crate) struct Problems {
    /// The first [`LISTED`], by line.
    listed: Vec<Problem>,
    /// How many of each kind.
    by_kind: BTreeMap<&'static str, usize>,
    /// How many in all.
    pub(crate) total: usize,
    /// Rows with at least one problem.
    pub(crate) bad_rows: usize,
}

impl Problems {
    /// Counts `p`, and lists it when it is among the first [`LISTED`] by
    /// line. Within one reading problems come in file order; a later
    /// reading's (the repeated numbers) may go before some already listed.
    pub(crate) fn add(&mut self, p: Problem) {
        self.total += 1;
        *self.by_kind.entry(p.kind).or_default() += 1;
        if self.listed.len() == LISTED && self.listed.last().is_some_and(|l| l.line <= p.line) {
            return;
        }
        let at = self.listed.partition_point(|l| l.line <= p.line);
        self.listed.insert(at, p);
        self.listed.truncate(LISTED);
    }

    /// The first [`LISTED`], by line.
    pub(crate) fn listed(&self) -> &[Problem] {
        &self.listed
    }

    /// The error that lists them, with a summary line: how many rows, how
    /// many bad, how many problems of each kind.
    pub(crate) fn into_error(self, path: &Path, rows: usize) -> InputError {
        let mut msg = String::new();
        for p in &self.listed {
            let _ = writeln!(msg, "{}", p.show(path));
        }
        if self.total > self.listed.len() {
            let _ = writeln!(msg, "… and {} more", self.total - self.listed.len());
        }
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        let _ = write!(
            msg,
            "{}: {rows} row(s), {} bad, {} problem(s): {}; nothing was appended: fix them and submit again",
            path.display(),
            self.bad_rows,
            self.total,
            kinds.join(", ")
        );
        usage(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::fixtures::{check, file, usage_of};
    use crate::producer::Duplicates;

    #[test]
    fn every_problem_of_a_file_is_listed_in_one_run() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut csv = String::from("to,name\n");
        let mut bad_lines = Vec::new();
        for i in 0..1_000usize {
            let line = i + 2;
            // 40 bad rows, scattered, of several kinds.
            let row = match i {
                _ if i % 25 != 7 => format!("010{i:08},n{i}\n"),
                _ if i % 4 == 0 => format!("01012{i},n{i}\n"),
                _ if i % 4 == 1 => format!("010-1234-56x{i},n{i}\n"),
                _ if i % 4 == 2 => format!("010{i:08},n{i},extra\n"),
                _ => format!("+1 555 {i:04},n{i}\n"),
            };
            if i % 25 == 7 {
                bad_lines.push(line);
            }
            csv.push_str(&row);
        }
        assert_eq!(bad_lines.len(), 40);
        let p = file(dir.path(), "bad.csv", &csv);
        let m = usage_of(check(&p, 100, Duplicates::Drop));
        let listed: Vec<usize> = m
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{}:", p.display())))
            .filter_map(|l| l.split(':').next()?.parse().ok())
            .collect();
        assert_eq!(listed, bad_lines, "{m}");
        let summary = m.lines().last().unwrap_or_default();
        assert!(
            summary.contains("1000 row(s), 40 bad, 40 problem(s): "),
            "{summary}"
        );
        for kind in [
            "10 character not allowed in a number",
            "10 foreign number",
            "10 malformed row",
            "10 number of wrong length",
        ] {
            assert!(summary.contains(kind), "{kind}: {summary}");
        }
        assert!(
            m.contains("remove the extra field") && m.contains("only Korean numbers"),
            "every problem says what to do: {m}"
        );
    }

    #[test]
    fn the_listing_is_bounded_and_says_how_many_more() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut jsonl = String::new();
        for i in 0..300 {
            // Every row bad; one twice (no number, no name).
            match i {
                0 => jsonl.push_str("{}\n"),
                _ => jsonl.push_str(&format!("{{\"to\": \"0101234\", \"name\": \"n{i}\"}}\n")),
            }
        }
        let p = file(dir.path(), "r.jsonl", &jsonl);
        let m = usage_of(check(&p, 100, Duplicates::Drop));
        let lines: Vec<&str> = m.lines().collect();
        assert_eq!(lines.len(), LISTED + 2, "{m}");
        assert!(
            lines[0].ends_with(":1: field `to`: missing: every row needs the recipient's number"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].contains(":1: field `name`: missing"),
            "{}",
            lines[1]
        );
        assert!(
            lines[LISTED - 1].contains(":99: field `to`"),
            "{}",
            lines[LISTED - 1]
        );
        assert_eq!(lines[LISTED], "… and 201 more");
        assert!(lines[LISTED + 1].contains(
            "300 row(s), 300 bad, 301 problem(s): 1 missing number, 1 missing variable, 299 number of wrong length"
        ), "{}", lines[LISTED + 1]);
    }
}
