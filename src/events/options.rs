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
    /// An advertising batch (Korean law, see `docs/advertising.md`): its text
    /// starts with `(광고)` and carries a free opt-out line, and it is held
    /// by [`NIGHT_RULE`] unless its recipients gave night-time consent.
    /// Absent (older chunks): not advertising.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ad: Option<AdOptions>,
}

/// The options of an advertising batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct AdOptions {
    /// Every recipient of this batch gave separate consent to advertising at
    /// night: [`NIGHT_RULE`] does not hold it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub night_consent: bool,
    /// The batch holding the other recipients of the same submission (the
    /// ones with the other consent), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<String>,
}

/// The night-time advertising rule: no advertising message between 21:00
/// and 08:00 in Korea, except to recipients with separate night consent.
pub const NIGHT_RULE: (&str, &str, &str) = ("21:00", "08:00", "Asia/Seoul");

/// The zone of a deployment, for quiet hours without `--timezone` and for
/// the times shown of batches without a zone of their own.
pub(crate) const TIMEZONE_ENV: &str = "GROUPCAST_TIMEZONE";

/// The deployment's zone ([`TIMEZONE_ENV`]), when set (empty: unset).
pub(crate) fn deployment_zone_name() -> Option<String> {
    std::env::var(TIMEZONE_ENV)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The zone times are shown in when a batch has none: the deployment's
/// (when it names a known zone), else UTC.
pub(crate) fn deployment_zone() -> TimeZone {
    deployment_zone_name()
        .and_then(|name| TimeZone::get(&name).ok())
        .unwrap_or(TimeZone::UTC)
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
    /// The pair of an advertising batch is not a batch id.
    #[error("ad pair {0:?} is not a batch id (letters, digits, '.', '_', '-')")]
    Pair(String),
}

impl BatchOptions {
    /// Whether no option is set (the chunk encodes no `options`).
    pub fn is_empty(&self) -> bool {
        self.send_at.is_none()
            && self.priority.is_none()
            && self.quiet_hours.is_none()
            && self.ad.is_none()
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
        let ad = match &self.ad {
            None => None,
            Some(a) => {
                if let Some(pair) = &a.pair {
                    crate::batch_id::validate_batch_id(pair)
                        .map_err(|_| OptionsError::Pair(crate::events::clip(pair, 64)))?;
                }
                Some(Ad {
                    night_consent: a.night_consent,
                    pair: a.pair.clone(),
                })
            }
        };
        Ok(SendWindow {
            send_at,
            priority: self.priority(),
            quiet,
            ad,
        })
    }
}

/// An advertising batch's rule, resolved (see [`AdOptions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ad {
    /// Exempt from [`NIGHT_RULE`]: every recipient consented to night sends.
    pub night_consent: bool,
    /// The other batch of the same submission.
    pub pair: Option<String>,
}

impl Ad {
    /// As a person reads it: `advertising, held 21:00-08:00 Asia/Seoul
    /// (night rule), paired with spring.night-consent`.
    pub fn describe(&self) -> String {
        let (start, end, tz) = NIGHT_RULE;
        let mut s = if self.night_consent {
            "advertising, recipients with night-time consent (not held at night)".to_string()
        } else {
            format!("advertising, held {start}-{end} {tz} (night rule)")
        };
        if let Some(pair) = &self.pair {
            s.push_str(", paired with batch ");
            s.push_str(pair);
        }
        s
    }

    /// `ad`, `,night-consent` when exempt, `,pair=<id>` when paired.
    fn canonical(&self) -> String {
        let mut s = String::from("ad");
        if self.night_consent {
            s.push_str(",night-consent");
        }
        if let Some(pair) = &self.pair {
            s.push_str(",pair=");
            s.push_str(pair);
        }
        s
    }

    fn from_canonical(s: &str) -> Option<Ad> {
        let mut parts = s.split(',');
        if parts.next()? != "ad" {
            return None;
        }
        let mut ad = Ad {
            night_consent: false,
            pair: None,
        };
        for part in parts {
            match part.split_once('=') {
                None if part == "night-consent" => ad.night_consent = true,
                Some(("pair", id)) if crate::batch_id::validate_batch_id(id).is_ok() => {
                    ad.pair = Some(id.to_string())
                }
                _ => return None,
            }
        }
        Some(ad)
    }
}

/// What an advertising text must carry: how it begins.
pub(crate) const AD_PREFIX: &str = "(광고)";

