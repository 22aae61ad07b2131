//! The rows of one chunk given in a request (`groupcast serve`'s
//! `PUT /v1/batches/{id}/chunks/{seq}`), checked as `submit` checks a
//! file: a CSV body goes through the same reader and checks (its
//! encoding, its header, every row: numbers normalised, variables present
//! and not too long, a repeated number sent once), JSON recipients
//! through the same row checks. Every problem is kept (the first
//! [`LISTED`](super::LISTED) listed, all counted), not only the first.

use std::collections::HashSet;
use std::path::Path;

use super::{Duplicates, FileEncoding};
use crate::events::options::BatchOptions;
use crate::events::{Recipient, Template};
use crate::producer::check::{check_rows, Refusal};
use crate::producer::cut_file::kept_recipients;
use crate::producer::input::{Format, Input};
use crate::producer::problems::{Problem, Problems};
use crate::producer::rows::{Row, Vars};

/// One problem of a row of a chunk's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowProblem {
    /// For CSV, the line of the body (the header is line 1); for JSON,
    /// the recipient's index in `recipients` (from 0).
    pub row: usize,
    /// The field (`to`, or a variable's name), when the problem is one
    /// field's.
    pub field: Option<String>,
    /// The kind of problem (`missing variable`, `invalid number`, ...).
    pub kind: &'static str,
    /// What is wrong and what to do.
    pub reason: String,
}

/// Why a chunk's body was refused.
#[derive(Debug)]
pub(crate) enum BodyRefused {
    /// Rows with problems: the first listed, all counted.
    Rows {
        /// The first [`LISTED`](super::LISTED) problems, in row order.
        problems: Vec<RowProblem>,
        /// How many problems in all.
        total: usize,
        /// How many rows were read.
        rows: usize,
    },
    /// The body as a whole (not CSV, a header without a column the
    /// template uses, no recipients): why.
    Whole(String),
}

impl BodyRefused {
    fn of_problems(problems: &Problems, rows: usize) -> BodyRefused {
        BodyRefused::Rows {
            problems: problems.listed().iter().map(row_problem).collect(),
            total: problems.total,
            rows,
        }
    }
}

fn row_problem(p: &Problem) -> RowProblem {
    RowProblem {
        row: p.line(),
        field: p.field_name().map(str::to_string),
        kind: p.kind(),
        reason: p.what().to_string(),
    }
}

impl From<crate::producer::InputError> for BodyRefused {
    fn from(e: crate::producer::InputError) -> Self {
        BodyRefused::Whole(e.to_string())
    }
}

/// The recipients of a CSV body (a header with a `to` column and one
/// column per variable, as a recipients file), checked as `submit` checks
/// a file, numbers normalised, the later rows of a repeated number
/// dropped. `name` names the body in messages.
pub(crate) fn csv_recipients(
    name: &str,
    body: &[u8],
    template: &Template,
) -> Result<Vec<Recipient>, BodyRefused> {
    let path = Path::new(name);
    let mut input = Input::of_bytes(path, body, Format::Csv, FileEncoding::Auto)?;
    let scan = match check_rows(
        &mut input,
        template,
        &BatchOptions::default(),
        None,
        Duplicates::Drop,
    ) {
        Ok(scan) => scan,
        Err(Refusal::Rows { problems, rows }) => {
            return Err(BodyRefused::of_problems(&problems, rows))
        }
        Err(Refusal::File(e)) => return Err(e.into()),
    };
    kept_recipients(&mut input, &scan, |what| {
        BodyRefused::Whole(format!("{name}: {what}"))
    })
}

/// JSON recipients, each checked as a row of a recipients file (its
/// number normalised, every variable the template uses present and none
/// too long); a number given twice is sent once (the batch's own dedupe).
pub(crate) fn json_recipients(
    given: Vec<Recipient>,
    template: &Template,
) -> Result<Vec<Recipient>, BodyRefused> {
    let names = template.placeholders();
    let mut problems = Problems::default();
    let mut number = String::new();
    let mut out = Vec::with_capacity(given.len());
    let mut seen = HashSet::new();
    for (i, r) in given.iter().enumerate() {
        let row = Row {
            line: i,
            to: Some(&r.to),
            vars: Vars::Json(&r.vars),
        };
        let before = problems.total;
        if let Err(p) = row.number(&mut number) {
            problems.add(p);
        }
        row.var_problems(&names, |p| problems.add(p));
        if problems.total > before {
            problems.bad_rows += 1;
        } else if seen.insert(number.clone()) {
            out.push(Recipient {
                to: number.clone(),
                vars: r.vars.clone(),
            });
        }
    }
    if problems.total > 0 {
        return Err(BodyRefused::of_problems(&problems, given.len()));
    }
    if out.is_empty() {
        return Err(BodyRefused::Whole("no recipients in the chunk".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::fixtures::sms;

    #[test]
    fn every_problem_of_a_csv_body_is_kept_with_its_line_and_field() {
        let body = "to,name\n010-1234-5678,a\nabc,b\n01012345679,\n01012345670\n";
        let refused = csv_recipients("chunk 3", body.as_bytes(), &sms()).expect_err("bad rows");
        let BodyRefused::Rows {
            problems,
            total,
            rows,
        } = refused
        else {
            panic!("{refused:?}")
        };
        // An empty value is a value: two problems, a number and a short row.
        assert_eq!((total, rows), (2, 4), "{problems:?}");
        let at: Vec<(usize, Option<&str>)> = problems
            .iter()
            .map(|p| (p.row, p.field.as_deref()))
            .collect();
        assert_eq!(at[0], (3, Some("to")), "{problems:?}");
        assert_eq!(at[1], (5, None), "{problems:?}");
        let good = csv_recipients("c", b"to,name\n+82 10-1234-5678,a\n01012345678,b\n", &sms())
            .expect("good");
        assert_eq!(good.len(), 1, "the repeated number is sent once");
        assert_eq!(good[0].to, "01012345678");
    }

    #[test]
    fn json_recipients_are_checked_as_rows() {
        let r = |to: &str, name: Option<&str>| Recipient {
            to: to.into(),
            vars: name
                .map(|n| [("name".to_string(), n.to_string())].into())
                .unwrap_or_default(),
        };
        let refused = json_recipients(vec![r("010-1234-5678", Some("a")), r("x", None)], &sms())
            .expect_err("bad");
        let BodyRefused::Rows { problems, .. } = refused else {
            panic!("{refused:?}")
        };
        let fields: Vec<_> = problems.iter().map(|p| (p.row, p.field.clone())).collect();
        assert_eq!(
            fields,
            [(1, Some("to".into())), (1, Some("name".into()))],
            "{problems:?}"
        );
        let ok = json_recipients(vec![r("010-1234-5678", Some("a"))], &sms()).expect("ok");
        assert_eq!(ok[0].to, "01012345678");
    }
}
