//! `/statusz` and `/flagz` as upstream kube-proxy serves them on its metrics server
//! (apiserver's `server/statusz` and `server/flagz`, behind the `ComponentStatusz` and
//! `ComponentFlagz` gates, beta and on since 1.36): a text page by default, or the
//! `config.k8s.io` `Statusz`/`Flagz` object (v1alpha1, deprecated, or v1beta1) as JSON or
//! YAML when the Accept header asks for it with `g=`, `v=` and `as=`. Rendering and content
//! negotiation are pure; the handlers only read the clock and pick the delimiter.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

/// The component name upstream passes to both pages.
pub const COMPONENT: &str = "kube-proxy";
/// The API group of the structured forms.
pub const GROUP: &str = "config.k8s.io";
/// Versions of the structured forms; v1alpha1 answers with a deprecation warning.
const VERSIONS: [&str; 2] = ["v1alpha1", "v1beta1"];

/// Upstream picks one of these at random per response, so that nobody parses the text form.
pub const DELIMITERS: [&str; 4] = [":", ": ", "=", " "];

const WARNING_LINE: &str = "Warning: This endpoint is not meant to be machine parseable, has no \
formatting compatibility guarantees and is for debugging purposes only.";

/// What `/statusz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatuszInfo {
    pub start: SystemTime,
    /// Upstream's "Go version"; here which Rust program answers.
    pub go_version: String,
    pub binary_version: String,
    pub emulation_version: String,
    /// The server's paths, first segment only, sorted (upstream's `aggregatePaths`).
    pub paths: Vec<String>,
}

/// The media types negotiation offers, in upstream's order (its codec factory's JSON and
/// YAML, then the text serializer; CBOR only behind the off-by-default
/// `CBORServingAndStorage` gate, protobuf filtered out).
const OFFERED: [(&str, &str); 3] = [
    ("application", "json"),
    ("application", "yaml"),
    ("text", "plain"),
];

/// The outcome of content negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiated {
    Text,
    /// JSON (`yaml: false`) or YAML of `version`'s object.
    Structured {
        yaml: bool,
        version: &'static str,
        pretty: bool,
    },
    /// 406 with upstream's message.
    NotAcceptable,
}

/// apiserver's `NegotiateOutputMediaType` with the statusz/flagz restrictions: text only
/// without a target kind, JSON and YAML only with a recognized one (`kind`, group
/// `config.k8s.io`, v1alpha1 or v1beta1). An empty Accept header gets the text form.
pub fn negotiate(accept: &str, kind: &str) -> Negotiated {
    if accept.trim().is_empty() {
        return Negotiated::Text;
    }
    for clause in parse_accept(accept) {
        for (t, st) in OFFERED {
            let matches = (clause.ty == t && (clause.sub == st || clause.sub == "*"))
                || (clause.ty == "*" && clause.sub == "*");
            if !matches {
                continue;
            }
            let (mut g, mut v, mut k, mut convert, mut pretty, mut refused) =
                ("", "", "", false, false, false);
            for (pk, pv) in &clause.params {
                match pk.as_str() {
                    "g" => (g, convert) = (pv.as_str(), true),
                    "v" => (v, convert) = (pv.as_str(), true),
                    "as" => (k, convert) = (pv.as_str(), true),
                    "pretty" => pretty = pv == "1",
                    // No stream serializer, no server-version schema here.
                    "stream" | "sv" if !pv.is_empty() => refused = true,
                    _ => {}
                }
            }
            if refused {
                continue;
            }
            if t == "text" {
                if !convert {
                    return Negotiated::Text;
                }
                continue;
            }
            let version = VERSIONS.iter().find(|x| **x == v);
            if let (true, "config.k8s.io", Some(version)) = (k == kind, g, version) {
                return Negotiated::Structured {
                    yaml: st == "yaml",
                    version,
                    pretty,
                };
            }
        }
    }
    Negotiated::NotAcceptable
}

struct Clause {
    ty: String,
    sub: String,
    q: f64,
    params: Vec<(String, String)>,
}

/// goautoneg's `ParseAccept`: clauses by descending quality, a more specific range first
/// among equals.
fn parse_accept(header: &str) -> Vec<Clause> {
    let mut out: Vec<Clause> = Vec::new();
    for part in header.split(',') {
        let mut fields = part.split(';').map(str::trim);
        let range = fields.next().unwrap_or_default();
        let (ty, sub) = match range.split_once('/') {
            Some((t, s)) => (t.to_string(), s.to_string()),
            None if range == "*" => ("*".to_string(), "*".to_string()),
            None => continue,
        };
        let mut q = 1.0;
        let mut params = Vec::new();
        for p in fields {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if k == "q" {
                q = v.parse().unwrap_or(0.0);
            } else {
                params.push((k.to_string(), v.to_string()));
            }
        }
        out.push(Clause { ty, sub, q, params });
    }
    let wild = |c: &Clause| u8::from(c.ty == "*") + u8::from(c.sub == "*");
    out.sort_by(|a, b| {
        b.q.partial_cmp(&a.q)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(wild(a).cmp(&wild(b)))
    });
    out
}