/// Why an advertising batch's text was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AdTextError {
    /// The text does not begin with `(광고)`.
    #[error("an advertising message (--ad) must begin with (광고): put (광고) at the very start of the template's text")]
    NoPrefix,
    /// No line with a free opt-out and its number.
    #[error("an advertising message (--ad) must carry a free opt-out line, e.g. `무료수신거부 080-123-4567` (the words 무료수신거부 or 무료거부, and a number of at least 8 digits, on one line, written out in the text, not in a #{{variable}})")]
    NoOptOut,
}

/// Checks an advertising text: it begins with [`AD_PREFIX`] (blanks before
/// it allowed), and some line of it has the words `무료수신거부` or
/// `무료거부` (spaces inside them allowed: `무료 수신거부`) and a number of
/// at least 8 digits (`-`, `.`, spaces and parentheses between them
/// allowed): `무료수신거부 080-123-4567`, `무료거부 0801234567`.
pub(crate) fn check_ad_text(text: &str) -> Result<(), AdTextError> {
    if !text.trim_start().starts_with(AD_PREFIX) {
        return Err(AdTextError::NoPrefix);
    }
    if text.lines().any(is_opt_out_line) {
        Ok(())
    } else {
        Err(AdTextError::NoOptOut)
    }
}

/// A line with the opt-out words and a number of at least 8 digits.
fn is_opt_out_line(line: &str) -> bool {
    let words: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    if !(words.contains("무료수신거부") || words.contains("무료거부")) {
        return false;
    }
    // The longest run of digits, separators allowed inside it.
    let (mut longest, mut run) = (0, 0);
    for c in line.chars() {
        if c.is_ascii_digit() {
            run += 1;
            longest = longest.max(run);
        } else if !matches!(c, '-' | '.' | ' ' | '(' | ')') {
            run = 0;
        }
    }
    longest >= 8
}

