//! Durations exactly as Go's `time.ParseDuration` reads them and `Duration.String` prints
//! them (kube-proxy's flags and `KubeProxyConfiguration` fields are Go durations): a signed
//! sequence of decimal numbers with optional fractions and units `ns`, `us`/`µs`/`μs`, `ms`,
//! `s`, `m`, `h`; `0` alone needs no unit. Values are nanoseconds in an `i64`, so anything
//! beyond ±292 years is an overflow error, never a panic. Pure.

use std::fmt;

/// A duration that Go would not parse, with Go's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

/// Go's `strconv.Quote`-like rendering for messages: printable text as is, other bytes
/// escaped.
fn quote(s: &[u8]) -> String {
    let text = String::from_utf8_lossy(s);
    if text.as_bytes() == s {
        format!("{text:?}")
    } else {
        let esc: String = s
            .iter()
            .map(|b| match b {
                0x20..=0x7e if *b != b'"' && *b != b'\\' => (*b as char).to_string(),
                _ => format!("\\x{b:02x}"),
            })
            .collect();
        format!("\"{esc}\"")
    }
}

fn invalid(orig: &[u8]) -> ParseError {
    ParseError(format!("time: invalid duration {}", quote(orig)))
}

const LIMIT: u64 = 1 << 63;

/// Consumes a leading `[0-9]*`; `None` on overflow past 2⁶³.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        if x > LIMIT / 10 {
            return None;
        }
        x = x * 10 + u64::from(s[i] - b'0');
        if x > LIMIT {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Consumes a leading `[0-9]*` after the decimal point; on overflow it stops gaining
/// precision instead of failing (Go's `leadingFraction`).
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        let c = u64::from(s[i] - b'0');
        i += 1;
        if overflow {
            continue;
        }
        if x > (LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + c;
        if y > LIMIT {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}

fn unit(u: &[u8]) -> Option<u64> {
    Some(match u {
        b"ns" => 1,
        // "us", U+00B5 MICRO SIGN and U+03BC GREEK SMALL LETTER MU, as Go accepts.
        b"us" | [0xc2, 0xb5, b's'] | [0xce, 0xbc, b's'] => 1_000,
        b"ms" => 1_000_000,
        b"s" => 1_000_000_000,
        b"m" => 60_000_000_000,
        b"h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses `s` as Go's `time.ParseDuration` does, to nanoseconds.
pub fn parse(s: &str) -> Result<i64, ParseError> {
    let orig = s.as_bytes();
    let mut s = orig;
    let mut neg = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid(orig));
    }
    let mut d: u64 = 0;
    while !s.is_empty() {
        let (v, rest) = component(s, orig)?;
        s = rest;
        d += v;
        if d > LIMIT {
            return Err(invalid(orig));
        }
    }
    if neg {
        // d ≤ 2⁶³: the negation fits (−2⁶³ is the smallest Duration).
        return Ok((d as i64).wrapping_neg());
    }
    if d > LIMIT - 1 {
        return Err(invalid(orig));
    }
    Ok(d as i64)
}

/// One `[0-9]*(\.[0-9]*)?unit` of `s` (a suffix of `orig`, which errors quote): its
/// nanoseconds and the rest.
fn component<'a>(mut s: &'a [u8], orig: &[u8]) -> Result<(u64, &'a [u8]), ParseError> {
    if !(s[0] == b'.' || s[0].is_ascii_digit()) {
        return Err(invalid(orig));
    }
    let before = s.len();
    let (v, rest) = leading_int(s).ok_or_else(|| invalid(orig))?;
    s = rest;
    let pre = before != s.len();
    let (mut f, mut scale, mut post) = (0u64, 1f64, false);
    if s.first() == Some(&b'.') {
        s = &s[1..];
        let before = s.len();
        let (ff, sc, rest) = leading_fraction(s);
        (f, scale, s) = (ff, sc, rest);
        post = before != s.len();
    }
    if !pre && !post {
        return Err(invalid(orig));
    }
    let i = s
        .iter()
        .position(|c| *c == b'.' || c.is_ascii_digit())
        .unwrap_or(s.len());
    if i == 0 {
        return Err(ParseError(format!(
            "time: missing unit in duration {}",
            quote(orig)
        )));
    }
    let (u, rest) = s.split_at(i);
    let Some(unit) = unit(u) else {
        return Err(ParseError(format!(
            "time: unknown unit {} in duration {}",
            quote(u),
            quote(orig)
        )));
    };
    if v > LIMIT / unit {
        return Err(invalid(orig));
    }
    let mut v = v * unit;
    if f > 0 {
        // As Go: float64 keeps fractions of hours nanosecond-accurate (f·unit/scale is
        // at most 3.6e12).
        v += (f as f64 * (unit as f64 / scale)) as u64;
        if v > LIMIT {
            return Err(invalid(orig));
        }
    }
    Ok((v, rest))
}

/// Appends the fraction of `v / 10^prec` without trailing zeros (and without the point
/// when it is zero); returns `v / 10^prec`.
fn frac(out: &mut Vec<u8>, mut v: u64, prec: u32) -> u64 {
    let mut digits = Vec::new();
    let mut printed = false;
    for _ in 0..prec {
        let digit = (v % 10) as u8;
        printed = printed || digit != 0;
        if printed {
            digits.push(b'0' + digit);
        }
        v /= 10;
    }
    if printed {
        digits.push(b'.');
    }
    out.extend(digits);
    v
}

/// Formats nanoseconds as Go's `Duration.String`: `0s`, `1.5µs`, `250ms`, `15m0s`,
/// `1h0m0.5s`, `-2m3.4s`.
pub fn format(ns: i64) -> String {
    // Built back to front, as Go does.
    let mut out: Vec<u8> = Vec::new();
    let neg = ns < 0;
    let mut u = ns.unsigned_abs();
    let int = |out: &mut Vec<u8>, v: u64| out.extend(v.to_string().bytes().rev());
    if u < 1_000_000_000 {
        out.push(b's');
        let prec = match u {
            0 => {
                return "0s".into();
            }
            1..=999 => {
                out.push(b'n');
                0
            }
            1_000..=999_999 => {
                out.extend("µ".bytes().rev());
                3
            }
            _ => {
                out.push(b'm');
                6
            }
        };
        u = frac(&mut out, u, prec);
        int(&mut out, u);
    } else {
        out.push(b's');
        u = frac(&mut out, u, 9);
        int(&mut out, u % 60);
        u /= 60;
        if u > 0 {
            out.push(b'm');
            int(&mut out, u % 60);
            u /= 60;
            if u > 0 {
                out.push(b'h');
                int(&mut out, u);
            }
        }
    }
    if neg {
        out.push(b'-');
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII and µ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: i64 = 1;
    const US: i64 = 1_000;
    const MS: i64 = 1_000_000;
    const S: i64 = 1_000_000_000;
    const M: i64 = 60 * S;
    const H: i64 = 60 * M;

    /// Go's own table (`src/time/time_test.go`, parseDurationTests).
    #[test]
    fn parses_gos_table() {
        let table: &[(&str, i64)] = &[
            ("0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            ("-5s", -5 * S),
            ("+5s", 5 * S),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600 * MS),
            ("5.s", 5 * S),
            (".5s", 500 * MS),
            ("1.0s", S),
            ("1.00s", S),
            ("1.004s", S + 4 * MS),
            ("1.0040s", S + 4 * MS),
            ("100.00100s", 100 * S + MS),
            ("10ns", 10 * NS),
            ("11us", 11 * US),
            ("12µs", 12 * US),
            ("12μs", 12 * US),
            ("13ms", 13 * MS),
            ("14s", 14 * S),
            ("15m", 15 * M),
            ("16h", 16 * H),
            ("3h30m", 3 * H + 30 * M),
            ("10.5s4m", 4 * M + 10 * S + 500 * MS),
            ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
            (
                "1h2m3s4ms5us6ns",
                H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS,
            ),
            ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
            ("52763797000ns", 52763797000),
            ("0.3333333333333333333h", 20 * M),
            ("9007199254740993ns", (1 << 53) + 1),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("-9223372036s854ms775us808ns", i64::MIN),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("0.100000000000000000000h", 6 * M),
            ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        ];
        for (s, want) in table {
            assert_eq!(parse(s), Ok(*want), "{s}");
        }
    }

    /// Go's parseDurationErrorTests, messages included.
    #[test]
    fn rejects_what_go_rejects() {
        let table: &[(&str, &str)] = &[
            ("", r#"time: invalid duration """#),
            ("3", r#"time: missing unit in duration "3""#),
            ("-", r#"time: invalid duration "-""#),
            ("s", r#"time: invalid duration "s""#),
            (".", r#"time: invalid duration ".""#),
            ("-.", r#"time: invalid duration "-.""#),
            (".s", r#"time: invalid duration ".s""#),
            ("+.s", r#"time: invalid duration "+.s""#),
            ("1d", r#"time: unknown unit "d" in duration "1d""#),
            ("9223372036854775810ns", "invalid duration"),
            ("9223372036854775808ns", "invalid duration"),
            ("-9223372036854775809ns", "invalid duration"),
            ("9223372036854776us", "invalid duration"),
            ("3000000h", "invalid duration"),
            ("9223372036854775.808us", "invalid duration"),
            ("9223372036854ms775us808ns", "invalid duration"),
            ("99999999999999999999h", "invalid duration"),
            ("18446744073709551616s", "invalid duration"),
        ];
        for (s, want) in table {
            let e = parse(s).expect_err(s).to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
        // Bytes that are not UTF-8 never reach here from a &str; non-ASCII units are
        // unknown units, named in the message.
        assert!(parse("1\u{fffd}")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
    }

    /// Go's durationTests (Duration.String).
    #[test]
    fn formats_as_go_prints() {
        let table: &[(&str, i64)] = &[
            ("0s", 0),
            ("1ns", NS),
            ("1.1µs", 1100 * NS),
            ("2.2ms", 2200 * US),
            ("3.3s", 3300 * MS),
            ("4m5s", 4 * M + 5 * S),
            ("4m5.001s", 4 * M + 5001 * MS),
            ("5h6m7.001s", 5 * H + 6 * M + 7001 * MS),
            ("8m0.000000001s", 8 * M + NS),
            ("2562047h47m16.854775807s", i64::MAX),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("15m0s", 15 * M),
            ("1h0m0s", H),
        ];
        for (want, ns) in table {
            assert_eq!(format(*ns), *want);
            assert_eq!(parse(want), Ok(*ns), "{want} reads back");
        }
    }
}

#[cfg(test)]
mod against_go {
    use super::*;

    /// Every generated input Go's own `time.ParseDuration` was run on (2,700 lines, a third
    /// of them at the overflow edges): the same value, or an error where Go errs, and the
    /// same `String()`.
    #[test]
    fn agrees_with_go_on_every_recorded_input() {
        let table = include_str!("testdata/go_parse_duration.tsv");
        let mut checked = 0;
        for line in table.lines().filter(|l| !l.starts_with('#')) {
            let cols: Vec<&str> = line.split('\t').collect();
            let input = cols[0]
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .expect("quoted input");
            match cols[1] {
                "ERR" => assert!(parse(input).is_err(), "{input:?} must fail"),
                ns => {
                    let ns: i64 = ns.parse().unwrap();
                    assert_eq!(parse(input), Ok(ns), "{input:?}");
                    assert_eq!(format(ns), cols[2], "String() of {ns}");
                }
            }
            checked += 1;
        }
        assert!(checked > 2000, "{checked}");
    }
}