/// The 406 body: a `metav1.Status` as upstream's `ErrorNegotiated` writes it.
pub fn not_acceptable_body() -> String {
    let supported: Vec<String> = OFFERED.iter().map(|(t, s)| format!("{t}/{s}")).collect();
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("only the following media types are accepted: {}", supported.join(", ")),
        "reason": "NotAcceptable",
        "code": 406,
    });
    format!("{status}\n")
}

/// The `Warning` header for a deprecated version of `page` (`statusz`, `flagz`).
pub fn deprecation_warning(page: &str, version: &str) -> Option<String> {
    (version == "v1alpha1").then(|| {
        format!("299 - \"This version of the {page} endpoint is deprecated. Please use a newer version.\"")
    })
}

/// The structured response's Content-Type: the media type with the target kind.
pub fn structured_content_type(yaml: bool, version: &str, kind: &str) -> String {
    let mt = if yaml {
        "application/yaml"
    } else {
        "application/json"
    };
    format!("{mt};g={GROUP};v={version};as={kind}")
}

/// Encodes `obj` as the negotiated serializer does: JSON (indented when pretty) or YAML.
pub fn encode(obj: &Value, yaml: bool, pretty: bool) -> String {
    if yaml {
        let mut s = String::new();
        crate::config::file::yaml_out::emit(obj, 0, &mut s);
        return s;
    }
    let body = if pretty {
        serde_json::to_string_pretty(obj)
    } else {
        serde_json::to_string(obj)
    };
    format!("{}\n", body.unwrap_or_default())
}

fn uptime_secs(start: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(start)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// The `Statusz` object of `version`.
pub fn statusz_object(info: &StatuszInfo, version: &str, now: SystemTime) -> Value {
    let mut o = json!({
        "kind": "Statusz",
        "apiVersion": format!("{GROUP}/{version}"),
        "metadata": {"name": COMPONENT},
        "startTime": time_json(info.start),
        "uptimeSeconds": uptime_secs(info.start, now),
        "goVersion": info.go_version,
        "binaryVersion": info.binary_version,
        "paths": info.paths,
    });
    if !info.emulation_version.is_empty() {
        o["emulationVersion"] = Value::String(info.emulation_version.clone());
    }
    o
}

/// metav1.Time's JSON: RFC 3339 in UTC, whole seconds.
fn time_json(t: SystemTime) -> String {
    let r = crate::serve::proxy_health::rfc3339(t);
    match r.split_once('.') {
        Some((secs, _)) => format!("{secs}Z"),
        None => r,
    }
}

/// The text form of `/statusz` with delimiter `delim` (one of [`DELIMITERS`]).
pub fn render_statusz_text(info: &StatuszInfo, now: SystemTime, delim: &str) -> String {
    let up = uptime_secs(info.start, now);
    let uptime = format!(
        "{} hr {:02} min {:02} sec",
        up / 3600,
        (up / 60) % 60,
        up % 60
    );
    let emulation = if info.emulation_version.is_empty() {
        String::new()
    } else {
        format!(
            "Emulation version{delim} {}",
            html_escape(&info.emulation_version)
        )
    };
    let paths = info.paths.join(" ");
    let paths = if paths.is_empty() {
        paths
    } else {
        format!("Paths{delim} {}", html_escape(&paths))
    };
    format!(
        "\n{COMPONENT} statusz\n{WARNING_LINE}\n\nStarted{delim} {}\nUp{delim} {}\nGo version{delim} {}\nBinary version{delim} {}\n{emulation}\n{paths}\n",
        unix_date(info.start),
        uptime,
        html_escape(&info.go_version),
        html_escape(&info.binary_version),
    )
}

/// The `Flagz` object of `version`.
pub fn flagz_object(flags: &BTreeMap<String, String>, version: &str) -> Value {
    let mut o = json!({
        "kind": "Flagz",
        "apiVersion": format!("{GROUP}/{version}"),
        "metadata": {"name": COMPONENT},
    });
    if !flags.is_empty() {
        o["flags"] = json!(flags);
    }
    o
}

/// The text form of `/flagz`: one `name<delim>value` line per flag, sorted.
pub fn render_flagz_text(flags: &BTreeMap<String, String>, delim: &str) -> String {
    let mut s = format!("\n{COMPONENT} flagz\n{WARNING_LINE}\n");
    for (k, v) in flags {
        s.push_str(&format!("{k}{delim}{v}\n"));
    }
    s
}

/// Go's `html.EscapeString`.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

/// Go's `time.UnixDate` layout (`Mon Jan _2 15:04:05 MST 2006`), in UTC.
fn unix_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    // rfc3339 prints YYYY-MM-DDTHH:MM:SS...: reuse its civil date.
    let r = crate::serve::proxy_health::rfc3339(t);
    let field = |a: usize, b: usize| r.get(a..b).unwrap_or("0").to_string();
    let month: usize = field(5, 7).parse().unwrap_or(1);
    let day: u32 = field(8, 10).parse().unwrap_or(1);
    format!(
        "{} {} {day:>2} {} UTC {}",
        DAYS[((secs / 86400) % 7) as usize],
        MONTHS[month.clamp(1, 12) - 1],
        field(11, 19),
        field(0, 4),
    )
}

