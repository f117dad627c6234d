//! Durations on the command line (`500ms`, `30s`, `5m`, `1h`, `1m30s`, `1.5s`) and in messages.

use std::time::Duration;

/// Parse a duration: one or more `<number><unit>` parts, unit one of `ms`, `s`, `m`, `h`.
/// A bare number is refused: `--lease 500` could mean seconds or milliseconds.
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
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() {
            return bad("expected a number");
        }
        let value: f64 = match num.parse() {
            Ok(v) => v,
            Err(_) => return bad("not a number"),
        };
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return bad("a unit is missing"),
            _ => return bad("unknown unit"),
        };
        total += value * scale;
        rest = tail;
    }
    // one year is far beyond any lease or wait fairlock accepts; refuse before overflow
    if !total.is_finite() || total > 365.0 * 24.0 * 3600.0 {
        return bad("it is too long");
    }
    Ok(Duration::from_secs_f64(total))
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
        for bad in ["", "500", "5x", "s", "-1s", "1.2.3s", "99999999h", "5 s"] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(Duration::from_millis(450)), "450ms");
        assert_eq!(human(Duration::from_millis(3200)), "3.2s");
        assert_eq!(human(Duration::from_secs(65)), "1m 05s");
        assert_eq!(human(Duration::from_secs(7380)), "2h 03m");
    }
}
