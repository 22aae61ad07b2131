//! Batch options: when a batch may be sent (`send_at`, quiet hours) and in
//! which lane it travels (`priority`). They are batch-level: every chunk of a
//! batch carries the same ones (the accept script refuses a chunk whose
//! options differ from those of the chunks accepted before it).
//!
//! Pure: parsing, the canonical form the batch's state keeps, and the time
//! arithmetic of a send's release instant (across midnight and daylight
//! saving changes, in the batch's IANA zone). The send step asks
//! [`SendWindow::release_at`] when it may go.

use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A batch's lane: urgent work is read and rate-limited ahead of normal
/// work, normal ahead of bulk (which keeps a guaranteed share).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// One-time passwords, alerts: ahead of everything.
    Urgent,
    /// The default.
    #[default]
    Normal,
    /// Marketing and other large, patient batches.
    Bulk,
}

impl Priority {
    /// Every priority, most urgent first.
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Bulk];

    /// The name in the ingest format and in key names.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Normal => "normal",
            Priority::Bulk => "bulk",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.name() == s)
    }
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A daily window in which the batch's messages must not go out, in an IANA
/// zone: `{"start": "21:00", "end": "08:00", "tz": "Asia/Seoul"}`. `start` is
/// inside the window, `end` is not; a window whose start is after its end
/// spans midnight. Times are `HH:MM` or `HH:MM:SS`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QuietHours {
    /// When the window opens (local time).
    pub start: String,
    /// When it closes (local time).
    pub end: String,
    /// The IANA zone of `start` and `end`, e.g. `Asia/Seoul`.
    pub tz: String,
}

/// The options as a producer writes them (each optional).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BatchOptions {
    /// Not before this instant (RFC 3339, e.g. `2026-12-01T18:00:00+09:00`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_at: Option<String>,
    /// The lane (default `normal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Never inside this daily window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_hours: Option<QuietHours>,
}

/// Why a batch's options were refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OptionsError {
    /// `send_at` is not an RFC 3339 instant.
    #[error(
        "send_at {0:?} is not an RFC 3339 instant with an offset (like 2026-12-01T18:00:00+09:00)"
    )]
    SendAt(String),
    /// A quiet-hours time is not `HH:MM` or `HH:MM:SS`.
    #[error("quiet_hours {field} {value:?} is not a time of day HH:MM or HH:MM:SS")]
    QuietTime {
        /// `start` or `end`.
        field: &'static str,
        /// What was given.
        value: String,
    },
    /// The zone is not a known IANA zone.
    #[error("quiet_hours tz {0:?} is not a known IANA time zone (like Asia/Seoul)")]
    Zone(String),
    /// Start equals end: an empty (or whole-day) window says nothing clear.
    #[error("quiet_hours start and end are both {0}: the window would be empty")]
    EmptyWindow(String),
}

impl BatchOptions {
    /// Whether no option is set (the chunk encodes no `options`).
    pub fn is_empty(&self) -> bool {
        self.send_at.is_none() && self.priority.is_none() && self.quiet_hours.is_none()
    }

    /// The lane (default `normal`).
    pub fn priority(&self) -> Priority {
        self.priority.unwrap_or_default()
    }

    /// The canonical form ([`SendWindow::canonical`]) of valid options.
    pub fn canonical(&self) -> Result<String, OptionsError> {
        if self.is_empty() {
            return Ok(SendWindow::default().canonical());
        }
        Ok(self.resolve()?.canonical())
    }

    /// Checks the options and reads them into their working form.
    pub fn resolve(&self) -> Result<SendWindow, OptionsError> {
        let send_at = match &self.send_at {
            None => None,
            Some(s) => Some(
                s.parse::<Timestamp>()
                    .map_err(|_| OptionsError::SendAt(crate::events::clip(s, 64)))?
                    .as_millisecond(),
            ),
        };
        let quiet = match &self.quiet_hours {
            None => None,
            Some(q) => Some(Quiet::parse(q)?),
        };
        Ok(SendWindow {
            send_at,
            priority: self.priority(),
            quiet,
        })
    }
}