/// A delimiter picked from the clock's nanoseconds (upstream uses math/rand).
pub fn pick_delimiter(now: SystemTime) -> &'static str {
    let n = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    DELIMITERS[(n as usize / 1000) % DELIMITERS.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> StatuszInfo {
        StatuszInfo {
            // 2025-12-01T00:00:00Z, a Monday.
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(20423 * 86400),
            go_version: "rust".into(),
            binary_version: "1.37.0+kube-nlproxy".into(),
            emulation_version: "1.37".into(),
            paths: vec!["/configz".into(), "/metrics".into()],
        }
    }

    #[test]
    fn statusz_text_has_upstreams_header_and_fields() {
        let i = info();
        let now = i.start + Duration::from_secs(3723);
        let t = render_statusz_text(&i, now, ": ");
        assert_eq!(
            t,
            "\nkube-proxy statusz\nWarning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.\n\n\
             Started:  Mon Dec  1 00:00:00 UTC 2025\nUp:  1 hr 02 min 03 sec\nGo version:  rust\n\
             Binary version:  1.37.0+kube-nlproxy\nEmulation version:  1.37\nPaths:  /configz /metrics\n"
        );
    }

    #[test]
    fn statusz_object_has_the_v1beta1_shape() {
        let i = info();
        let o = statusz_object(&i, "v1beta1", i.start + Duration::from_secs(5));
        assert_eq!(
            o,
            json!({
                "kind": "Statusz", "apiVersion": "config.k8s.io/v1beta1",
                "metadata": {"name": "kube-proxy"}, "startTime": "2025-12-01T00:00:00Z",
                "uptimeSeconds": 5, "goVersion": "rust", "binaryVersion": "1.37.0+kube-nlproxy",
                "emulationVersion": "1.37", "paths": ["/configz", "/metrics"]
            })
        );
    }

    #[test]
    fn flagz_lists_sorted_name_value_lines() {
        let f: BTreeMap<String, String> = [("v", "2"), ("bind-address", "0.0.0.0")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(
            render_flagz_text(&f, "="),
            format!("\nkube-proxy flagz\n{WARNING_LINE}\nbind-address=0.0.0.0\nv=2\n")
        );
        assert_eq!(
            flagz_object(&f, "v1alpha1"),
            json!({"kind": "Flagz", "apiVersion": "config.k8s.io/v1alpha1",
                   "metadata": {"name": "kube-proxy"}, "flags": {"bind-address": "0.0.0.0", "v": "2"}})
        );
    }

    #[test]
    fn negotiation_follows_upstreams_restrictions() {
        let s = "Statusz";
        assert_eq!(negotiate("", s), Negotiated::Text);
        assert_eq!(negotiate("text/plain", s), Negotiated::Text);
        assert_eq!(negotiate("*/*", s), Negotiated::Text);
        assert_eq!(
            negotiate("application/json;v=v1beta1;g=config.k8s.io;as=Statusz", s),
            Negotiated::Structured {
                yaml: false,
                version: "v1beta1",
                pretty: false
            }
        );
        assert_eq!(
            negotiate("application/yaml;as=Statusz;v=v1alpha1;g=config.k8s.io", s),
            Negotiated::Structured {
                yaml: true,
                version: "v1alpha1",
                pretty: false
            }
        );
        // JSON without a target kind, a wrong kind or version, text with one: refused.
        assert_eq!(negotiate("application/json", s), Negotiated::NotAcceptable);
        assert_eq!(
            negotiate("application/json;v=v1beta1;g=config.k8s.io;as=Flagz", s),
            Negotiated::NotAcceptable
        );
        assert_eq!(
            negotiate("application/json;v=v2;g=config.k8s.io;as=Statusz", s),
            Negotiated::NotAcceptable
        );
        assert_eq!(
            negotiate("text/plain;as=Statusz", s),
            Negotiated::NotAcceptable
        );
        // Quality orders the clauses.
        assert_eq!(
            negotiate(
                "text/plain;q=0.5, application/json;g=config.k8s.io;v=v1beta1;as=Statusz",
                s
            ),
            Negotiated::Structured {
                yaml: false,
                version: "v1beta1",
                pretty: false
            }
        );
        assert!(not_acceptable_body().contains(
            "only the following media types are accepted: application/json, application/yaml, text/plain"
        ));
    }

    #[test]
    fn unix_date_pads_the_day_like_go() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(86400 * 4 + 3661);
        assert_eq!(unix_date(t), "Mon Jan  5 01:01:01 UTC 1970");
    }
}
