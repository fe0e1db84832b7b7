//! Durations as people type and read them: `500ms`, `30s`, `2m`, `1h`, or a bare number of
//! seconds (`30`, `0.5`). Used by every command-line flag that takes a duration.

use std::time::Duration;

/// Parses a duration: a number of seconds (`30`, `0.5`) or a number with a unit (`500ms`,
/// `30s`, `2m`).
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("must not be negative, got {s:?}"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("expected seconds or a duration like 500ms, 30s, 2m; got {s:?}"))?;
    let scale = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| format!("duration out of range: {s:?}"))
}

/// Renders a duration for people: `750ms`, `30s`, `1.5s`, `2m`.
// `u128::is_multiple_of` needs Rust 1.87; the workspace's rust-version is 1.85.
#[allow(clippy::manual_is_multiple_of)]
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bare_seconds_and_units() {
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse("-1").unwrap_err().contains("negative"));
        assert!(parse("5x").unwrap_err().contains("unknown unit"));
        assert!(parse("").is_err());
    }

    #[test]
    fn formats_compactly_and_round_trips() {
        for (d, text) in [
            (750, "750ms"),
            (30_000, "30s"),
            (1_500, "1.5s"),
            (120_000, "2m"),
        ] {
            assert_eq!(format(Duration::from_millis(d)), text);
            assert_eq!(parse(text), Ok(Duration::from_millis(d)));
        }
    }
}
