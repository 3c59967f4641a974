//! The operator tools over HTTP on the metrics server, for clusters that forbid `kubectl
//! exec` (issue #53.5): `GET /debug/kube-nlproxy/services`, `…/explain?to=…&from=…`,
//! `…/status` and `…/diff` answer the same JSON as the CLI's `--json` (200, whether or not it
//! reports drift or a dropped packet), read-only. `status` and `diff` compare the kernel with
//! the state the daemon last synced successfully (503 before its first sync). A bad query is
//! 400 with one line naming the parameter; a kernel read that fails is 500 with its line.
//! Reachable where `/metrics` is (and so through the API server's node proxy where the
//! operator allows it). The tools block on netlink, so each request runs on tokio's
//! blocking pool. I/O.

use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::{Config, StateTool};
use crate::model::ProxyState;
use crate::tools::{self, Printed, ToolError};

/// Where the pages live: under `/debug/`, as Go servers keep their diagnostics.
pub const PREFIX: &str = "/debug/kube-nlproxy";

/// The state of the daemon's last successful sync, published by its hooks.
pub type SyncedState = Arc<Mutex<Option<Arc<ProxyState>>>>;

/// explain's flags a query may set (`--json` and the table are the daemon's).
const EXPLAIN_PARAMS: &[&str] = &["to", "from", "iif", "mark", "sport"];

/// The routes, to merge into the metrics server's router.
pub fn router(cfg: Arc<Config>, synced: SyncedState) -> axum::Router {
    let table = table_flag(&cfg);
    let services_table = table.clone();
    let (status_cfg, status_state) = (cfg.clone(), synced.clone());
    axum::Router::new()
        .route(
            &format!("{PREFIX}/services"),
            get(move || {
                let mut args = vec!["--json".to_string()];
                args.extend(services_table.clone());
                if let Some(a) = cfg.metrics_bind_address {
                    args.extend(["--metrics-address".into(), loopback(a).to_string()]);
                }
                blocking(move || tools::services::run(&args))
            }),
        )
        .route(
            &format!("{PREFIX}/explain"),
            get(move |uri: Uri| {
                let args = query_flags(uri.query().unwrap_or(""), EXPLAIN_PARAMS).map(|mut a| {
                    a.push("--json".into());
                    a.extend(table.clone());
                    a
                });
                async move {
                    match args {
                        Ok(args) => blocking(move || tools::explain::run(&args)).await,
                        Err(e) => text(StatusCode::BAD_REQUEST, format!("explain: {e}\n")),
                    }
                }
            }),
        )
        .route(
            &format!("{PREFIX}/status"),
            get({
                let (cfg, synced) = (status_cfg.clone(), status_state.clone());
                move || state_tool(cfg, synced, false)
            }),
        )
        .route(
            &format!("{PREFIX}/diff"),
            get(move || state_tool(status_cfg, status_state, true)),
        )
}

/// `--table NAME` when the daemon's table is not one the tools find by themselves.
fn table_flag(cfg: &Config) -> Option<String> {
    use crate::proxy::names::DEFAULT_TABLE;
    let ipvs = crate::modes::ipvs::table::DEFAULT_TABLE;
    let t = &cfg.proxier.table;
    (t != DEFAULT_TABLE && t != ipvs).then(|| format!("--table={t}"))
}

/// The metrics server's address as a client on this host reaches it.
fn loopback(mut a: std::net::SocketAddr) -> std::net::SocketAddr {
    if a.ip().is_unspecified() {
        a.set_ip(std::net::IpAddr::from([127, 0, 0, 1]));
    }
    a
}

async fn state_tool(cfg: Arc<Config>, synced: SyncedState, diff: bool) -> Response {
    let Some(state) = synced.lock().expect("synced state").clone() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "no successful sync yet: nothing to compare the kernel with\n".into(),
        );
    };
    let tool = StateTool { diff, json: true };
    blocking(move || tools::status::run(tool, &cfg, &state)).await
}

/// Runs a tool on the blocking pool and answers its JSON, or its error line.
async fn blocking(f: impl FnOnce() -> Result<Printed, ToolError> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(p)) => {
            let mut r = p.text.into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Ok(Err(e @ ToolError::Usage { .. })) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the tool did not finish: {e}\n"),
        ),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A query string as tool flags (`to=10.96.0.10%3A53%2Fudp&from=node` → `--to=10.96.0.10:53/udp
/// --from=node`), percent-decoded, `+` a space; a parameter not in `allowed`, one given twice
/// or one without a value is an error naming it. Pure.
pub fn query_flags(query: &str, allowed: &[&str]) -> Result<Vec<String>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k)?, percent_decode(v)?);
        if !allowed.contains(&k.as_str()) {
            return Err(format!(
                "unknown parameter {k:?} (want {})",
                allowed.join(", ")
            ));
        }
        if v.is_empty() {
            return Err(format!("parameter {k:?} needs a value"));
        }
        if !seen.insert(k.clone()) {
            return Err(format!("parameter {k:?} given twice"));
        }
        out.push(format!("--{k}={v}"));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
                out.push(hex);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_becomes_explains_flags() {
        assert_eq!(
            query_flags(
                "to=10.96.0.10%3A53%2Fudp&from=kube-system%2Fcoredns-1",
                EXPLAIN_PARAMS
            ),
            Ok(vec![
                "--to=10.96.0.10:53/udp".to_string(),
                "--from=kube-system/coredns-1".to_string()
            ])
        );
        assert_eq!(
            query_flags("to=[fd00::10]:443&mark=0x4000", EXPLAIN_PARAMS).unwrap(),
            ["--to=[fd00::10]:443", "--mark=0x4000"]
        );
        assert_eq!(query_flags("", EXPLAIN_PARAMS), Ok(vec![]));
        let e = |q: &str| query_flags(q, EXPLAIN_PARAMS).unwrap_err();
        assert!(e("table=x").contains("unknown parameter \"table\""));
        assert!(e("json=true").contains("unknown parameter \"json\""));
        assert!(e("to=").contains("\"to\" needs a value"));
        assert!(e("to=a&to=b").contains("given twice"));
        assert!(e("to=%zz").contains("percent-encoding"));
        assert!(e("to=%ff").contains("UTF-8"));
    }
}
