//! Recipient phone numbers: normalisation of what people write, validation
//! and masking for logs.
//!
//! The provider (and so the mock) accepts Korean-style numbers only: ASCII
//! digits, 9 to 11 of them, starting with `0` (for instance `01012345678`,
//! `0212345678`, `021234567`). Anything else is answered with `"1062"`.
//! `groupcast submit` turns numbers as people and spreadsheets write them
//! (`+82 10-1234-5678`, `(010) 1234-5678`, `1012345678`) into that form with
//! [`normalize_into`] before anything else looks at them.

/// Shortest accepted number (`02` area code + 7 digits).
pub(crate) const MIN_LEN: usize = 9;
/// Longest accepted number (mobile `010` + 8 digits).
pub(crate) const MAX_LEN: usize = 11;

/// Whether `to` is a number the provider accepts: ASCII digits only, length
/// 9..=11, starting with `'0'`.
///
/// No normalisation happens here (no stripping of `-` or spaces): the
/// provider does not normalise either, so two spellings of one number would
/// be two recipients to it. Input is normalised once, at the edge
/// ([`normalize_into`]), and only the normal form travels, is deduplicated
/// and is sent.
pub fn is_valid_number(to: &str) -> bool {
    let b = to.as_bytes();
    (MIN_LEN..=MAX_LEN).contains(&b.len()) && b[0] == b'0' && b.iter().all(u8::is_ascii_digit)
}

/// Why a number as written could not be normalised. Each message says what
/// is wrong and what to do; the caller quotes the number before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NumberError {
    /// Nothing but blanks.
    #[error("is empty: write the recipient's number, or remove the row")]
    Empty,
    /// `1.01E+10`: a spreadsheet showed a long number in scientific
    /// notation and saved it so; its last digits are lost.
    #[error(
        "is in scientific notation (the spreadsheet took the column for numbers and cut digits): \
         format the column as Text and enter the numbers again, or export them as text"
    )]
    Scientific,
    /// A character that has no place in a phone number.
    #[error(
        "has {0:?}: write digits, optionally with spaces, hyphens, dots or parentheses between them, \
         and +82 in front for Korea's country code"
    )]
    Character(char),
    /// `+` and a country code other than Korea's.
    #[error(
        "has a country code other than +82 (Korea): only Korean numbers can be sent; remove the row"
    )]
    Foreign,
    /// `82…` without the `+`: most likely the country code, but a number
    /// that merely starts with 82 would be changed silently.
    #[error("starts with 82 without a +: if 82 is Korea's country code, write +82 in front")]
    CountryCodeWithoutPlus,
    /// No leading `0`, and adding one gives no Korean mobile number: a
    /// landline or service number cannot be told apart from a typo.
    #[error(
        "does not start with 0: write the number with its leading 0 \
         (only mobile numbers whose 0 a spreadsheet dropped are restored)"
    )]
    NoLeadingZero,
    /// Starts with `0` but has the wrong number of digits.
    #[error(
        "has {0} digits: a Korean number has 9 to 11 (e.g. 010-1234-5678, 02-123-4567): \
         check for a missing or extra digit"
    )]
    Length(usize),
}

impl NumberError {
    /// A short name of the kind of problem, for counts by kind.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            NumberError::Empty => "empty number",
            NumberError::Scientific => "number in scientific notation",
            NumberError::Character(_) => "character not allowed in a number",
            NumberError::Foreign => "foreign number",
            NumberError::CountryCodeWithoutPlus => "country code without +",
            NumberError::NoLeadingZero => "number without leading 0",
            NumberError::Length(_) => "number of wrong length",
        }
    }
}

/// What [`normalize_into`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Normalized {
    /// Written in normal form already.
    AsWritten,
    /// Separators, blanks or `+82` taken out.
    Reformatted,
    /// A mobile number whose leading 0 was missing (Excel drops it from a
    /// column it takes for numbers): the 0 was put back.
    ZeroRestored,
}

