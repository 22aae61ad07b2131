//! The retry budget: a work item retries transient trouble for a *time*
//! (`--retry-for`, `--report-retry-for`), not a number of attempts, so that
//! a provider outage or a webhook deploy shorter than that costs nothing but
//! the wait. The budget is measured from a moment carried in the item
//! ([`WorkItem::since`]) by the clock of the Redis server holding the shard,
//! so it survives worker restarts and does not depend on any worker's clock.

use std::time::Duration;

use crate::worker::ops::{Op, RetryCause, WorkItem};
use crate::worker::WorkerConfig;

/// What to do with an item that asked to be retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Put it back after this delay.
    Retry(Duration),
    /// Its budget is spent: dead-letter it with this reason.
    GiveUp(String),
}

/// Whether [`decide`] needs the current time for this cause (one Redis
/// round trip; only trouble that spends the budget asks for it).
pub(crate) fn needs_clock(cause: RetryCause) -> bool {
    cause.spends_budget()
}

/// How long `op` may retry.
pub(crate) fn budget(config: &WorkerConfig, op: Op) -> Duration {
    if matches!(op, Op::Report | Op::DeliveryReport) {
        config.report_retry_for
    } else {
        config.retry_for
    }
}

/// Decides the retry of `item` (updating its attempt count and budget
/// start; for a poll of a group still sending, its next delay, see
/// [`WorkerConfig::next_poll`]). `delay` is a delay the cause fixed
/// (Retry-After), `spend` whether this try counts as an attempt, `now` the shard
/// server's clock in ms (needed when [`needs_clock`]; otherwise ignored).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide(
    config: &WorkerConfig,
    op: Op,
    item: &mut WorkItem,
    delay: Option<Duration>,
    spend: bool,
    cause: RetryCause,
    reason: &str,
    now: Option<u64>,
) -> Decision {
    if spend {
        item.attempt = item.attempt.saturating_add(1);
    }
    let mut delay = delay;
    if cause == RetryCause::NotFinished {
        // The provider answered: a poll's budget starts over, so polling a
        // sent group never gives up while the provider answers at all.
        item.since = 0;
        // Still sending: read it again twice as late as last time.
        let next = config.next_poll(Duration::from_millis(item.poll_delay_ms));
        item.poll_delay_ms = next.as_millis() as u64;
        delay = Some(next);
    }
    if cause == RetryCause::AwaitingResults {
        // The provider answered: the budget starts over.
        item.since = 0;
    }
    if let (true, Some(now)) = (cause.spends_budget(), now) {
        if item.since == 0 {
            item.since = now;
        }
        let spent = Duration::from_millis(now.saturating_sub(item.since));
        let budget = budget(config, op);
        if spent >= budget {
            return Decision::GiveUp(format!(
                "gave up after retrying for {} ({} attempts; budget {}): {reason}",
                crate::human::duration(round_secs(spent)),
                item.attempt,
                crate::human::duration(budget),
            ));
        }
    }
    if spend
        && config.max_attempts > 0
        && !matches!(op, Op::Report | Op::DeliveryReport)
        && item.attempt >= config.max_attempts
    {
        return Decision::GiveUp(format!("gave up after {} attempts: {reason}", item.attempt));
    }
    Decision::Retry(delay.unwrap_or_else(|| config.backoff(item.attempt)))
}

