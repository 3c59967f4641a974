//! Real HTTP against /statusz and /flagz (content negotiation, the gates), and against
//! /healthz, /livez and /metrics while a sync loop runs against a backend
//! that can be made to fail. Needs no root.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_nlproxy::app::hooks::Hooks;
use kube_nlproxy::config::DetectLocal;
use kube_nlproxy::kernel::nft::decode::ListedTable;
use kube_nlproxy::kernel::nft::{Error, FakeNftables, Family, Nftables, Transaction};
use kube_nlproxy::model::{Endpoint, NodeInfo, Protocol, ProxyState, ServicePort, ServicePortName};
use kube_nlproxy::modes::nftables::NftablesProxier;
use kube_nlproxy::proxy::runner::{run, Timing};
use kube_nlproxy::proxy::ProxierConfig;
use kube_nlproxy::serve::admin::{self, Shared};
use kube_nlproxy::serve::metrics::Metrics;
use kube_nlproxy::serve::proxy_health::ProxyHealth;
use tokio::sync::watch;

/// The fake kernel, with a switch that makes every transaction fail.
struct Switchable {
    fake: FakeNftables,
    fail: Arc<AtomicBool>,
}

impl Nftables for Switchable {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Rejected {
                op: "test".into(),
                errno: libc_enomem(),
                reason: None,
            });
        }
        self.fake.apply(tx)
    }
    fn list_tables(&mut self, f: Family) -> Result<Vec<ListedTable>, Error> {
        self.fake.list_tables(f)
    }
    fn list_chains(&mut self, f: Family, t: &str) -> Result<Vec<String>, Error> {
        self.fake.list_chains(f, t)
    }
    fn list_sets(&mut self, f: Family, t: &str) -> Result<Vec<String>, Error> {
        self.fake.list_sets(f, t)
    }
    fn list_rule_jumps(
        &mut self,
        f: Family,
        t: &str,
    ) -> Result<Vec<kube_nlproxy::kernel::nft::decode::RuleJumps>, Error> {
        self.fake.list_rule_jumps(f, t)
    }
}

fn libc_enomem() -> i32 {
    12
}