/// A quiet-hours window, parsed: seconds of the local day, and the zone.
#[derive(Debug, Clone, PartialEq)]
pub struct Quiet {
    start: i32,
    end: i32,
    tz_name: String,
    tz: TimeZone,
}

fn day_seconds(field: &'static str, value: &str) -> Result<i32, OptionsError> {
    let bad = || OptionsError::QuietTime {
        field,
        value: crate::events::clip(value, 32),
    };
    let parts: Vec<&str> = value.split(':').collect();
    if !(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.len() != 2) {
        return Err(bad());
    }
    let mut n = [0i32; 3];
    for (i, p) in parts.iter().enumerate() {
        n[i] = p.parse::<i32>().map_err(|_| bad())?;
    }
    if n[0] > 23 || n[1] > 59 || n[2] > 59 {
        return Err(bad());
    }
    Ok(n[0] * 3600 + n[1] * 60 + n[2])
}

fn hms(s: i32) -> String {
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `HH:MM`, with `:SS` only when there are seconds: as people write a time.
fn hm(s: i32) -> String {
    if s % 60 == 0 {
        format!("{:02}:{:02}", s / 3600, s / 60 % 60)
    } else {
        hms(s)
    }
}

impl Quiet {
    fn parse(q: &QuietHours) -> Result<Quiet, OptionsError> {
        let start = day_seconds("start", &q.start)?;
        let end = day_seconds("end", &q.end)?;
        if start == end {
            return Err(OptionsError::EmptyWindow(hms(start)));
        }
        let tz =
            TimeZone::get(&q.tz).map_err(|_| OptionsError::Zone(crate::events::clip(&q.tz, 64)))?;
        Ok(Quiet {
            start,
            end,
            tz_name: q.tz.clone(),
            tz,
        })
    }

    /// `HH:MM:SS-HH:MM:SS@Zone`.
    fn canonical(&self) -> String {
        format!("{}-{}@{}", hms(self.start), hms(self.end), self.tz_name)
    }

    /// As people write it: `21:00-08:00 Asia/Seoul`.
    pub fn describe(&self) -> String {
        format!("{}-{} {}", hm(self.start), hm(self.end), self.tz_name)
    }

    /// The window's zone.
    pub fn zone(&self) -> &TimeZone {
        &self.tz
    }

    fn from_canonical(s: &str) -> Option<Quiet> {
        let (times, tz) = s.split_once('@')?;
        let (start, end) = times.split_once('-')?;
        Quiet::parse(&QuietHours {
            start: start.into(),
            end: end.into(),
            tz: tz.into(),
        })
        .ok()
    }

    /// The instant local time `secs` of `date` names in the window's zone (a
    /// time skipped by a daylight-saving change names the instant after the
    /// gap; a repeated one, the first).
    fn instant(&self, date: Date, secs: i32) -> Option<Timestamp> {
        let t = Time::new(
            (secs / 3600) as i8,
            (secs / 60 % 60) as i8,
            (secs % 60) as i8,
            0,
        )
        .ok()?;
        Some(
            date.to_datetime(t)
                .to_zoned(self.tz.clone())
                .ok()?
                .timestamp(),
        )
    }

    /// When a send due at `t` may go: `t`, or the end of the window `t`
    /// falls in.
    pub fn release_at(&self, t: Timestamp) -> Timestamp {
        let local = t.to_zoned(self.tz.clone());
        let time = local.time();
        let s = i32::from(time.hour()) * 3600
            + i32::from(time.minute()) * 60
            + i32::from(time.second());
        let date = local.date();
        let end_day = if self.start < self.end {
            // Within one day: [start, end).
            if s < self.start || s >= self.end {
                return t;
            }
            Some(date)
        } else if s >= self.start {
            // Across midnight, before it: the window ends tomorrow.
            date.tomorrow().ok()
        } else if s < self.end {
            // Across midnight, after it: the window ends today.
            Some(date)
        } else {
            return t;
        };
        end_day
            .and_then(|d| self.instant(d, self.end))
            .filter(|end| *end > t)
            .unwrap_or(t)
    }
}

impl Quiet {
    /// The quiet window containing `t`, or else the next one to open after
    /// it: `(opens, closes)`, instants (`opens <= t` when `t` is inside).
    /// Computed in the window's zone (daylight-saving changes included); the
    /// claim script gets these instants, since Lua has no zone database.
    pub fn window_at(&self, t: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let date = t.to_zoned(self.tz.clone()).date();
        let mut day = date.yesterday().ok()?;
        // Yesterday's window (it may span midnight into today), today's and
        // tomorrow's: the first whose end is after `t`.
        for _ in 0..3 {
            let end_day = if self.start < self.end {
                day
            } else {
                day.tomorrow().ok()?
            };
            let opens = self.instant(day, self.start)?;
            let closes = self.instant(end_day, self.end)?;
            if closes > t && opens < closes {
                return Some((opens, closes));
            }
            day = day.tomorrow().ok()?;
        }
        None
    }
}

/// What the claim script (`claim_send.lua`) is told of a batch's schedule:
/// `send_at`, and the quiet window that matters from `from` on, as instants
/// (Unix ms on the Redis clock's scale). The worker computes the window with
/// the zone database from a Redis clock reading; the script decides with
/// its own clock ([`hold`]). Valid while the script's clock is in
/// `[from, closes)`: a reading outside it answers `stale`, and the worker
/// computes the window again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScheduleArgs {
    /// Not before this instant (Unix ms).
    pub send_at: Option<u64>,
    /// `(from, opens, closes)`: the quiet window containing, or next after,
    /// `from` (the instant it was computed for).
    pub quiet: Option<(u64, u64, u64)>,
}