/// Writes `raw`, a Korean number as people and spreadsheets write it, into
/// `out` in the form the provider takes ([`is_valid_number`]): ASCII digits
/// with the leading 0 (`+82 10-1234-5678`, `+821012345678`,
/// `010 1234 5678`, `010.1234.5678`, `(010) 1234-5678` and `1012345678` all
/// become `01012345678`).
///
/// Accepted around and between the digits: blanks, hyphens (dashes too),
/// dots and parentheses; full-width digits are read as digits. A leading
/// `+82` is Korea's country code (a `0` after it, as in `+82 (0)10…`, is
/// kept once). A number without its leading 0 gets it back only when it is
/// then a Korean mobile number (`010` and 8 digits, or `011`, `016` to `019`
/// and 7 or 8): what else lost a 0, or never had one, cannot be told apart
/// from a typo, and is refused rather than guessed. `out` is reused, so
/// that a caller reading millions of rows does not allocate for each; it is
/// left empty on an error.
pub(crate) fn normalize_into(raw: &str, out: &mut String) -> Result<Normalized, NumberError> {
    out.clear();
    let result = normalize_digits(raw, out);
    if result.is_err() {
        out.clear();
    }
    result
}

/// [`normalize_into`], into a new string (the tests' shorthand).
#[cfg(test)]
fn normalize(raw: &str) -> Result<String, NumberError> {
    let mut out = String::new();
    normalize_into(raw, &mut out)?;
    Ok(out)
}

/// [`normalize_into`]'s work, leaving `out` as it is on an error.
fn normalize_digits(raw: &str, out: &mut String) -> Result<Normalized, NumberError> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(NumberError::Empty);
    }
    if is_scientific(s) {
        return Err(NumberError::Scientific);
    }
    let (international, rest) = match s.strip_prefix('+') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    for c in rest.chars() {
        match c {
            '0'..='9' => out.push(c),
            // Full-width digits, as a Korean input method may type them.
            '０'..='９' => out.extend(char::from_digit(u32::from(c) - u32::from('０'), 10)),
            // Hyphens, and the dashes a word processor puts in their place.
            '-' | '.' | '(' | ')' | '\u{2010}'..='\u{2015}' | '\u{2212}' | '\u{ff0d}' => {}
            c if c.is_whitespace() => {}
            c => return Err(NumberError::Character(c)),
        }
    }
    let outcome = if international {
        if !out.starts_with("82") {
            return Err(NumberError::Foreign);
        }
        out.replace_range(..2, "");
        if !out.starts_with('0') {
            out.insert(0, '0');
        }
        Normalized::Reformatted
    } else if !out.is_empty() && !out.starts_with('0') {
        if is_mobile_without_zero(out) {
            out.insert(0, '0');
            Normalized::ZeroRestored
        } else if out.starts_with("82") && (11..=12).contains(&out.len()) {
            return Err(NumberError::CountryCodeWithoutPlus);
        } else {
            return Err(NumberError::NoLeadingZero);
        }
    } else if out == s {
        Normalized::AsWritten
    } else {
        Normalized::Reformatted
    };
    if !is_valid_number(out) {
        return Err(NumberError::Length(out.len()));
    }
    Ok(outcome)
}

/// Whether `0` + `digits` is a Korean mobile number: `010` and 8 digits,
/// or `011`, `016` to `019` and 7 or 8 digits.
fn is_mobile_without_zero(digits: &str) -> bool {
    let b = digits.as_bytes();
    b.iter().all(u8::is_ascii_digit)
        && match b {
            [b'1', b'0', ..] => b.len() == 10,
            [b'1', b'1' | b'6'..=b'9', ..] => (9..=10).contains(&b.len()),
            _ => false,
        }
}

/// Whether `s` is a number in a spreadsheet's scientific notation
/// (`1.01E+10`, `1E10`).
fn is_scientific(s: &str) -> bool {
    let Some((mantissa, exponent)) = s.split_once(['e', 'E']) else {
        return false;
    };
    let exponent = exponent.strip_prefix('+').unwrap_or(exponent);
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => digits(whole) && (fraction.is_empty() || digits(fraction)),
        None => digits(mantissa),
    };
    mantissa_ok && digits(exponent)
}

