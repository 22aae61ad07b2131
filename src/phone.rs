//! Recipient phone numbers: validation and masking for logs.
//!
//! The provider (and so the mock) accepts Korean-style numbers only: ASCII
//! digits, 9 to 11 of them, starting with `0` (for instance `01012345678`,
//! `0212345678`, `021234567`). Anything else is answered with `"1062"`.

/// Shortest accepted number (`02` area code + 7 digits).
pub const MIN_LEN: usize = 9;
/// Longest accepted number (mobile `010` + 8 digits).
pub const MAX_LEN: usize = 11;

/// Whether `to` is a number the provider accepts: ASCII digits only, length
/// 9..=11, starting with `'0'`.
///
/// No normalisation happens here (no stripping of `-` or spaces): the
/// provider does not normalise either, so a caller that did would disagree
/// with the provider about which numbers are duplicates.
pub fn is_valid_number(to: &str) -> bool {
    let b = to.as_bytes();
    (MIN_LEN..=MAX_LEN).contains(&b.len()) && b[0] == b'0' && b.iter().all(u8::is_ascii_digit)
}

/// Masks a number for logs and reports: keeps the first 3 and the last 4
/// characters and stars everything in between (`01012345678` →
/// `010****5678`). Strings of 7 characters or fewer would reveal everything
/// that way, so they are starred entirely (one star per character).
pub fn mask(to: &str) -> String {
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
    fn masking() {
        assert_eq!(mask("01012345678"), "010****5678");
        assert_eq!(mask("0212345678"), "021***5678");
        assert_eq!(mask("12345678"), "123*5678");
        assert_eq!(mask("1234567"), "*******");
        assert_eq!(mask(""), "");
        assert_eq!(mask("가나다라마바사아"), "가나다*마바사아");
    }
}
