//! The batch options from the flags (`--send-at`, `--priority`,
//! `--quiet-hours`, `--timezone`), and `--send-at`'s bounds on the clock the
//! workers keep.

use std::time::Duration;

use super::{usage, SubmitArgs};
use crate::cli::CliError;
use crate::events::options::{
    deployment_zone_name, AdOptions, BatchOptions, Priority, QuietHours, TIMEZONE_ENV,
};

/// The batch options from the flags, checked.
pub fn batch_options(args: &SubmitArgs) -> Result<BatchOptions, CliError> {
    options_from(&OptionsGiven {
        send_at: args.send_at.as_deref(),
        priority: args.priority.as_deref(),
        quiet_hours: args.quiet_hours.as_deref(),
        timezone: args.timezone.as_deref(),
        ad: args.ad,
    })
}

/// The batch options as a person gives them, to `submit`'s flags or to
/// `groupcast serve`'s `POST /v1/batches`: the same words, the same checks.
#[derive(Debug, Default, Clone, Copy)]
pub struct OptionsGiven<'a> {
    /// `--send-at`: RFC 3339 with an offset.
    pub send_at: Option<&'a str>,
    /// `--priority`: `urgent`, `normal` or `bulk`.
    pub priority: Option<&'a str>,
    /// `--quiet-hours`: `HH:MM-HH:MM`.
    pub quiet_hours: Option<&'a str>,
    /// `--timezone`: the IANA zone of the quiet hours.
    pub timezone: Option<&'a str>,
    /// `--ad`: an advertising batch.
    pub ad: bool,
}

/// The batch options from what was given, checked (a usage error says
/// what is wrong and what to do).
pub fn options_from(given: &OptionsGiven<'_>) -> Result<BatchOptions, CliError> {
    let quiet_hours = match (given.quiet_hours, given.timezone) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(usage(
                "--timezone is the zone of --quiet-hours: give --quiet-hours too".into(),
            ))
        }
        (Some(window), tz) => {
            let Some((start, end)) = window.split_once('-') else {
                return Err(usage(format!(
                    "--quiet-hours {window:?}: expected HH:MM-HH:MM, e.g. 21:00-08:00"
                )));
            };
            Some(QuietHours {
                start: start.trim().into(),
                end: end.trim().into(),
                tz: quiet_hours_zone(tz, deployment_zone_name(), machine_zone())?,
            })
        }
    };
    let priority = match given.priority {
        None => None,
        Some(p) => Some(
            Priority::parse(p)
                .ok_or_else(|| usage(format!("--priority {p:?}: one of urgent, normal, bulk")))?,
        ),
    };
    let options = BatchOptions {
        send_at: given.send_at.map(str::to_string),
        priority,
        quiet_hours,
        ad: given.ad.then(AdOptions::default),
    };
    options.resolve().map_err(|e| usage(e.to_string()))?;
    Ok(options)
}

/// The machine's zone, when it has an IANA name.
fn machine_zone() -> Option<String> {
    jiff::tz::TimeZone::system().iana_name().map(str::to_string)
}

/// Whether `name` is a zone on UTC in winter and in summer (`UTC`,
/// `Etc/UTC`, `GMT`, ...; not `Europe/London`): what a container's clock
/// says when nobody chose a zone. (A zone from the database is not a
/// "fixed offset" to jiff even when it never changes: two readings tell.)
fn is_utc(name: &str) -> bool {
    let Ok(tz) = jiff::tz::TimeZone::get(name) else {
        return false;
    };
    [
        jiff::Timestamp::UNIX_EPOCH,
        jiff::Timestamp::from_second(15_638_400).unwrap_or_default(),
    ]
    .into_iter()
    .chain([jiff::Timestamp::now()])
    .all(|t| tz.to_offset(t) == jiff::tz::Offset::UTC)
}

/// The zone of `--quiet-hours`: `--timezone`, else the deployment's
/// (`GROUPCAST_TIMEZONE`), else the machine's when it is not UTC. A
/// machine on UTC (every container) says nothing of where the recipients
/// sleep: refused, with how to give the zone. UTC given by the flag or the
/// variable is a choice, and taken.
fn quiet_hours_zone(
    flag: Option<&str>,
    deployment: Option<String>,
    machine: Option<String>,
) -> Result<String, CliError> {
    if let Some(tz) = flag {
        return Ok(tz.to_string());
    }
    if let Some(tz) = deployment {
        if jiff::tz::TimeZone::get(&tz).is_err() {
            return Err(usage(format!(
                "{TIMEZONE_ENV}={tz:?} is not a known IANA time zone: set it to one like Asia/Seoul, or pass --timezone"
            )));
        }
        return Ok(tz);
    }
    match machine {
        Some(tz) if !is_utc(&tz) => Ok(tz),
        _ => Err(usage(format!(
            "--quiet-hours: no time zone given, and this machine's clock is on UTC (as containers' are), so 21:00 would be 21:00 UTC: \
             pass --timezone (e.g. --timezone Asia/Seoul), or set {TIMEZONE_ENV}=Asia/Seoul for the deployment (--timezone UTC if UTC is meant)"
        ))),
    }
}