impl ScheduleArgs {
    /// The script's arguments: `send_at` (empty when unset) and
    /// `from|opens|closes` (empty when the batch has no quiet hours).
    pub fn argv(&self) -> (String, String) {
        (
            self.send_at.map(|v| v.to_string()).unwrap_or_default(),
            self.quiet
                .map(|(f, o, c)| format!("{f}|{o}|{c}"))
                .unwrap_or_default(),
        )
    }
}

/// What [`hold`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldDecision {
    /// The send may start now, and must start before `until` (Unix ms): the
    /// claim's lifetime, `now + lifetime`, cut at the next quiet window.
    Free {
        /// The end of the claim's lifetime.
        until: u64,
    },
    /// Held until `at` (Unix ms), because of `reason` (`send_at` or
    /// `quiet_hours`).
    Held {
        /// The release instant.
        at: u64,
        /// `send_at` or `quiet_hours`.
        reason: &'static str,
    },
    /// The window given does not cover `now` (it closed, or the clock went
    /// back): compute it again.
    Stale,
}

/// The schedule's decision at `now` (Redis ms), for a claim of `lifetime_ms`:
/// pure, and the same arithmetic as `hold()` in `claim_send.lua`. Never free
/// before `send_at` or inside the quiet window; a free answer's `until` is no
/// later than the window's opening, so a send started before `until` never
/// starts inside quiet hours.
pub fn hold(now: u64, lifetime_ms: u64, args: &ScheduleArgs) -> HoldDecision {
    let due = args.send_at.map_or(now, |s| s.max(now));
    let mut until = now.saturating_add(lifetime_ms);
    if let Some((from, opens, closes)) = args.quiet {
        if due < from || due >= closes {
            return HoldDecision::Stale;
        }
        if due >= opens {
            return HoldDecision::Held {
                at: closes,
                reason: "quiet_hours",
            };
        }
        until = until.min(opens);
    }
    match args.send_at {
        Some(s) if now < s => HoldDecision::Held {
            at: s,
            reason: "send_at",
        },
        _ => HoldDecision::Free { until },
    }
}

