//! Durations on the command line (`500ms`, `30s`, `5m`, `1h`, `1m30s`, `1.5s`) and in messages.
//!
//! Parsing is humantime's, narrowed to the form docs/cli.md documents: `<number><unit>` parts
//! with no spaces, unit one of `ms`, `s`, `m`, `h`.

use std::time::Duration;

/// The units accepted (humantime knows more: `d`, `min`, `sec`, `M` for months, ...).
const UNITS: [&str; 4] = ["ms", "s", "m", "h"];

/// One year is far beyond any lease or wait fairlock accepts.
const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parse a duration: one or more `<number><unit>` parts, unit one of `ms`, `s`, `m`, `h`.
/// A bare number is refused: `--lease 500` could mean seconds or milliseconds (humantime takes
/// a bare `0`).
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid duration {text:?}: {why}; write it like 500ms, 30s, 5m or 1h"
        ))
    };
    let s = text.trim();
    if s.is_empty() {
        return bad("it is empty");
    }
    // humantime allows spaces between a number and its unit, and between parts
    if s.contains(char::is_whitespace) {
        return bad("it contains a space");
    }
    if !s.ends_with(char::is_alphabetic) {
        return bad("a unit is missing");
    }
    let mut units = s
        .split(|c: char| !c.is_alphabetic())
        .filter(|u| !u.is_empty());
    if let Some(unit) = units.find(|u| !UNITS.contains(u)) {
        return bad(&format!("unknown unit {unit:?}"));
    }
    match humantime::parse_duration(s) {
        Ok(d) if d <= LONGEST => Ok(d),
        Ok(_) => bad("it is too long"),
        Err(humantime::DurationError::NumberOverflow) => {
            bad("it is too long, or finer than a nanosecond")
        }
        Err(e) => bad(&e.to_string()),
    }
}

/// The form [`parse`] reads back, for defaults: humantime's without its spaces (`30s`,
/// `1m30s`). Days and longer come out in units `parse` refuses.
pub fn text(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// Short human form: `450ms`, `3.2s`, `1m 05s`, `2h 03m`, `3d 04h`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    if secs < 60 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let (m, s) = (secs / 60, secs % 60);
    if m < 60 {
        return format!("{m}m {s:02}s");
    }
    let (h, m) = (m / 60, m % 60);
    if h < 24 {
        return format!("{h}h {m:02}m");
    }
    format!("{}d {:02}h", h / 24, h % 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn refuses_bad_text() {
        for bad in [
            "",
            "500",
            "5x",
            "s",
            "-1s",
            "1.2.3s",
            "99999999h",
            "5 s",
            "0",
            "1d",
            "1m 30s",
            "5s5",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn default_lease_reads_back() {
        assert_eq!(text(Duration::from_millis(90_500)), "1m30s500ms");
        let default = text(fairlock::DEFAULT_LEASE);
        assert_eq!(parse(&default), Ok(fairlock::DEFAULT_LEASE), "{default}");
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(Duration::from_millis(450)), "450ms");
        assert_eq!(human(Duration::from_millis(3200)), "3.2s");
        assert_eq!(human(Duration::from_secs(65)), "1m 05s");
        assert_eq!(human(Duration::from_secs(7380)), "2h 03m");
    }
}