fn state(n_eps: usize, being_deleted: bool) -> ProxyState {
    let spn = ServicePortName {
        namespace: "ns".into(),
        name: "svc".into(),
        port: "p".into(),
        protocol: Protocol::Tcp,
    };
    let mut st = ProxyState {
        node: NodeInfo {
            name: "node1".into(),
            being_deleted,
            ..Default::default()
        },
        ..Default::default()
    };
    st.services.insert(
        spn.clone(),
        ServicePort::new(spn.clone(), "10.96.0.1".parse().unwrap(), 80).into(),
    );
    let eps: Vec<Endpoint> = (0..n_eps)
        .map(|i| Endpoint::ready(format!("10.244.0.{}", i + 1).parse().unwrap(), 80, true))
        .collect();
    st.endpoints.insert(spn, eps.into());
    st
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let code = r.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = r
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

async fn wait_code(addr: SocketAddr, path: &str, want: u16, within: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let (code, body) = tokio::task::spawn_blocking({
            let p = path.to_string();
            move || get(addr, &p)
        })
        .await
        .unwrap();
        if code == want {
            return body;
        }
        assert!(
            t0.elapsed() < within,
            "{path} stayed {code} (wanted {want}): {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first sample of `name` (with any labels, e.g. the IPv4 one of an `ip_family` family).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_sync_failures_and_node_eligibility() {
    let shared = Shared {
        health: Arc::new(Mutex::new(ProxyHealth::new(Duration::from_secs(2)))),
        metrics: Arc::new(Metrics::new()),
        configz: Arc::new(serde_json::json!({"kind": "KubeProxyConfiguration"})),
        proxy_mode: "iptables".into(),
        listeners: Default::default(),
        zpages: Default::default(),
        localhost_accepted: Default::default(),
        localhost_metrics: None,
        synced_state: Default::default(),
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let hz = admin::serve(any, "healthz", admin::healthz_router(shared.clone()))
        .await
        .unwrap();
    let mx = admin::serve(any, "metrics", admin::metrics_router(shared.clone()))
        .await
        .unwrap();
    let fail = Arc::new(AtomicBool::new(false));
    let backend = Switchable {
        fake: FakeNftables::new(),
        fail: fail.clone(),
    };
    let syncer = NftablesProxier::new(
        backend,
        ProxierConfig::default(),
        DetectLocal::ClusterCidr(vec![]),
    );
    // The first state carries an EndpointSlice change time 3 s ago: once synced it is
    // observed as network programming latency.
    let mut first = state(1, false);
    let spn = first.services.keys().next().unwrap().clone();
    first
        .trigger_times
        .insert(spn, std::time::SystemTime::now() - Duration::from_secs(3));
    let (tx, rx) = watch::channel(Some(Arc::new(first)));
    let timing = Timing {
        min_sync_period: Duration::from_millis(100),
        sync_period: Duration::from_secs(1),
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let loop_task = tokio::spawn(async move {
        let mut hooks = Hooks::new(shared);
        run(syncer, rx, timing, &mut hooks, None, async {
            let _ = stop_rx.await;
        })
        .await;
    });

    // Healthy while starting up; wait for the first sync to be recorded.
    let t0 = Instant::now();
    let v: serde_json::Value = loop {
        let body = wait_code(hz, "/healthz", 200, Duration::from_secs(5)).await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["lastUpdated"] != "" {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never synced: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(v["healthy"], true);
    assert_eq!(v["nodeEligible"], true);
    assert!(v["lastUpdated"].as_str().unwrap().ends_with('Z'), "{v}");
    assert!(v["currentTime"].as_str().is_some());
    assert_eq!(v["status"]["IPv4"]["healthy"], true);

    // Syncs start failing: after the timeout (2 s) both endpoints report unhealthy.
    fail.store(true, Ordering::SeqCst);
    tx.send(Some(Arc::new(state(2, false)))).unwrap();
    let body = wait_code(hz, "/healthz", 503, Duration::from_secs(6)).await;
    assert!(body.contains("\"healthy\":false"), "{body}");
    wait_code(hz, "/livez", 503, Duration::from_secs(1)).await;
    let m = tokio::task::spawn_blocking(move || get(mx, "/metrics"))
        .await
        .unwrap()
        .1;
    assert!(
        metric(
            &m,
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
        ) >= 1.0,
        "{m}"
    );
    assert!(
        metric(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") >= 1.0,
        "{m}"
    );

    // A good sync brings it back.
    fail.store(false, Ordering::SeqCst);
    wait_code(hz, "/healthz", 200, Duration::from_secs(6)).await;

    // A node being deleted: /healthz says ineligible, /livez stays healthy.
    tx.send(Some(Arc::new(state(2, true)))).unwrap();
    let body = wait_code(hz, "/healthz", 503, Duration::from_secs(3)).await;
    assert!(body.contains("\"nodeEligible\":false"), "{body}");
    wait_code(hz, "/livez", 200, Duration::from_secs(1)).await;

    let m = tokio::task::spawn_blocking(move || get(mx, "/metrics"))
        .await
        .unwrap()
        .1;
    assert!(
        metric(&m, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 3.0,
        "{m}"
    );
    assert!(
        metric(&m, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") >= 2.0,
        "{m}"
    );
    assert!(
        metric(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_total") >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"),
        0.0
    );
    assert!(metric(&m, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 1.7e9);
    assert!(
        m.contains("kubeproxy_proxy_healthz_total{code=\"503\"}"),
        "{m}"
    );
    assert!(
        m.contains("kubeproxy_proxy_livez_total{code=\"200\"}"),
        "{m}"
    );
    assert!(metric(&m, "process_resident_memory_bytes") > 0.0);
    assert_eq!(
        metric(&m, "kubeproxy_network_programming_duration_seconds_count"),
        1.0,
        "observed once per trigger time"
    );
    assert!(metric(&m, "kubeproxy_network_programming_duration_seconds_sum") >= 3.0);
    let (code, body) = tokio::task::spawn_blocking(move || get(mx, "/configz"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("KubeProxyConfiguration"), "{body}");
    // The rest of upstream's metrics mux.
    for (path, want) in [
        ("/proxyMode", "iptables"),
        ("/healthz", "ok"),
        (
            "/metrics/slis",
            "kubernetes_healthcheck{name=\"ping\",type=\"healthz\"} 1",
        ),
    ] {
        let (code, body) = tokio::task::spawn_blocking(move || get(mx, path))
            .await
            .unwrap();
        assert_eq!(code, 200, "{path}");
        assert!(body.contains(want), "{path}: {body}");
    }
    assert!(
        m.contains("kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"}"),
        "{m}"
    );
    let _ = stop_tx.send(());
    loop_task.await.unwrap();
}

/// GET with an Accept header: (status, head, body).
fn get_accept(addr: SocketAddr, path: &str, accept: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let accept = if accept.is_empty() {
        String::new()
    } else {
        format!("Accept: {accept}\r\n")
    };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let code = r.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
    (code, head.to_ascii_lowercase(), body.to_string())
}

fn zpages_shared(statusz: bool, flagz: bool) -> Shared {
    let flags: std::collections::BTreeMap<String, String> =
        [("proxy-mode", "nftables"), ("v", "2")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    Shared {
        health: Arc::new(Mutex::new(ProxyHealth::new(Duration::from_secs(2)))),
        metrics: Arc::new(Metrics::new()),
        configz: Arc::new(serde_json::json!({})),
        proxy_mode: "nftables".into(),
        listeners: Default::default(),
        localhost_accepted: Default::default(),
        localhost_metrics: None,
        synced_state: Default::default(),
        zpages: Arc::new(admin::Zpages {
            statusz: statusz.then(|| kube_nlproxy::serve::zpages::StatuszInfo {
                start: std::time::SystemTime::now(),
                go_version: "none".into(),
                binary_version: "1.37.0+kube-nlproxy".into(),
                emulation_version: "1.37".into(),
                paths: vec!["/configz".into(), "/flagz".into(), "/metrics".into()],
            }),
            flagz: flagz.then_some(flags),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statusz_and_flagz_negotiate_text_and_structured_forms() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mx = admin::serve(
        any,
        "metrics",
        admin::metrics_router(zpages_shared(true, true)),
    )
    .await
    .unwrap();
    let ask = |path: &'static str, accept: &'static str| {
        tokio::task::spawn_blocking(move || get_accept(mx, path, accept))
    };
    let (code, head, body) = ask("/statusz", "").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: text/plain; charset=utf-8"),
        "{head}"
    );
    assert!(
        body.starts_with(
            "\nkube-proxy statusz\nWarning: This endpoint is not meant to be machine parseable"
        ),
        "{body}"
    );
    for field in [
        "Started",
        "Up",
        "Go version",
        "Binary version",
        "Emulation version",
        "Paths",
    ] {
        assert!(
            body.lines().any(|l| l.starts_with(field)),
            "{field} missing: {body}"
        );
    }

    let (code, head, body) = ask(
        "/statusz",
        "application/json;g=config.k8s.io;v=v1beta1;as=Statusz",
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: application/json;g=config.k8s.io;v=v1beta1;as=statusz"),
        "{head}"
    );
    assert!(!head.contains("warning:"), "{head}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Statusz");
    assert_eq!(v["apiVersion"], "config.k8s.io/v1beta1");
    assert_eq!(v["metadata"]["name"], "kube-proxy");
    assert_eq!(v["emulationVersion"], "1.37");
    assert_eq!(
        v["paths"],
        serde_json::json!(["/configz", "/flagz", "/metrics"])
    );

    // v1alpha1 still answers, with upstream's deprecation warning.
    let (code, head, _) = ask(
        "/statusz",
        "application/json;g=config.k8s.io;v=v1alpha1;as=Statusz",
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    assert!(
        head.contains("warning: 299 - \"this version of the statusz endpoint is deprecated"),
        "{head}"
    );

    // JSON without the target kind is refused as upstream refuses it.
    let (code, _, body) = ask("/statusz", "application/json").await.unwrap();
    assert_eq!(code, 406);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["reason"], "NotAcceptable");

    let (code, _, body) = ask("/flagz", "text/plain").await.unwrap();
    assert_eq!(code, 200);
    assert!(body.starts_with("\nkube-proxy flagz\n"), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("proxy-mode") && l.ends_with("nftables")),
        "{body}"
    );

    let (code, _, body) = ask(
        "/flagz",
        "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz",
    )
    .await
    .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("kind: Flagz\n"), "{body}");
    assert!(body.contains("  proxy-mode: nftables\n"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statusz_and_flagz_are_not_found_with_their_gates_off() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mx = admin::serve(
        any,
        "metrics",
        admin::metrics_router(zpages_shared(false, false)),
    )
    .await
    .unwrap();
    for path in ["/statusz", "/flagz"] {
        let (code, _) = tokio::task::spawn_blocking(move || get(mx, path))
            .await
            .unwrap();
        assert_eq!(code, 404, "{path}");
    }
}