/// Masks a number for logs and reports: keeps the first 3 and the last 4
/// characters and stars everything in between (`01012345678` →
/// `010****5678`). Strings of 7 characters or fewer would reveal everything
/// that way, so they are starred entirely (one star per character).
pub(crate) fn mask(to: &str) -> String {
    const HEAD: usize = 3;
    const TAIL: usize = 4;
    let n = to.chars().count();
    if n <= HEAD + TAIL {
        return "*".repeat(n);
    }
    to.chars()
        .enumerate()
        .map(|(i, c)| if i < HEAD || i >= n - TAIL { c } else { '*' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_numbers() {
        assert!(is_valid_number("01012345678"));
        assert!(is_valid_number("0212345678"));
        assert!(is_valid_number("021234567"));
    }

    #[test]
    fn invalid_numbers() {
        for bad in [
            "",
            "0",
            "02123456",     // 8 digits
            "010123456789", // 12 digits
            "11012345678",  // no leading 0
            "010-1234-5678",
            "0101234567a",
            "０１０１２３４５６７８", // full-width digits are not ASCII
            "+821012345678",
        ] {
            assert!(!is_valid_number(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn numbers_as_people_write_them_become_one_form() {
        for written in [
            "01012345678",
            "010-1234-5678",
            " 010-1234-5678 ",
            "+82 10-1234-5678",
            "+821012345678",
            "+82 (0)10 1234 5678",
            "+82-10-1234-5678",
            "010 1234 5678",
            "010.1234.5678",
            "(010) 1234-5678",
            "010\u{2013}1234\u{2013}5678",
            "\u{a0}010\u{3000}1234 5678",
            "０１０-１２３４-５６７８",
            "1012345678",
            "10-1234-5678",
        ] {
            assert_eq!(
                normalize(written).as_deref(),
                Ok("01012345678"),
                "{written:?}"
            );
        }
        assert_eq!(normalize("+82 2-123-4567").as_deref(), Ok("021234567"));
        assert_eq!(normalize("02-1234-5678").as_deref(), Ok("0212345678"));
        assert_eq!(normalize("112345678").as_deref(), Ok("0112345678"));
        assert_eq!(normalize("1712345678").as_deref(), Ok("01712345678"));
    }

    #[test]
    fn what_was_changed_is_told() {
        let mut out = String::new();
        assert_eq!(
            normalize_into("01012345678", &mut out),
            Ok(Normalized::AsWritten)
        );
        assert_eq!(
            normalize_into("+82 10 1234 5678", &mut out),
            Ok(Normalized::Reformatted)
        );
        assert_eq!(
            normalize_into("1012345678", &mut out),
            Ok(Normalized::ZeroRestored)
        );
        assert_eq!(out, "01012345678");
        assert_eq!(
            normalize_into("010-1234", &mut out),
            Err(NumberError::Length(7))
        );
        assert_eq!(out, "", "nothing left behind on an error");
    }

    #[test]
    fn what_is_ambiguous_or_wrong_is_refused_with_its_reason() {
        for (written, why) in [
            ("", NumberError::Empty),
            ("   ", NumberError::Empty),
            ("1.01235E+10", NumberError::Scientific),
            ("1E10", NumberError::Scientific),
            ("010-1234-567x", NumberError::Character('x')),
            ("010/1234/5678", NumberError::Character('/')),
            ("010-****-5678", NumberError::Character('*')),
            ("+1 212 555 0100", NumberError::Foreign),
            ("+81 90 1234 5678", NumberError::Foreign),
            ("821012345678", NumberError::CountryCodeWithoutPlus),
            // A landline (02) without its 0, a service number, mobile
            // numbers a digit short or long once restored: not guessed.
            ("212345678", NumberError::NoLeadingZero),
            ("15881234", NumberError::NoLeadingZero),
            ("101234567", NumberError::NoLeadingZero),
            ("10123456789", NumberError::NoLeadingZero),
            ("1512345678", NumberError::NoLeadingZero),
            // Excel's 01012345678 read as a float and written back.
            ("1012345678.0", NumberError::NoLeadingZero),
            ("010-1234-56789", NumberError::Length(12)),
            ("0101234", NumberError::Length(7)),
            ("--", NumberError::Length(0)),
            ("+82", NumberError::Length(1)),
        ] {
            assert_eq!(normalize(written), Err(why), "{written:?}");
        }
    }

    #[test]
    fn normal_forms_are_valid_and_stay_as_they_are() {
        for n in ["01012345678", "0212345678", "021234567", "0311234567"] {
            assert_eq!(normalize(n).as_deref(), Ok(n));
            assert!(is_valid_number(n));
        }
    }

    #[test]
    fn masking() {
        assert_eq!(mask("01012345678"), "010****5678");
        assert_eq!(mask("0212345678"), "021***5678");
        assert_eq!(mask("12345678"), "123*5678");
        assert_eq!(mask("1234567"), "*******");
        assert_eq!(mask(""), "");
        assert_eq!(mask("가나다라마바사아"), "가나다*마바사아");
    }
}
