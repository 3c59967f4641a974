//! A YAML writer for JSON values in the shape sigs.k8s.io/yaml (go-yaml v2) gives them:
//! block mappings with sorted keys, sequences at the parent's indentation, and scalars
//! quoted the way go-yaml quotes them (double quotes where YAML 1.1 would read the plain
//! string as another type, single quotes where plain style is not allowed). Used for
//! `--write-config-to`, whose output upstream kube-proxy must read back unchanged. Pure.

use serde_json::Value;

/// Appends `v` as a YAML document at `indent` spaces.
pub fn emit(v: &Value, indent: usize, out: &mut String) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, val) in m {
                pad(indent, out);
                out.push_str(&scalar(k));
                out.push(':');
                value_after_key(val, indent, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for val in a {
                pad(indent, out);
                out.push('-');
                match val {
                    Value::Object(m) if !m.is_empty() => {
                        // "- key: v" with the rest of the mapping under it.
                        let mut first = true;
                        for (k, inner) in m {
                            if first {
                                out.push(' ');
                                first = false;
                            } else {
                                pad(indent + 2, out);
                            }
                            out.push_str(&scalar(k));
                            out.push(':');
                            value_after_key(inner, indent + 2, out);
                        }
                    }
                    other => {
                        out.push(' ');
                        out.push_str(&inline(other));
                        out.push('\n');
                    }
                }
            }
        }
        other => {
            pad(indent, out);
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

fn value_after_key(val: &Value, indent: usize, out: &mut String) {
    match val {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            emit(val, indent + 2, out);
        }
        // go-yaml v2 writes a sequence under a key at the key's own indentation.
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            emit(val, indent, out);
        }
        other => {
            out.push(' ');
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

fn pad(n: usize, out: &mut String) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        // Go's encoding/json prints integral floats without a fraction (qps: 5).
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e21 => {
                format!("{f:.0}")
            }
            _ => n.to_string(),
        },
        Value::String(s) => scalar(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

/// A string scalar as go-yaml v2 writes it.
pub fn scalar(s: &str) -> String {
    if s.contains('\n') || s.chars().any(|c| c.is_control()) || resolves_to_non_string(s) {
        return double_quoted(s);
    }
    if plain_allowed(s) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

fn double_quoted(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\t' => o.push_str("\\t"),
            c if c.is_control() => o.push_str(&format!("\\u{:04X}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Whether YAML 1.1 (go-yaml v2's resolver) reads the plain scalar as null, a boolean or a
/// number.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "", "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
        ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan",
        ".NaN", ".NAN", "<<",
    ];
    if WORDS.contains(&s) {
        return true;
    }
    let t = s.strip_prefix(['+', '-']).unwrap_or(s);
    let t = t.replace('_', "");
    if t.is_empty() {
        return false;
    }
    if let Some(h) = t.strip_prefix("0x") {
        return !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit());
    }
    if let Some(b) = t.strip_prefix("0b") {
        return !b.is_empty() && b.bytes().all(|c| c == b'0' || c == b'1');
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    // floats: digits with one '.', optional exponent
    let (mant, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (&t[..], None),
    };
    let float_mant = mant.contains('.')
        && mant.matches('.').count() == 1
        && mant.bytes().any(|b| b.is_ascii_digit())
        && mant.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    if float_mant && exp_ok {
        return true;
    }
    // base 60 ("1:20") is a number in YAML 1.1
    let parts: Vec<&str> = t.split(':').collect();
    parts.len() > 1
        && parts[0].bytes().all(|b| b.is_ascii_digit())
        && !parts[0].is_empty()
        && parts[1..]
            .iter()
            .all(|p| (1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The emitter's analysis: plain style is refused for leading indicators, `: ` and ` #`,
/// a trailing `:`, and leading or trailing spaces.
fn plain_allowed(s: &str) -> bool {
    let first = s.chars().next().unwrap_or(' ');
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        // "-x", "?x" and ":x" are plain-safe in block context only when followed by a
        // non-space; go-yaml still quotes them, except '-' followed by a non-space.
        let second = s.chars().nth(1);
        if !(first == '-' && second.is_some_and(|c| c != ' ')) {
            return false;
        }
    }
    if s.starts_with(' ') || s.ends_with(' ') || s.ends_with(':') {
        return false;
    }
    !(s.contains(": ") || s.contains(" #") || s.contains(",") && s.contains('['))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_follows_go_yaml() {
        for (s, want) in [
            ("", "\"\""),
            ("0", "\"0\""),
            ("true", "\"true\""),
            ("yes", "\"yes\""),
            ("1.5", "\"1.5\""),
            ("text", "text"),
            ("0.0.0.0:10256", "0.0.0.0:10256"),
            ("[::]:10256", "'[::]:10256'"),
            ("15m0s", "15m0s"),
            ("10.244.0.0/16", "10.244.0.0/16"),
            ("fd00::/48", "fd00::/48"),
            ("a: b", "'a: b'"),
            (
                "application/vnd.kubernetes.protobuf",
                "application/vnd.kubernetes.protobuf",
            ),
            ("it's", "it's"),
            ("x\ny", "\"x\\ny\""),
        ] {
            assert_eq!(scalar(s), want, "{s:?}");
        }
    }

    #[test]
    fn nested_shapes() {
        let v = serde_json::json!({
            "b": {"y": [], "x": ["1.2.3.0/24", "fd00::/64"]},
            "a": null,
            "c": [{"filePattern": "foo.go", "verbosity": 6}],
        });
        let mut out = String::new();
        emit(&v, 0, &mut out);
        assert_eq!(
            out,
            "a: null\nb:\n  x:\n  - 1.2.3.0/24\n  - fd00::/64\n  \"y\": []\nc:\n- filePattern: foo.go\n  verbosity: 6\n"
        );
    }
}
