//! Log output as kube-proxy's: klog's text header (`I1201 13:57:24.123456  1234
//! file.rs:42] msg key="value"`) or, with `--logging-format json`, component-base's JSON
//! schema (`{"ts":…,"caller":"file.rs:42","msg":"…","v":0,"key":"value"}`; errors carry no
//! `v`). Verbosity as upstream's `-v`: 0-1 info, 2-3 adds debug, 4+ trace. Colours only on
//! a terminal and never with NO_COLOR. Pure formatting; `init` installs it.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Collects an event's message and key/value pairs in order.
#[derive(Default)]
struct Fields {
    msg: String,
    kv: Vec<(String, serde_json::Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, f: &Field, v: &str) {
        if f.name() == "message" {
            self.msg = v.to_string();
        } else {
            self.kv.push((f.name().into(), v.into()));
        }
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.kv.push((f.name().into(), v.into()));
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.kv.push((f.name().into(), v.into()));
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.kv.push((f.name().into(), v.into()));
    }
    fn record_f64(&mut self, f: &Field, v: f64) {
        self.kv.push((f.name().into(), v.into()));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            self.msg = format!("{v:?}");
        } else {
            self.kv.push((f.name().into(), format!("{v:?}").into()));
        }
    }
}

/// klog's verbosity of a level: what `-v` has to be for the line to show.
pub fn verbosity_of(level: &Level) -> Option<u32> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(4),
    }
}

fn caller(event: &Event<'_>) -> String {
    let m = event.metadata();
    let file = m.file().unwrap_or("?");
    // klog prints the base name.
    let base = file.rsplit('/').next().unwrap_or(file);
    format!("{base}:{}", m.line().unwrap_or(0))
}

/// component-base's JSON lines.
pub struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        writeln!(
            w,
            "{}",
            json_line(event.metadata().level(), &caller(event), f, now_secs())
        )
    }
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// One JSON object in component-base's key order: ts, caller, msg, v, then the pairs.
fn json_line(level: &Level, caller: &str, f: Fields, ts: f64) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let mut out = format!(
        "{{\"ts\":{},\"caller\":{},\"msg\":{}",
        serde_json::Value::from(ts),
        q(caller),
        q(&f.msg)
    );
    if let Some(v) = verbosity_of(level) {
        let _ = write!(out, ",\"v\":{v}");
    }
    let mut seen = vec!["ts".to_string(), "caller".into(), "msg".into(), "v".into()];
    for (k, v) in f.kv {
        if seen.contains(&k) {
            continue;
        }
        let _ = write!(out, ",{}:{v}", q(&k));
        seen.push(k);
    }
    out.push('}');
    out
}

/// klog's text header and `key="value"` pairs.
pub struct KlogText {
    pub pid: u32,
}

impl<S, N> FormatEvent<S, N> for KlogText
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        let now = chrono_like(std::time::SystemTime::now());
        writeln!(
            w,
            "{}",
            text_line(event.metadata().level(), &now, self.pid, &caller(event), f)
        )
    }
}

/// `mmdd hh:mm:ss.uuuuuu` in UTC.
fn chrono_like(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, mo, da) = civil_from_days(days);
    let _ = y;
    format!(
        "{mo:02}{da:02} {:02}:{:02}:{:02}.{:06}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn text_line(level: &Level, when: &str, pid: u32, caller: &str, f: Fields) -> String {
    let letter = match *level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let mut s = format!("{letter}{when} {pid:>7} {caller}] {}", f.msg);
    for (k, v) in f.kv {
        match v {
            serde_json::Value::String(x) => {
                let _ = write!(s, " {k}={x:?}");
            }
            other => {
                let _ = write!(s, " {k}={other}");
            }
        }
    }
    s
}

/// Installs the subscriber: `filter` as RUST_LOG or the verbosity's level.
pub fn init(json: bool, level: &str) {
    // kube-client logs a whole response body at WARN when it cannot decode one; our sources
    // report such failures themselves, in one line.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("{level},kube_client=error"))
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if json {
        b.event_format(JsonFormat).init();
    } else {
        b.event_format(KlogText {
            pid: std::process::id(),
        })
        .init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(msg: &str, kv: &[(&str, serde_json::Value)]) -> Fields {
        Fields {
            msg: msg.into(),
            kv: kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        }
    }

    #[test]
    fn json_lines_have_component_bases_schema() {
        let l = json_line(
            &Level::INFO,
            "hooks.rs:72",
            fields("synced", &[("rules", 61.into()), ("full", true.into())]),
            1764597444.5,
        );
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["ts"], 1764597444.5);
        assert_eq!(v["caller"], "hooks.rs:72");
        assert_eq!(v["msg"], "synced");
        assert_eq!(v["v"], 0);
        assert_eq!(v["rules"], 61);
        assert!(
            l.starts_with(
                "{\"ts\":1764597444.5,\"caller\":\"hooks.rs:72\",\"msg\":\"synced\",\"v\":0,"
            ),
            "{l}"
        );
        let e = json_line(&Level::ERROR, "a.rs:1", fields("boom", &[]), 1.0);
        let v: serde_json::Value = serde_json::from_str(&e).unwrap();
        assert!(v.get("v").is_none(), "errors carry no verbosity: {e}");
        let d = json_line(&Level::DEBUG, "a.rs:1", fields("detail", &[]), 1.0);
        assert!(d.contains("\"v\":2"), "{d}");
    }

    #[test]
    fn text_lines_have_klogs_header() {
        let l = text_line(
            &Level::WARN,
            "1201 13:57:24.123456",
            42,
            "app.rs:9",
            fields("cannot set", &[("value", "x y".into()), ("n", 3.into())]),
        );
        assert_eq!(
            l,
            "W1201 13:57:24.123456      42 app.rs:9] cannot set value=\"x y\" n=3"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20423), (2025, 12, 1));
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_764_597_444);
        assert_eq!(&chrono_like(t)[..4], "1201");
    }
}
