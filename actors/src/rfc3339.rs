//! Times as RFC 3339 text in UTC, written by hand: chrono's `Serialize` goes
//! through `collect_str` and `fmt` (about 2,600 instructions a time), and every
//! event and tool record carries one. The output is byte for byte what chrono
//! writes (the tests compare them), so JSON written either way reads back the same.

use chrono::{DateTime, Datelike, Timelike, Utc};

/// How many digits of the second's fraction a time is written with.
#[derive(Clone, Copy)]
pub enum Fraction {
    /// Always six (microseconds): fixed width, so comparing the text compares the
    /// times. What the store's own columns hold (`created_at`, `updated_at`).
    Micros,
    /// As few as chrono's `Serialize` writes (none, 3, 6 or 9 digits): what the
    /// JSON bodies hold.
    Auto,
}

/// Appends `time` as RFC 3339 in UTC with a `Z`: what
/// `to_rfc3339_opts(Micros, true)` (for [`Fraction::Micros`]) or chrono's
/// `Serialize` (for [`Fraction::Auto`]) writes.
pub fn push_time(out: &mut String, time: DateTime<Utc>, fraction: Fraction) {
    let (date, clock) = (time.date_naive(), time.time());
    let year = date.year();
    if (0..=9999).contains(&year) {
        push_digits(out, year as u32, 4);
    } else {
        // Outside chrono's four-digit range: its own signed form, never hit in practice.
        out.push_str(&format!("{year:+05}"));
    }
    out.push('-');
    push_digits(out, date.month(), 2);
    out.push('-');
    push_digits(out, date.day(), 2);
    out.push('T');
    let mut second = clock.second();
    let mut nano = clock.nanosecond();
    // A leap second is held as a nanosecond count past 1e9.
    if nano >= 1_000_000_000 {
        second += 1;
        nano -= 1_000_000_000;
    }
    push_digits(out, clock.hour(), 2);
    out.push(':');
    push_digits(out, clock.minute(), 2);
    out.push(':');
    push_digits(out, second, 2);
    match fraction {
        Fraction::Micros => push_fraction(out, nano / 1_000, 6),
        Fraction::Auto if nano == 0 => {}
        Fraction::Auto if nano % 1_000_000 == 0 => push_fraction(out, nano / 1_000_000, 3),
        Fraction::Auto if nano % 1_000 == 0 => push_fraction(out, nano / 1_000, 6),
        Fraction::Auto => push_fraction(out, nano, 9),
    }
    out.push('Z');
}

fn push_fraction(out: &mut String, value: u32, width: u32) {
    out.push('.');
    push_digits(out, value, width);
}

/// Appends the last `width` decimal digits of `value`, zero-padded.
fn push_digits(out: &mut String, value: u32, width: u32) {
    let mut divisor = 10u32.pow(width - 1);
    while divisor > 0 {
        out.push(char::from(b'0' + (value / divisor % 10) as u8));
        divisor /= 10;
    }
}

/// Serializes `time` as chrono's `Serialize` does (RFC 3339, UTC, `Z`, as few
/// fraction digits as hold it); for `#[serde(serialize_with = ...)]`.
pub fn serialize<S: serde::Serializer>(time: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    let mut text = String::with_capacity(32);
    push_time(&mut text, *time, Fraction::Auto);
    serializer.serialize_str(&text)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::{NaiveDate, TimeZone};

    use super::*;

    fn times() -> Vec<DateTime<Utc>> {
        let mut times =
            vec![Utc::now(), DateTime::<Utc>::UNIX_EPOCH, Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()];
        // Every fraction width, and a leap second.
        for nano in [0, 1, 7_000, 120_000_000, 999_999_999, 123_456_000, 1_500_000_000] {
            let time = NaiveDate::from_ymd_opt(2016, 12, 31).unwrap().and_hms_nano_opt(23, 59, 59, nano).unwrap();
            times.push(Utc.from_utc_datetime(&time));
        }
        for year in [0, 1, 999, 2026, -1, 10_000] {
            let time = NaiveDate::from_ymd_opt(year, 2, 3).unwrap().and_hms_micro_opt(4, 5, 6, 7).unwrap();
            times.push(Utc.from_utc_datetime(&time));
        }
        times
    }

    #[derive(serde::Serialize)]
    struct Stamped(#[serde(serialize_with = "serialize")] DateTime<Utc>);

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        for time in times() {
            let mut micros = String::new();
            push_time(&mut micros, time, Fraction::Micros);
            assert_eq!(micros, time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
            let chrono = serde_json::to_string(&time).unwrap();
            assert_eq!(serde_json::to_string(&Stamped(time)).unwrap(), chrono);
            let back: DateTime<Utc> = serde_json::from_str(&chrono).unwrap();
            assert_eq!(back, time, "and reads back as the same time");
        }
    }
}