/// A batch's options, resolved: what the send step and the lanes read.
#[derive(Debug, Clone, PartialEq)]
pub struct SendWindow {
    /// Not before this instant (Unix ms).
    pub send_at: Option<i64>,
    /// The lane.
    pub priority: Priority,
    /// The quiet-hours window.
    pub quiet: Option<Quiet>,
}

impl Default for SendWindow {
    fn default() -> Self {
        SendWindow {
            send_at: None,
            priority: Priority::Normal,
            quiet: None,
        }
    }
}

impl SendWindow {
    /// The form the batch's state keeps (field `opts`) and the accept script
    /// compares: `<send_at ms>|<priority>|<quiet hours>`, empty parts when
    /// unset. Two chunks agree on their options when these are equal (so
    /// `21:00` and `21:00:00`, or two spellings of one instant, agree).
    pub fn canonical(&self) -> String {
        format!(
            "{}|{}|{}",
            self.send_at.map(|ms| ms.to_string()).unwrap_or_default(),
            self.priority.name(),
            self.quiet
                .as_ref()
                .map(Quiet::canonical)
                .unwrap_or_default()
        )
    }

    /// Reads [`SendWindow::canonical`] back (None: not that form).
    pub fn from_canonical(s: &str) -> Option<SendWindow> {
        let mut parts = s.splitn(3, '|');
        let (at, priority, quiet) = (parts.next()?, parts.next()?, parts.next()?);
        Some(SendWindow {
            send_at: if at.is_empty() {
                None
            } else {
                Some(at.parse().ok()?)
            },
            priority: Priority::parse(priority)?,
            quiet: if quiet.is_empty() {
                None
            } else {
                Some(Quiet::from_canonical(quiet)?)
            },
        })
    }

    /// Whether anything holds the send (a `send_at` or quiet hours).
    pub fn holds(&self) -> bool {
        self.send_at.is_some() || self.quiet.is_some()
    }

    /// When a generation ready at `now_ms` may be sent (Unix ms): not before
    /// `send_at`, and never inside quiet hours. A generation ready after
    /// `send_at` goes at once (outside quiet hours).
    pub fn release_at(&self, now_ms: i64) -> i64 {
        let due = self.send_at.map_or(now_ms, |at| at.max(now_ms));
        match (&self.quiet, Timestamp::from_millisecond(due)) {
            (Some(q), Ok(t)) => q.release_at(t).as_millisecond(),
            _ => due,
        }
    }

    /// What the claim script is told of this schedule, computed from the
    /// Redis clock reading `now_ms` (see [`ScheduleArgs`]).
    pub fn schedule_args(&self, now_ms: u64) -> ScheduleArgs {
        let send_at = self.send_at.map(|v| u64::try_from(v).unwrap_or(0));
        let from = send_at.map_or(now_ms, |s| s.max(now_ms));
        let quiet = self.quiet.as_ref().and_then(|q| {
            let t = Timestamp::from_millisecond(i64::try_from(from).ok()?).ok()?;
            let (opens, closes) = q.window_at(t)?;
            let ms = |x: Timestamp| u64::try_from(x.as_millisecond()).unwrap_or(0);
            Some((from, ms(opens), ms(closes)))
        });
        ScheduleArgs { send_at, quiet }
    }

    /// `send_at` as RFC 3339 (UTC), for reports.
    pub fn send_at_text(&self) -> Option<String> {
        self.send_at
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(|t| t.to_string())
    }

    /// The zone a person reads this batch's times in: its quiet hours' zone
    /// when it has one (the zone its operator thinks in), else UTC.
    pub fn zone(&self) -> TimeZone {
        self.quiet
            .as_ref()
            .map_or(TimeZone::UTC, |q| q.zone().clone())
    }

    /// The instant `ms` as a time with its offset in [`SendWindow::zone`]
    /// (`2026-12-01 18:00 +09:00`); the bare number if not an instant.
    pub fn time_text(&self, ms: i64) -> String {
        crate::human::time_in(ms, &self.zone()).unwrap_or_else(|| ms.to_string())
    }

