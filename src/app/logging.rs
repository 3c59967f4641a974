//! Log output as kube-proxy's: klog's `InfoS` text (`I1201 13:57:24.123456  1234
//! file.rs:42] "Message" key="value"`) or, with `--logging-format json`, component-base's
//! JSON schema (`{"ts":<ms since the epoch>,"caller":"dir/file.rs:42","msg":"…","v":0,
//! "key":"value"}`, zap's short caller; errors carry no `v`). A field named `error` is
//! written as `err`, klog's and component-base's key for an error. Verbosity as upstream's `-v`: 0-1 info, 2-3 adds debug, 4+ trace. Colours only on
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

/// The key a field is written under: `err` for an error, as klog's `ErrorS` and
/// component-base's JSON (zapr's `ErrorKey("err")`).
fn key_of(f: &Field) -> String {
    match f.name() {
        "error" => "err".into(),
        other => other.into(),
    }
}

impl Visit for Fields {
    fn record_str(&mut self, f: &Field, v: &str) {
        if f.name() == "message" {
            self.msg = v.to_string();
        } else {
            self.kv.push((key_of(f), v.into()));
        }
    }
    fn record_i64(&mut self, f: &Field, v: i64) {
        self.kv.push((key_of(f), v.into()));
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.kv.push((key_of(f), v.into()));
    }
    fn record_bool(&mut self, f: &Field, v: bool) {
        self.kv.push((key_of(f), v.into()));
    }
    fn record_f64(&mut self, f: &Field, v: f64) {
        self.kv.push((key_of(f), v.into()));
    }
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        if f.name() == "message" {
            self.msg = format!("{v:?}");
        } else {
            self.kv.push((key_of(f), format!("{v:?}").into()));
        }
    }
}

/// klog's verbosity of a level: what `-v` has to be for the line to show.
pub(crate) fn verbosity_of(level: &Level) -> Option<u32> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(4),
    }
}

/// klog's text caller: the file's base name and line (`server.go:123`).
fn caller(event: &Event<'_>) -> String {
    let m = event.metadata();
    let file = m.file().unwrap_or("?");
    let base = file.rsplit('/').next().unwrap_or(file);
    format!("{base}:{}", m.line().unwrap_or(0))
}

/// zap's short caller, as component-base's JSON writes it: the file's directory and name
/// (`app/server.go:137`), so one of our ~15 `mod.rs` files is told from another.
fn short_caller(file: &str, line: u32) -> String {
    let mut parts = file.rsplitn(3, '/');
    let base = parts.next().unwrap_or(file);
    match parts.next() {
        Some(dir) => format!("{dir}/{base}:{line}"),
        None => format!("{base}:{line}"),
    }
}

/// component-base's JSON lines.
pub(crate) struct JsonFormat;

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
            json_line(
                event.metadata().level(),
                &short_caller(
                    event.metadata().file().unwrap_or("?"),
                    event.metadata().line().unwrap_or(0)
                ),
                f,
                now_millis()
            )
        )
    }
}

/// Milliseconds since the epoch, with a fraction, as component-base's
/// `epochMillisTimeEncoder` (a pipeline reading seconds would date lines to 1970).
fn now_millis() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as f64
        / 1e6
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
pub(crate) struct KlogText {
    pub(crate) pid: u32,
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
    // klog's InfoS: the message quoted (Go's strconv.Quote; Rust's escaping agrees on
    // quotes, backslashes and control characters).
    let mut s = format!("{letter}{when} {pid:>7} {caller}] {:?}", f.msg);
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
    // A failed write is dropped: tracing-subscriber would report it with `eprintln!`, which
    // panics on the same broken stderr (a log pipe whose reader went away), and a panic in a
    // task ends that task: the SIGTERM handler's, say, after which the daemon ignored
    // SIGTERM (measured: alive 5 s after it, with stderr closed).
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .log_internal_errors(false)
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
            1764597444500.25,
        );
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["ts"], 1764597444500.25);
        assert_eq!(v["caller"], "hooks.rs:72");
        assert_eq!(v["msg"], "synced");
        assert_eq!(v["v"], 0);
        assert_eq!(v["rules"], 61);
        assert!(
            l.starts_with(
                "{\"ts\":1764597444500.25,\"caller\":\"hooks.rs:72\",\"msg\":\"synced\",\"v\":0,"
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
            "W1201 13:57:24.123456      42 app.rs:9] \"cannot set\" value=\"x y\" n=3"
        );
        let q = text_line(
            &Level::INFO,
            "1201 00:00:00.000000",
            1,
            "a.rs:1",
            fields("say \"hi\"\n", &[]),
        );
        assert!(q.ends_with(r#"] "say \"hi\"\n""#), "{q}");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20423), (2025, 12, 1));
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_764_597_444);
        assert_eq!(&chrono_like(t)[..4], "1201");
    }

    #[test]
    fn json_caller_names_the_directory_and_errors_go_in_err() {
        assert_eq!(short_caller("src/app/mod.rs", 102), "app/mod.rs:102");
        assert_eq!(short_caller("/x/src/modes/ipvs/mod.rs", 7), "ipvs/mod.rs:7");
        assert_eq!(short_caller("main.rs", 3), "main.rs:3");
        // Through a real subscriber: the `error` field is written as `err`.
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || SharedBuf(sink.clone()))
            .event_format(JsonFormat)
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::error!(error = "no route", service = "ns/web", "sync failed");
        });
        let line = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(v["err"], "no route", "{line}");
        assert_eq!(v["service"], "ns/web");
        assert!(v.get("error").is_none(), "{line}");
        let caller = v["caller"].as_str().unwrap();
        assert!(caller.starts_with("app/logging.rs:"), "{caller}");
        let ts = v["ts"].as_f64().unwrap();
        assert!(ts > 1.7e12, "milliseconds since the epoch: {ts}");
    }

    struct SharedBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