/// How far in the past `--send-at` may be: a time typed a moment ago, or
/// "now" from a script, still goes (at once).
pub const SEND_AT_GRACE: Duration = Duration::from_secs(5 * 60);
/// How far ahead `--send-at` may be: beyond it a typo (2099 for 2026) is
/// far likelier than a plan, and the batch would hold its work that long.
pub const SEND_AT_HORIZON: Duration = Duration::from_secs(90 * 24 * 3600);

/// Checks `--send-at` (`send_at_ms`, Unix ms) against the clock reading
/// `now_ms`: at most [`SEND_AT_GRACE`] in the past and [`SEND_AT_HORIZON`]
/// ahead. The error says which bound and what to do.
pub fn check_send_at(send_at_ms: i64, now_ms: i64) -> Result<(), String> {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let now = jiff::Timestamp::from_millisecond(now_ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{now_ms} ms"));
    if send_at_ms < now_ms.saturating_sub(ms(SEND_AT_GRACE)) {
        return Err(format!(
            "is in the past (now is {now} on the Redis server's clock), more than the 5 minutes allowed: \
             give a time to come, or leave --send-at out to send at once"
        ));
    }
    if send_at_ms > now_ms.saturating_add(ms(SEND_AT_HORIZON)) {
        return Err(format!(
            "is more than 90 days ahead (now is {now} on the Redis server's clock), the furthest allowed: \
             check the date (the year?), or submit the batch closer to its time"
        ));
    }
    Ok(())
}

/// Refuses a `--send-at` out of [`check_send_at`]'s bounds, on the clock
/// the workers hold the batch by: the Redis server's of its shard.
pub(crate) async fn refuse_a_far_send_at(
    store: &crate::store::Store,
    shard: u32,
    options: &BatchOptions,
) -> Result<(), CliError> {
    let (Some(text), Ok(window)) = (&options.send_at, options.resolve()) else {
        return Ok(());
    };
    let Some(at) = window.send_at else {
        return Ok(());
    };
    let now = store.shard_time_ms(shard).await?;
    check_send_at(at, i64::try_from(now).unwrap_or(i64::MAX))
        .map_err(|why| usage(format!("--send-at {text} {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_hours_take_the_flag_then_the_deployment_then_a_machine_not_on_utc() {
        let seoul = || Some("Asia/Seoul".to_string());
        let utc = || Some("Etc/UTC".to_string());
        let zone = |flag, deployment, machine| {
            quiet_hours_zone(flag, deployment, machine).map_err(|e| e.to_string())
        };
        assert_eq!(zone(Some("UTC"), seoul(), seoul()), Ok("UTC".into()));
        assert_eq!(zone(None, seoul(), utc()), Ok("Asia/Seoul".into()));
        assert_eq!(zone(None, None, seoul()), Ok("Asia/Seoul".into()));
        assert_eq!(
            zone(None, None, Some("Europe/London".into())),
            Ok("Europe/London".into())
        );
        for machine in [utc(), Some("UTC".into()), Some("GMT".into()), None] {
            let refused = zone(None, None, machine).expect_err("no zone but UTC");
            assert!(
                refused.contains("--timezone") && refused.contains("GROUPCAST_TIMEZONE"),
                "{refused}"
            );
        }
        let bad = zone(None, Some("Seoul".into()), seoul()).expect_err("unknown zone");
        assert!(bad.contains("GROUPCAST_TIMEZONE=\"Seoul\""), "{bad}");
    }

    #[test]
    fn send_at_is_bounded_by_a_grace_behind_and_a_horizon_ahead() {
        let now = 1_796_000_000_000i64;
        let minute = 60_000;
        let day = 24 * 60 * minute;
        for ok in [now, now - 5 * minute, now + 90 * day, now + minute] {
            assert_eq!(check_send_at(ok, now), Ok(()), "{}", ok - now);
        }
        let past = check_send_at(now - 5 * minute - 1, now).expect_err("past");
        assert!(
            past.contains("in the past") && past.contains("5 minutes"),
            "{past}"
        );
        assert!(past.contains("now is 2026-"), "{past}");
        let far = check_send_at(now + 90 * day + 1, now).expect_err("far");
        assert!(far.contains("more than 90 days ahead"), "{far}");
    }
}