    /// The options as a person reads them:
    /// `priority normal, send at 2026-12-01 18:00 +09:00, quiet hours
    /// 21:00-08:00 Asia/Seoul`; `send once ready` and `no quiet hours`
    /// when unset.
    pub fn describe(&self) -> String {
        format!(
            "priority {}, {}, {}",
            self.priority,
            self.send_at.map_or("send once ready".into(), |ms| format!(
                "send at {}",
                self.time_text(ms)
            )),
            self.quiet
                .as_ref()
                .map_or("no quiet hours".into(), |q| format!(
                    "quiet hours {}",
                    q.describe()
                )),
        )
    }

    /// [`SendWindow::describe`] of a canonical form; the form itself when
    /// it does not read (a newer or damaged state: shown, not hidden).
    pub fn describe_canonical(canonical: &str) -> String {
        SendWindow::from_canonical(canonical)
            .map_or_else(|| canonical.to_string(), |w| w.describe())
    }

    /// The quiet hours as `HH:MM:SS-HH:MM:SS@Zone`, for reports.
    pub fn quiet_text(&self) -> Option<String> {
        self.quiet.as_ref().map(Quiet::canonical)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("instant")
    }

    fn quiet(start: &str, end: &str, tz: &str) -> Quiet {
        Quiet::parse(&QuietHours {
            start: start.into(),
            end: end.into(),
            tz: tz.into(),
        })
        .expect("window")
    }

    #[test]
    fn a_window_across_midnight_defers_to_its_end_on_the_right_day() {
        let q = quiet("21:00", "08:00", "Asia/Seoul");
        // 22:30 KST on Dec 1 → 08:00 KST on Dec 2.
        assert_eq!(
            q.release_at(ts("2026-12-01T22:30:00+09:00")),
            ts("2026-12-02T08:00:00+09:00")
        );
        // 03:00 KST (after midnight) → 08:00 the same day.
        assert_eq!(
            q.release_at(ts("2026-12-02T03:00:00+09:00")),
            ts("2026-12-02T08:00:00+09:00")
        );
        // The edges: 21:00 is inside, 08:00 is not.
        assert_eq!(
            q.release_at(ts("2026-12-01T21:00:00+09:00")),
            ts("2026-12-02T08:00:00+09:00")
        );
        let free = ts("2026-12-02T08:00:00+09:00");
        assert_eq!(q.release_at(free), free);
        let noon = ts("2026-12-02T12:00:00+09:00");
        assert_eq!(q.release_at(noon), noon);
        // Across a year boundary.
        assert_eq!(
            q.release_at(ts("2026-12-31T23:59:59+09:00")),
            ts("2027-01-01T08:00:00+09:00")
        );
    }

    #[test]
    fn a_window_within_a_day() {
        let q = quiet("12:00", "13:30", "UTC");
        assert_eq!(
            q.release_at(ts("2026-12-01T12:10:00Z")),
            ts("2026-12-01T13:30:00Z")
        );
        let before = ts("2026-12-01T11:59:59Z");
        assert_eq!(q.release_at(before), before);
        let after = ts("2026-12-01T13:30:00Z");
        assert_eq!(q.release_at(after), after);
    }

    #[test]
    fn daylight_saving_changes_are_followed() {
        // New York, 2026-03-08: 02:00 local does not exist (clocks jump to
        // 03:00). A window ending at 02:30 ends at the instant after the gap.
        let q = quiet("21:00", "02:30", "America/New_York");
        assert_eq!(
            q.release_at(ts("2026-03-07T23:00:00-05:00")),
            ts("2026-03-08T03:30:00-04:00")
        );
        // A window ending at 08:00 on the day of the change: 08:00 EDT.
        let q = quiet("21:00", "08:00", "America/New_York");
        assert_eq!(
            q.release_at(ts("2026-03-07T22:00:00-05:00")),
            ts("2026-03-08T08:00:00-04:00")
        );
        // And back in November (08:00 EST, 25 hours after 08:00 EDT the day before).
        assert_eq!(
            q.release_at(ts("2026-11-01T01:30:00-04:00")),
            ts("2026-11-01T08:00:00-05:00")
        );
    }