/// [`NIGHT_RULE`] as a window.
fn night_rule() -> Option<Quiet> {
    let (start, end, tz) = NIGHT_RULE;
    Quiet::parse(&QuietHours {
        start: start.into(),
        end: end.into(),
        tz: tz.into(),
    })
    .ok()
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
    pub(crate) fn window_at(&self, t: Timestamp) -> Option<(Timestamp, Timestamp)> {
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
    /// The advertising rule, for an advertising batch.
    pub ad: Option<Ad>,
}

impl Default for SendWindow {
    fn default() -> Self {
        SendWindow {
            send_at: None,
            priority: Priority::Normal,
            quiet: None,
            ad: None,
        }
    }
}

impl SendWindow {
    /// The form the batch's state keeps (field `opts`) and the accept script
    /// compares: `<send_at ms>|<priority>|<quiet hours>`, empty parts when
    /// unset, then `|<ad rule>` for an advertising batch only (so the form
    /// of every other batch is the one older states keep). Two chunks agree
    /// on their options when these are equal (so `21:00` and `21:00:00`, or
    /// two spellings of one instant, agree).
    pub fn canonical(&self) -> String {
        let mut s = format!(
            "{}|{}|{}",
            self.send_at.map(|ms| ms.to_string()).unwrap_or_default(),
            self.priority.name(),
            self.quiet
                .as_ref()
                .map(Quiet::canonical)
                .unwrap_or_default()
        );
        if let Some(ad) = &self.ad {
            s.push('|');
            s.push_str(&ad.canonical());
        }
        s
    }

    /// Reads [`SendWindow::canonical`] back (None: not that form).
    pub fn from_canonical(s: &str) -> Option<SendWindow> {
        let mut parts = s.splitn(4, '|');
        let (at, priority, quiet) = (parts.next()?, parts.next()?, parts.next()?);
        let ad = match parts.next() {
            None => None,
            Some(ad) => Some(Ad::from_canonical(ad)?),
        };
        Some(SendWindow {
            ad,
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

    /// Whether anything holds the send (a `send_at`, quiet hours or the
    /// night rule).
    pub fn holds(&self) -> bool {
        self.send_at.is_some() || self.has_quiet()
    }

    /// Whether the night-time advertising rule ([`NIGHT_RULE`]) holds this
    /// batch: an advertising batch without night consent.
    pub fn night_rule_applies(&self) -> bool {
        self.ad.as_ref().is_some_and(|a| !a.night_consent)
    }

    /// Whether some daily window holds the send: quiet hours, or the night
    /// rule.
    pub(crate) fn has_quiet(&self) -> bool {
        self.quiet.is_some() || self.night_rule_applies()
    }

    /// Every daily window the send must stay out of: the quiet hours, and
    /// [`NIGHT_RULE`] when it applies. The claim is given their union.
    fn windows(&self) -> Vec<Quiet> {
        let night = if self.night_rule_applies() {
            night_rule()
        } else {
            None
        };
        self.quiet.iter().cloned().chain(night).collect()
    }

    /// The union of [`SendWindow::windows`] containing `t`, or the next to
    /// open after it: `(opens, closes)`. Windows that overlap or touch are
    /// one: the send is held across both.
    fn window_at(&self, t: Timestamp) -> Option<(Timestamp, Timestamp)> {
        let windows = self.windows();
        let (opens, mut closes) = windows
            .iter()
            .filter_map(|q| q.window_at(t))
            .min_by_key(|(opens, _)| *opens)?;
        // Two daily windows chain at most a few times a day; the bound is
        // a guard, not a limit ever reached.
        for _ in 0..8 {
            let longer = windows
                .iter()
                .filter_map(|q| q.window_at(closes))
                .filter(|(o, c)| *o <= closes && *c > closes)
                .map(|(_, c)| c)
                .max();
            match longer {
                Some(c) => closes = c,
                None => break,
            }
        }
        Some((opens, closes))
    }

    /// Whether a send held until `at_ms` was held by the night rule: `at_ms`
    /// ends a window it was held in (not a `send_at`), and that window
    /// covers Korean night hours (alone, or joined to quiet hours).
    pub(crate) fn held_by_night_rule(&self, at_ms: i64) -> bool {
        let Some(night) = night_rule().filter(|_| self.night_rule_applies()) else {
            return false;
        };
        let Ok(before) = Timestamp::from_millisecond(at_ms.saturating_sub(1)) else {
            return false;
        };
        match self.window_at(before) {
            Some((opens, closes)) if opens <= before && closes.as_millisecond() == at_ms => {
                night.window_at(opens).is_some_and(|(o, _)| o < closes)
            }
            _ => false,
        }
    }

    /// When a generation ready at `now_ms` may be sent (Unix ms): not before
    /// `send_at`, and never inside quiet hours (or, for an advertising batch
    /// without night consent, inside [`NIGHT_RULE`]). A generation ready
    /// after `send_at` goes at once (outside those windows).
    pub fn release_at(&self, now_ms: i64) -> i64 {
        let due = self.send_at.map_or(now_ms, |at| at.max(now_ms));
        let Ok(t) = Timestamp::from_millisecond(due) else {
            return due;
        };
        match self.window_at(t) {
            Some((opens, closes)) if opens <= t => closes.as_millisecond(),
            _ => due,
        }
    }

    /// What the claim script is told of this schedule, computed from the
    /// Redis clock reading `now_ms` (see [`ScheduleArgs`]): one window, the
    /// union of the quiet hours and the night rule, so the claim's own
    /// arithmetic enforces both.
    pub fn schedule_args(&self, now_ms: u64) -> ScheduleArgs {
        let send_at = self.send_at.map(|v| u64::try_from(v).unwrap_or(0));
        let from = send_at.map_or(now_ms, |s| s.max(now_ms));
        let quiet = Timestamp::from_millisecond(i64::try_from(from).unwrap_or(i64::MAX))
            .ok()
            .and_then(|t| self.window_at(t))
            .map(|(opens, closes)| {
                let ms = |x: Timestamp| u64::try_from(x.as_millisecond()).unwrap_or(0);
                (from, ms(opens), ms(closes))
            });
        ScheduleArgs { send_at, quiet }
    }

    /// `send_at` as RFC 3339 (UTC), for reports.
    pub(crate) fn send_at_text(&self) -> Option<String> {
        self.send_at
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(|t| t.to_string())
    }

    /// The zone a person reads this batch's times in: its quiet hours' zone
    /// when it has one (the zone its operator thinks in), Korea's for an
    /// advertising batch, else the deployment's ([`deployment_zone`]).
    pub fn zone(&self) -> TimeZone {
        match (&self.quiet, &self.ad) {
            (Some(q), _) => q.zone().clone(),
            (None, Some(_)) => TimeZone::get(NIGHT_RULE.2).unwrap_or(TimeZone::UTC),
            (None, None) => deployment_zone(),
        }
    }

    /// The instant `ms` as a time with its offset in [`SendWindow::zone`]
    /// (`2026-12-01 18:00 +09:00`); the bare number if not an instant.
    pub(crate) fn time_text(&self, ms: i64) -> String {
        crate::human::time_in(ms, &self.zone()).unwrap_or_else(|| ms.to_string())
    }

    /// The options as a person reads them:
    /// `priority normal, send at 2026-12-01 18:00 +09:00, quiet hours
    /// 21:00-08:00 Asia/Seoul`; `send once ready` and `no quiet hours`
    /// when unset; then the advertising rule, for an advertising batch.
    pub fn describe(&self) -> String {
        let mut s = self.describe_schedule();
        if let Some(ad) = &self.ad {
            s.push_str(", ");
            s.push_str(&ad.describe());
        }
        s
    }

    fn describe_schedule(&self) -> String {
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
    pub(crate) fn describe_canonical(canonical: &str) -> String {
        SendWindow::from_canonical(canonical)
            .map_or_else(|| canonical.to_string(), |w| w.describe())
    }

    /// The quiet hours as `HH:MM:SS-HH:MM:SS@Zone`, for reports.
    pub(crate) fn quiet_text(&self) -> Option<String> {
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
            ad: None,
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
            ad: None,
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
                        ad: None,
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

    fn ad(night_consent: bool) -> Option<Ad> {
        Some(Ad {
            night_consent,
            pair: None,
        })
    }

    /// The night rule at the instants: an advertising batch at
    /// 20:59:30 KST may start its send until 21:00 (the claim's lifetime is
    /// cut there), is held from 21:00 to 08:00 KST, and a batch whose
    /// recipients consented to night sends is not held at all.
    #[test]
    fn the_night_rule_holds_an_advertising_batch_from_21_to_08_in_seoul() {
        let ms = |s: &str| ts(s).as_millisecond() as u64;
        let held = SendWindow {
            ad: ad(false),
            ..SendWindow::default()
        };
        let consent = SendWindow {
            ad: ad(true),
            ..SendWindow::default()
        };
        assert!(held.holds() && held.has_quiet() && held.night_rule_applies());
        assert!(!consent.holds() && !consent.night_rule_applies());
        let before = ms("2026-12-01T20:59:30+09:00");
        assert_eq!(
            hold(before, 60_000, &held.schedule_args(before)),
            HoldDecision::Free {
                until: ms("2026-12-01T21:00:00+09:00")
            }
        );
        assert_eq!(
            hold(before, 60_000, &consent.schedule_args(before)),
            HoldDecision::Free {
                until: before + 60_000
            }
        );
        let morning = ms("2026-12-02T08:00:00+09:00");
        for inside in ["2026-12-01T21:00:00+09:00", "2026-12-02T03:00:00+09:00"] {
            let now = ms(inside);
            assert_eq!(
                hold(now, 60_000, &held.schedule_args(now)),
                HoldDecision::Held {
                    at: morning,
                    reason: "quiet_hours"
                },
                "{inside}"
            );
            assert_eq!(held.release_at(now as i64), morning as i64);
            assert!(matches!(
                hold(now, 60_000, &consent.schedule_args(now)),
                HoldDecision::Free { .. }
            ));
        }
        assert_eq!(held.release_at(morning as i64), morning as i64);
        // The machine's zone plays no part: the rule is Seoul's.
        assert_eq!(held.zone().iana_name(), Some("Asia/Seoul"));
    }

    /// The night rule and a batch's own quiet hours (in any zone) are one
    /// window for the claim: the script's decision agrees with the release
    /// instant at every quarter hour of three days, and no send is ever
    /// free inside 21:00-08:00 KST or inside the quiet hours.
    #[test]
    fn the_night_rule_and_quiet_hours_compose_into_the_claims_window() {
        let night = night_rule().expect("the night rule");
        let mut checked = 0;
        for (start, end, tz) in [
            ("22:00", "09:00", "Asia/Seoul"),
            ("12:00", "13:00", "UTC"),
            ("07:00", "07:30", "Asia/Seoul"),
            ("13:00", "14:00", "Asia/Seoul"),
            ("08:00", "09:00", "Asia/Seoul"),
            ("21:00", "08:00", "America/New_York"),
        ] {
            let q = quiet(start, end, tz);
            let w = SendWindow {
                quiet: Some(q.clone()),
                ad: ad(false),
                ..SendWindow::default()
            };
            let base = ts("2026-12-01T00:00:00Z");
            for k in 0..(3 * 24 * 4) {
                let t = base + jiff::SignedDuration::from_mins(15 * k);
                let now = t.as_millisecond() as u64;
                let release = w.release_at(now as i64) as u64;
                let inside = |x: Timestamp| night.release_at(x) != x || q.release_at(x) != x;
                match hold(now, 2_000, &w.schedule_args(now)) {
                    HoldDecision::Free { until } => {
                        assert_eq!(release, now, "{start}-{end} {tz} at {t}");
                        assert!(
                            !inside(t),
                            "free inside a window: {start}-{end} {tz} at {t}"
                        );
                        assert!(until > now && until <= now + 2_000);
                    }
                    HoldDecision::Held { at, .. } => {
                        assert_eq!(at, release, "{start}-{end} {tz} at {t}");
                        assert!(inside(t), "held outside the windows at {t}");
                        let at = Timestamp::from_millisecond(at as i64).expect("instant");
                        assert!(!inside(at), "released inside a window: {at}");
                    }
                    HoldDecision::Stale => panic!("stale at the instant computed for"),
                }
                checked += 1;
            }
        }
        assert!(checked > 1_500);
    }

    /// The report's `held_for_night`: a hold that ends a Korean night (alone
    /// or joined to quiet hours) counts; a hold by quiet hours in the day,
    /// by `send_at`, or of a batch the rule does not hold, does not.
    #[test]
    fn a_hold_is_counted_for_the_night_rule_only_when_the_night_held_it() {
        let ms = |s: &str| ts(s).as_millisecond();
        let held = SendWindow {
            quiet: Some(quiet("12:00", "13:00", "Asia/Seoul")),
            ad: ad(false),
            ..SendWindow::default()
        };
        assert!(held.held_by_night_rule(ms("2026-12-02T08:00:00+09:00")));
        assert!(!held.held_by_night_rule(ms("2026-12-02T13:00:00+09:00")));
        assert!(!held.held_by_night_rule(ms("2026-12-02T10:00:00+09:00")));
        let joined = SendWindow {
            quiet: Some(quiet("07:00", "09:00", "Asia/Seoul")),
            ad: ad(false),
            ..SendWindow::default()
        };
        assert!(joined.held_by_night_rule(ms("2026-12-02T09:00:00+09:00")));
        for exempt in [ad(true), None] {
            let w = SendWindow {
                quiet: Some(quiet("21:00", "08:00", "Asia/Seoul")),
                ad: exempt,
                ..SendWindow::default()
            };
            assert!(!w.held_by_night_rule(ms("2026-12-02T08:00:00+09:00")));
        }
    }

    #[test]
    fn an_advertising_batchs_options_round_trip_and_read_as_people_write_them() {
        let w = BatchOptions {
            ad: Some(AdOptions {
                night_consent: false,
                pair: Some("spring.night-consent".into()),
            }),
            ..BatchOptions::default()
        }
        .resolve()
        .expect("valid");
        assert_eq!(w.canonical(), "|normal||ad,pair=spring.night-consent");
        assert_eq!(SendWindow::from_canonical(&w.canonical()), Some(w.clone()));
        assert_eq!(
            w.describe(),
            "priority normal, send once ready, no quiet hours, advertising, held 21:00-08:00 Asia/Seoul (night rule), paired with batch spring.night-consent"
        );
        let c = SendWindow {
            ad: ad(true),
            ..SendWindow::default()
        };
        assert_eq!(c.canonical(), "|normal||ad,night-consent");
        assert_eq!(SendWindow::from_canonical(&c.canonical()), Some(c));
        assert_eq!(SendWindow::from_canonical("|normal||ad,later"), None);
        let bad_pair = BatchOptions {
            ad: Some(AdOptions {
                night_consent: false,
                pair: Some("a|b".into()),
            }),
            ..BatchOptions::default()
        };
        assert!(matches!(bad_pair.resolve(), Err(OptionsError::Pair(_))));
    }

    #[test]
    fn an_advertising_text_needs_the_prefix_and_a_free_opt_out_line() {
        for ok in [
            "(광고) 봄 세일 20%\n무료수신거부 080-123-4567",
            "  (광고)#{name}님\n\n무료거부 0801234567",
            "(광고) 세일\n무료 수신거부: 080.123.4567",
            "(광고) 세일\n[무료수신거부] (080) 1234-5678",
        ] {
            assert_eq!(check_ad_text(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("봄 세일\n무료수신거부 080-123-4567", AdTextError::NoPrefix),
            (
                "세일 (광고)\n무료수신거부 080-123-4567",
                AdTextError::NoPrefix,
            ),
            ("(광고) 봄 세일", AdTextError::NoOptOut),
            (
                "(광고) 봄 세일\n수신거부 080-123-4567",
                AdTextError::NoOptOut,
            ),
            (
                "(광고) 봄 세일\n무료수신거부 #{optout}",
                AdTextError::NoOptOut,
            ),
            (
                "(광고) 세일\n무료수신거부\n080-123-4567",
                AdTextError::NoOptOut,
            ),
        ] {
            assert_eq!(check_ad_text(bad), Err(why), "{bad}");
        }
        assert!(AdTextError::NoPrefix.to_string().contains("(광고)"));
        assert!(AdTextError::NoOptOut.to_string().contains("무료수신거부"));
    }
}
