//! Times as people read them in `agentmesh-node status`: an instant as
//! RFC 3339 in UTC (`2025-03-01T12:00:05Z`), a span as `3m05s`, and both
//! together (`… (3m05s ago)`, `… (in 10m00s)`). Written here rather than
//! taken from a date crate: the node only ever formats whole seconds in UTC.

/// `unix_secs` as RFC 3339 in UTC, whole seconds (`1970-01-01T00:00:00Z`).
pub(crate) fn rfc3339(unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`, the algorithm C++20's `<chrono>` uses).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// `secs` as `1h02m`, `3m05s` or `42s` (negative with a `-`).
pub(crate) fn human_secs(secs: i64) -> String {
    let (sign, s) = if secs < 0 { ("-", -secs) } else { ("", secs) };
    if s >= 3600 {
        format!("{sign}{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{sign}{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{sign}{s}s")
    }
}

/// `at` seen from `now`: `2025-03-01T12:00:05Z (3m05s ago)` for a past
/// instant, `… (in 10m00s)` for a future one, `… (now)` for this second.
pub(crate) fn instant(at: i64, now: i64) -> String {
    let d = now - at;
    let rel = match d {
        0 => "now".to_string(),
        d if d > 0 => format!("{} ago", human_secs(d)),
        d => format!("in {}", human_secs(-d)),
    };
    format!("{} ({rel})", rfc3339(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_read_as_rfc_3339_in_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // 2000-02-29 (a leap day in a century year divisible by 400).
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        // 2100 is no leap year: 28 Feb is followed by 1 March.
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn spans_and_relative_instants_read_as_people_write_them() {
        assert_eq!(human_secs(42), "42s");
        assert_eq!(human_secs(185), "3m05s");
        assert_eq!(human_secs(3720), "1h02m");
        assert_eq!(human_secs(-5), "-5s");
        assert_eq!(instant(100, 285), "1970-01-01T00:01:40Z (3m05s ago)");
        assert_eq!(instant(700, 100), "1970-01-01T00:11:40Z (in 10m00s)");
        assert_eq!(instant(100, 100), "1970-01-01T00:01:40Z (now)");
    }
}