    #[test]
    fn the_release_instant_combines_send_at_and_quiet_hours() {
        let w = BatchOptions {
            send_at: Some("2026-12-01T20:30:00+09:00".into()),
            priority: None,
            quiet_hours: Some(QuietHours {
                start: "21:00".into(),
                end: "08:00".into(),
                tz: "Asia/Seoul".into(),
            }),
        }
        .resolve()
        .expect("valid");
        let ms = |s: &str| ts(s).as_millisecond();
        // Ready early: held until send_at (outside the window).
        assert_eq!(
            w.release_at(ms("2026-12-01T10:00:00Z")),
            ms("2026-12-01T20:30:00+09:00")
        );
        // Ready after send_at but inside the window: the window's end.
        assert_eq!(
            w.release_at(ms("2026-12-01T21:15:00+09:00")),
            ms("2026-12-02T08:00:00+09:00")
        );
        // Ready after both: at once.
        let late = ms("2026-12-02T09:00:00+09:00");
        assert_eq!(w.release_at(late), late);
        assert!(w.holds());
        assert!(!SendWindow::default().holds());
    }

    #[test]
    fn the_canonical_form_round_trips_and_equal_options_agree() {
        let a = BatchOptions {
            send_at: Some("2026-12-01T18:00:00+09:00".into()),
            priority: Some(Priority::Bulk),
            quiet_hours: Some(QuietHours {
                start: "21:00".into(),
                end: "08:00".into(),
                tz: "Asia/Seoul".into(),
            }),
        };
        let b = BatchOptions {
            send_at: Some("2026-12-01T09:00:00Z".into()),
            quiet_hours: Some(QuietHours {
                start: "21:00:00".into(),
                ..a.quiet_hours.clone().expect("set")
            }),
            ..a.clone()
        };
        let (ra, rb) = (a.resolve().expect("a"), b.resolve().expect("b"));
        assert_eq!(ra.canonical(), rb.canonical());
        assert_eq!(
            ra.canonical(),
            "1796115600000|bulk|21:00:00-08:00:00@Asia/Seoul"
        );
        assert_eq!(SendWindow::from_canonical(&ra.canonical()), Some(ra));
        assert_eq!(
            BatchOptions::default().resolve().expect("none").canonical(),
            "|normal|"
        );
        assert_eq!(
            SendWindow::from_canonical("|normal|"),
            Some(SendWindow::default())
        );
    }

