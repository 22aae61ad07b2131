//! Durations and times as people write them, for what a person reads
//! (`status`, `audit`, `--help`'s defaults, log lines and reasons):
//! `180 days`, `7 days`, `1h 30m`, `5 s`, `2026-12-01 18:00 +09:00`.
//!
//! `humantime`'s own display counts in months of 30.44 days, so the default
//! `--remember` of 180 days read "5months 27days 19h 12m". Everything here
//! reads back through `humantime`'s parser, which the flags use, so a
//! default shown in `--help` is also a value one can type.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::Timestamp;

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// `d` as people write it. One unit alone is spelled with a space (`7 days`,
/// `2 h`, `5 min`, `5 s`, `250 ms`); several are written together, largest
/// first (`2 days 3h`, `1h 30m`, `1m 30s`). Under a minute tenths of a
/// second are kept (`1.5 s`); past a minute the seconds are whole.
pub(crate) fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{} ms", d.subsec_millis());
    }
    let tenths = d.subsec_millis() / 100;
    if secs < MINUTE {
        return if tenths == 0 {
            format!("{secs} s")
        } else {
            format!("{secs}.{tenths} s")
        };
    }
    let (days, h, m, s) = (
        secs / DAY,
        secs % DAY / HOUR,
        secs % HOUR / MINUTE,
        secs % MINUTE,
    );
    let parts: Vec<(u64, &str)> = [(h, "h"), (m, "m"), (s, "s")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .collect();
    let days_text = match days {
        0 => None,
        1 => Some("1 day".to_string()),
        n => Some(format!("{n} days")),
    };
    match (days_text, parts.as_slice()) {
        (Some(d), []) => d,
        (None, [(n, unit)]) => {
            let unit = if *unit == "m" { "min" } else { unit };
            format!("{n} {unit}")
        }
        (days_text, parts) => days_text
            .into_iter()
            .chain(parts.iter().map(|(n, unit)| format!("{n}{unit}")))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// [`duration`] of milliseconds.
pub(crate) fn millis(ms: u64) -> String {
    duration(Duration::from_millis(ms))
}

/// The instant `ms` (Unix milliseconds) as a local time in `tz` with its
/// offset, to the minute when the seconds are zero:
/// `2026-12-01 18:00 +09:00`, `2026-12-01 09:00:05 +00:00`. None when `ms`
/// is not a representable instant.
pub(crate) fn time_in(ms: i64, tz: &TimeZone) -> Option<String> {
    let zoned = Timestamp::from_millisecond(ms).ok()?.to_zoned(tz.clone());
    let format = if zoned.second() == 0 && zoned.subsec_nanosecond() == 0 {
        "%Y-%m-%d %H:%M %:z"
    } else {
        "%Y-%m-%d %H:%M:%S %:z"
    };
    Some(zoned.strftime(format).to_string())
}

/// A duration flag (`--retention 7d`, `--remember 180days`): parsed as
/// `humantime` parses, shown as [`duration`] shows (so `--help` prints
/// `[default: 180 days]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlagDuration(pub Duration);

impl FromStr for FlagDuration {
    type Err = humantime::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(FlagDuration)
    }
}

impl fmt::Display for FlagDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&duration(self.0))
    }
}

impl From<Duration> for FlagDuration {
    fn from(d: Duration) -> Self {
        FlagDuration(d)
    }
}

impl From<FlagDuration> for Duration {
    fn from(d: FlagDuration) -> Self {
        d.0
    }
}

impl std::ops::Deref for FlagDuration {
    type Target = Duration;
    fn deref(&self) -> &Duration {
        &self.0
    }
}

/// A command line's duration flag, as clap's `value_parser`: what
/// [`FlagDuration`] reads, with an example of what to write when it cannot.
pub(crate) fn flag_duration(s: &str) -> Result<FlagDuration, String> {
    s.parse::<FlagDuration>()
        .map_err(|e| format!("{e} (write e.g. 500ms, 30s, 5m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn durations_read_as_people_write_them() {
        for (d, text) in [
            (secs(180 * DAY), "180 days"),
            (secs(7 * DAY), "7 days"),
            (secs(DAY), "1 day"),
            (secs(HOUR + 30 * MINUTE), "1h 30m"),
            (secs(5), "5 s"),
            (Duration::from_millis(1500), "1.5 s"),
            (Duration::from_millis(250), "250 ms"),
            (Duration::ZERO, "0 ms"),
            (secs(5 * MINUTE), "5 min"),
            (secs(2 * HOUR), "2 h"),
            (secs(MINUTE + 30), "1m 30s"),
            (secs(2 * DAY + 3 * HOUR), "2 days 3h"),
            (secs(DAY + 5), "1 day 5s"),
            (secs(3 * MINUTE + 5) + Duration::from_millis(900), "3m 5s"),
        ] {
            assert_eq!(duration(d), text, "{d:?}");
        }
    }

    /// What is shown reads back as the same duration (clap parses the
    /// default it shows), to the precision shown.
    #[test]
    fn what_is_shown_parses_back() {
        for d in [
            secs(180 * DAY),
            secs(7 * DAY),
            secs(HOUR + 30 * MINUTE),
            secs(5),
            secs(5 * MINUTE),
            secs(2 * HOUR),
            secs(2 * DAY + 3 * HOUR + 4 * MINUTE + 5),
            Duration::from_millis(1500),
            Duration::from_millis(20),
        ] {
            let shown = FlagDuration(d).to_string();
            let back: FlagDuration = shown.parse().expect("parses");
            assert_eq!(back.0, d, "{shown}");
        }
    }

    #[test]
    fn times_carry_the_offset_of_their_zone() {
        let seoul = TimeZone::get("Asia/Seoul").expect("zone");
        // 2026-12-01T09:00:00Z.
        let ms = 1_796_115_600_000;
        assert_eq!(
            time_in(ms, &seoul).as_deref(),
            Some("2026-12-01 18:00 +09:00")
        );
        assert_eq!(
            time_in(ms + 5_000, &TimeZone::UTC).as_deref(),
            Some("2026-12-01 09:00:05 +00:00")
        );
    }
}