fn round_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> WorkItem {
        WorkItem {
            batch: "b".into(),
            gen: 0,
            seq: None,
            group_id: None,
            attempt: 0,
            since: 0,
            poll_delay_ms: 0,
            cursor: None,
        }
    }

    fn config() -> WorkerConfig {
        WorkerConfig {
            retry_for: Duration::from_secs(60),
            report_retry_for: Duration::from_secs(600),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            ..WorkerConfig::default()
        }
    }

    const T0: u64 = 1_800_000_000_000;

    fn transient(c: &WorkerConfig, op: Op, it: &mut WorkItem, now: u64) -> Decision {
        decide(
            c,
            op,
            it,
            None,
            true,
            RetryCause::Transient,
            "500",
            Some(now),
        )
    }

    #[test]
    fn transient_trouble_retries_for_the_budget_in_time_not_attempts() {
        let c = config();
        let mut it = item();
        // Many attempts well inside the minute: all retried, backoff capped.
        for i in 0..100u64 {
            match transient(&c, Op::Create, &mut it, T0 + i * 500) {
                Decision::Retry(d) => assert!(d <= c.backoff_max, "{d:?}"),
                other => panic!("attempt {i}: {other:?}"),
            }
        }
        assert_eq!(it.since, T0, "the budget starts at the first failure");
        assert_eq!(it.attempt, 100);
        // At the budget's end: given up, saying why.
        match transient(&c, Op::Create, &mut it, T0 + 60_000) {
            Decision::GiveUp(r) => assert!(r.contains("1 min") && r.contains("500"), "{r}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_report_has_its_own_longer_budget() {
        let c = config();
        let mut it = item();
        assert!(matches!(
            transient(&c, Op::Report, &mut it, T0),
            Decision::Retry(_)
        ));
        assert!(matches!(
            transient(&c, Op::Report, &mut it, T0 + 599_000),
            Decision::Retry(_)
        ));
        assert!(matches!(
            transient(&c, Op::Report, &mut it, T0 + 600_000),
            Decision::GiveUp(_)
        ));
    }

    #[test]
    fn a_budget_carried_in_the_item_survives_a_restart() {
        // A fresh decision (another worker) on an item that already spent
        // most of its budget gives up on time.
        let c = config();
        let mut it = WorkItem {
            since: T0,
            attempt: 3,
            ..item()
        };
        assert!(matches!(
            transient(&c, Op::Send, &mut it, T0 + 61_000),
            Decision::GiveUp(_)
        ));
    }

    #[test]
    fn waits_of_our_own_spend_nothing_and_a_poll_answer_restarts_the_budget() {
        let c = config();
        let mut it = item();
        transient(&c, Op::Poll, &mut it, T0);
        assert_eq!(it.since, T0);
        // The provider answers "still sending": the budget starts over.
        let d = decide(
            &c,
            Op::Poll,
            &mut it,
            Some(Duration::from_millis(500)),
            false,
            RetryCause::NotFinished,
            "sending",
            None,
        );
        assert_eq!(d, Decision::Retry(Duration::from_millis(100)));
        assert_eq!(it.since, 0);
        assert!(matches!(
            transient(&c, Op::Poll, &mut it, T0 + 3_600_000),
            Decision::Retry(_)
        ));
        for cause in [RetryCause::Limiter, RetryCause::Durability] {
            assert!(!needs_clock(cause));
            let before = it.clone();
            let d = decide(
                &c,
                Op::Load,
                &mut it,
                Some(Duration::from_secs(9)),
                false,
                cause,
                "x",
                None,
            );
            assert_eq!(d, Decision::Retry(Duration::from_secs(9)));
            assert_eq!(it, before);
        }
    }

    #[test]
    fn a_group_still_sending_is_read_twice_as_late_each_time_up_to_the_interval() {
        let c = WorkerConfig {
            poll_interval: Duration::from_millis(700),
            ..config()
        };
        // The send schedules the first read; each "still sending" the next.
        let first = c.next_poll(Duration::ZERO);
        assert_eq!(first, WorkerConfig::FIRST_POLL);
        let mut it = WorkItem {
            poll_delay_ms: first.as_millis() as u64,
            ..item()
        };
        let mut waits = Vec::new();
        for _ in 0..5 {
            match decide(
                &c,
                Op::Poll,
                &mut it,
                None,
                false,
                RetryCause::NotFinished,
                "sending",
                None,
            ) {
                Decision::Retry(d) => waits.push(d.as_millis()),
                other => panic!("{other:?}"),
            }
            assert_eq!(u128::from(it.poll_delay_ms), *waits.last().unwrap_or(&0));
        }
        assert_eq!(waits, [200, 400, 700, 700, 700]);
        // An interval shorter than the first read caps it too.
        let fast = WorkerConfig {
            poll_interval: Duration::from_millis(50),
            ..config()
        };
        assert_eq!(fast.next_poll(Duration::ZERO), Duration::from_millis(50));
        // Other causes leave it alone.
        let before = it.poll_delay_ms;
        transient(&c, Op::Poll, &mut it, T0);
        assert_eq!(it.poll_delay_ms, before);
    }

    #[test]
    fn an_attempt_cap_applies_only_when_set_and_never_to_the_report() {
        let c = WorkerConfig {
            max_attempts: 2,
            ..config()
        };
        let mut it = item();
        assert!(matches!(
            transient(&c, Op::Load, &mut it, T0),
            Decision::Retry(_)
        ));
        assert!(matches!(
            transient(&c, Op::Load, &mut it, T0),
            Decision::GiveUp(_)
        ));
        let mut r = item();
        for _ in 0..5 {
            assert!(matches!(
                transient(&c, Op::Report, &mut r, T0),
                Decision::Retry(_)
            ));
        }
    }

    #[test]
    fn backoff_is_equal_jitter_capped() {
        let c = config();
        for attempt in 1..40 {
            let cap = c
                .backoff_base
                .saturating_mul(1 << (attempt - 1).min(20))
                .min(c.backoff_max);
            for _ in 0..20 {
                let d = c.backoff(attempt);
                assert!(
                    d >= cap / 2 && d <= cap,
                    "attempt {attempt}: {d:?} vs {cap:?}"
                );
            }
        }
    }
}