    /// The claim script's arithmetic ([`hold`] on the window the worker
    /// computes) agrees with [`SendWindow::release_at`] at every quarter hour
    /// of two days around each daylight-saving change, in three zones, for
    /// windows across midnight and within a day, with and without `send_at`.
    #[test]
    fn the_scripts_hold_agrees_with_the_release_instant() {
        let mut checked = 0;
        for (tz, days) in [
            ("Asia/Seoul", "2026-12-01T00:00:00Z"),
            ("America/New_York", "2026-03-07T00:00:00Z"),
            ("America/New_York", "2026-10-31T00:00:00Z"),
            ("America/Los_Angeles", "2026-03-07T12:00:00Z"),
            ("Europe/London", "2026-10-24T06:00:00Z"),
        ] {
            for (start, end) in [("21:00", "08:00"), ("12:00", "13:30"), ("07:00", "23:00")] {
                for send_at in [None, Some(ts(days) + jiff::SignedDuration::from_hours(30))] {
                    let w = SendWindow {
                        send_at: send_at.map(|t: Timestamp| t.as_millisecond()),
                        priority: Priority::Normal,
                        quiet: Some(quiet(start, end, tz)),
                    };
                    let base = ts(days);
                    for k in 0..(4 * 60) {
                        let t = base + jiff::SignedDuration::from_mins(15 * k);
                        let now = t.as_millisecond();
                        let release = w.release_at(now) as u64;
                        let now = now as u64;
                        let args = w.schedule_args(now);
                        match hold(now, 2_000, &args) {
                            HoldDecision::Free { until } => {
                                assert_eq!(release, now, "{tz} {start}-{end} at {t}");
                                assert!(until > now && until <= now + 2_000);
                            }
                            HoldDecision::Held { at, .. } => {
                                assert_eq!(at, release, "{tz} {start}-{end} at {t}")
                            }
                            HoldDecision::Stale => panic!("stale at the instant computed for"),
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 5_000);
    }

    #[test]
    fn a_claims_lifetime_ends_where_quiet_hours_begin_and_stale_windows_are_refused() {
        let args = ScheduleArgs {
            send_at: None,
            quiet: Some((1_000, 5_000, 9_000)),
        };
        assert_eq!(
            hold(1_000, 2_000, &args),
            HoldDecision::Free { until: 3_000 }
        );
        assert_eq!(
            hold(4_000, 2_000, &args),
            HoldDecision::Free { until: 5_000 }
        );
        assert_eq!(
            hold(5_000, 2_000, &args),
            HoldDecision::Held {
                at: 9_000,
                reason: "quiet_hours"
            }
        );
        assert_eq!(hold(9_000, 2_000, &args), HoldDecision::Stale);
        assert_eq!(hold(999, 2_000, &args), HoldDecision::Stale);
        let at = ScheduleArgs {
            send_at: Some(3_000),
            quiet: Some((3_000, 5_000, 9_000)),
        };
        assert_eq!(
            hold(1_000, 2_000, &at),
            HoldDecision::Held {
                at: 3_000,
                reason: "send_at"
            }
        );
        assert_eq!(hold(3_500, 2_000, &at), HoldDecision::Free { until: 5_000 });
        let inside = ScheduleArgs {
            send_at: Some(6_000),
            quiet: Some((6_000, 5_000, 9_000)),
        };
        assert_eq!(
            hold(1_000, 2_000, &inside),
            HoldDecision::Held {
                at: 9_000,
                reason: "quiet_hours"
            }
        );
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let bad = |o: BatchOptions| o.resolve().expect_err("refused").to_string();
        assert!(bad(BatchOptions {
            send_at: Some("tomorrow 6pm".into()),
            ..Default::default()
        })
        .contains("RFC 3339"));
        let q = |start: &str, end: &str, tz: &str| BatchOptions {
            quiet_hours: Some(QuietHours {
                start: start.into(),
                end: end.into(),
                tz: tz.into(),
            }),
            ..Default::default()
        };
        assert!(bad(q("25:00", "08:00", "UTC")).contains("start"));
        assert!(bad(q("21:00", "8:00", "UTC")).contains("end"));
        assert!(bad(q("21:00", "08:00", "Mars/Olympus")).contains("IANA"));
        assert!(bad(q("08:00", "08:00", "UTC")).contains("empty"));
    }

    /// The options as `audit` and `status` print them: the send time in
    /// the quiet hours' zone with its offset (else UTC), the window as
    /// written; the canonical form in the issue read
    /// `1796359239000|normal|`.
    #[test]
    fn options_read_as_people_write_them() {
        let seoul = SendWindow::from_canonical("1796115600000|bulk|21:00:00-08:00:00@Asia/Seoul")
            .expect("canonical");
        assert_eq!(
            seoul.describe(),
            "priority bulk, send at 2026-12-01 18:00 +09:00, quiet hours 21:00-08:00 Asia/Seoul"
        );
        assert_eq!(
            SendWindow::describe_canonical("1796359239000|normal|"),
            "priority normal, send at 2026-12-04 04:40:39 +00:00, no quiet hours"
        );
        assert_eq!(
            SendWindow::describe_canonical("|urgent|21:30:15-06:00:00@UTC"),
            "priority urgent, send once ready, quiet hours 21:30:15-06:00 UTC"
        );
        assert_eq!(SendWindow::describe_canonical("not|a form"), "not|a form");
    }
}
