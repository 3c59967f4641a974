//! The Kubernetes API source against a real HTTP server speaking list/watch (no mocked
//! client): changes reach the kernel (checked with packets), dropped watches resume without a
//! relist, a 410 relist applies a deletion made while disconnected, node labels switch
//! topology-aware routing, an API outage leaves the rules working, a server that ignores
//! streaming lists is listed, and the first sync waits for this node's Node.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use netlink_tests::apiserver::obj::{self, slice_endpoint};
use netlink_tests::apiserver::ApiServer;
use netlink_tests::backend::{tcp_probes, Reply};
use netlink_tests::cluster::{sa, Cluster, Daemon};
use netlink_tests::scenario::{web_cluster, Backends};

/// pod 0 = A (10.244.1.2, zone-a), pod 1 = client; remote endpoint 10.244.2.2 (zone-b).
fn setup() -> (Cluster, ApiServer) {
    let c = web_cluster(Backends::default());
    let api = c.node.run(ApiServer::start);
    api.apply(obj::node("node1", "zone-a"));
    api.apply(obj::service("default", "web", "10.96.0.10", 80));
    api.apply(obj::slice(
        "default",
        "web",
        "web-1",
        8080,
        &[
            slice_endpoint("10.244.1.2")
                .node("node1")
                .zone_hint("zone-a"),
            slice_endpoint("10.244.2.2")
                .node("node2")
                .zone_hint("zone-b"),
        ],
    ));
    (c, api)
}

fn start(c: &Cluster, api: &ApiServer) -> Daemon {
    c.start_daemon_with(&["--master", &api.url()])
}

fn answered(c: &Cluster, ip: &str, n: usize) -> BTreeSet<String> {
    tcp_probes(&c.pods[1], sa(ip, 80), n)
        .into_iter()
        .map(|r| match r {
            Reply::Answered { name, .. } => name,
            other => format!("{other:?}"),
        })
        .collect()
}

fn wait(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < within, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn watch_changes_drops_relists_and_node_labels() {
    let (c, api) = setup();
    let d = start(&c, &api);
    // Topology: this node is in zone-a, both endpoints have hints: only zone-a is used.
    assert_eq!(answered(&c, "10.96.0.10", 12), ["local".to_string()].into());
    wait("the Starting event", Duration::from_secs(10), || {
        api.events()
            .iter()
            .any(|e| e["reason"] == "Starting" && e["regarding"]["name"] == "node1")
    });
    // Upstream's conventions: reporter "kube-proxy", instance "kube-proxy-HOST", actions.
    let events = api.events();
    let starting = events.iter().find(|e| e["reason"] == "Starting").unwrap();
    assert_eq!(starting["reportingController"], "kube-proxy", "{starting}");
    assert!(
        starting["reportingInstance"]
            .as_str()
            .is_some_and(|i| i.starts_with("kube-proxy-")),
        "{starting}"
    );
    assert_eq!(starting["action"], "StartKubeProxy", "{starting}");
    assert_eq!(starting["type"], "Normal");
    // Our API client's requests, as client-go's metrics.
    let metrics = c.node.run(|| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect("127.0.0.1:10249").expect("metrics server");
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut t = String::new();
        let _ = s.read_to_string(&mut t);
        t
    });
    assert!(
        metrics
            .contains("rest_client_requests_total{code=\"200\",method=\"GET\",host=\"127.0.0.1:"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rest_client_request_duration_seconds_bucket{"),
        "{metrics}"
    );
    wait(
        "the KubeProxyDefaultMode warning",
        Duration::from_secs(10),
        || {
            api.events().iter().any(|e| {
                e["reason"] == "KubeProxyDefaultMode"
                    && e["type"] == "Warning"
                    && e["action"] == "StartKubeProxy"
            })
        },
    );
    // Two Services claiming one externalIP:port: the older owns it, a Warning event on both.
    let mut older = obj::service("default", "claim-old", "10.96.0.31", 80);
    older["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z".into();
    older["spec"]["externalIPs"] = serde_json::json!(["192.0.2.77"]);
    let mut newer = obj::service("default", "claim-new", "10.96.0.32", 80);
    newer["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z".into();
    newer["spec"]["externalIPs"] = serde_json::json!(["192.0.2.77"]);
    api.apply(newer);
    api.apply(older);
    let t0 = Instant::now();
    let conflict_events = || {
        let ev = api.events();
        ["claim-old", "claim-new"].iter().all(|n| {
            ev.iter().any(|e| {
                e["reason"] == "ConflictingServicePort"
                    && e["regarding"]["name"] == *n
                    && e["note"].as_str().is_some_and(|t| {
                        t.contains("default/claim-old") && t.contains("gets that traffic")
                    })
            })
        })
    };
    while !conflict_events() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no conflict events:\n{}\nevents: {:#?}",
            d.log_text(),
            api.events()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // While the collision lasts, the states that follow do not log it again.
    api.apply(obj::service("default", "claim-probe", "10.96.0.33", 80));
    c.wait_ruleset("ip", "claim-probe programmed", |r| r.contains("10.96.0.33"));
    let log = d.log_text();
    assert_eq!(
        log.matches("both claim 192.0.2.77:80/tcp").count(),
        1,
        "logged once:\n{log}"
    );
    api.delete("Service", "default", "claim-probe");
    api.delete("Service", "default", "claim-old");
    api.delete("Service", "default", "claim-new");
    // The Node moves to zone-b: a full sync switches routing to the zone-b endpoint.
    api.apply(obj::node("node1", "zone-b"));
    wait("routing to zone-b", Duration::from_secs(10), || {
        answered(&c, "10.96.0.10", 8) == ["remote".to_string()].into()
    });

    // Add, update and delete a Service and its slice.
    api.apply(obj::service("default", "api2", "10.96.0.20", 80));
    api.apply(obj::slice(
        "default",
        "api2",
        "api2-1",
        8080,
        &[slice_endpoint("10.244.1.2").node("node1")],
    ));
    wait("api2 served", Duration::from_secs(10), || {
        answered(&c, "10.96.0.20", 3) == ["local".to_string()].into()
    });
    api.apply(obj::slice(
        "default",
        "api2",
        "api2-1",
        8080,
        &[slice_endpoint("10.244.2.2").node("node2")],
    ));
    wait("api2 endpoint replaced", Duration::from_secs(10), || {
        answered(&c, "10.96.0.20", 3) == ["remote".to_string()].into()
    });
    api.delete("Service", "default", "api2");
    c.wait_ruleset("ip", "api2 removed", |r| !r.contains("10.96.0.20"));

    // A watch dropped mid-stream resumes from its resourceVersion: no new LIST.
    let lists = api.lists("services");
    let watches = api.watches("services");
    api.drop_watches();
    api.apply(obj::service("default", "api3", "10.96.0.30", 80));
    c.wait_ruleset("ip", "api3 after the drop", |r| r.contains("10.96.0.30"));
    assert_eq!(api.lists("services"), lists, "resumed without a relist");
    assert!(api.watches("services") > watches, "a new watch was opened");

    // Disconnected while api3 is deleted and the history compacted: the resume gets
    // 410 Gone, the relist no longer contains api3, and that deletion reaches the kernel.
    api.refuse_watches();
    api.drop_watches();
    std::thread::sleep(Duration::from_millis(300));
    api.delete("Service", "default", "api3");
    api.compact();
    api.allow_watches();
    c.wait_ruleset("ip", "api3 removed by the relist", |r| {
        !r.contains("10.96.0.30")
    });
    assert!(api.lists("services") > lists, "a 410 forces a relist");
    assert!(
        api.watch_lists("services") >= 2,
        "the first list and the 410 relist are streaming lists"
    );
    // Nothing else was lost on the way.
    assert_eq!(answered(&c, "10.96.0.10", 4), ["remote".to_string()].into());
    assert!(d.log_text().contains("synced"));
}

/// A server that refuses streaming lists (no WatchList feature: before 1.32, or 1.33 by
/// default) is listed then watched, as client-go's reflector falls back.
#[test]
fn a_server_without_watch_list_is_listed_then_watched() {
    let (c, api) = setup();
    api.without_watch_list();
    let d = start(&c, &api);
    assert_eq!(answered(&c, "10.96.0.10", 6), ["local".to_string()].into());
    api.apply(obj::service("default", "api4", "10.96.0.40", 80));
    c.wait_ruleset("ip", "api4 through the watch", |r| r.contains("10.96.0.40"));
    assert_eq!(api.watch_lists("services"), 0);
    assert!(api.lists("services") >= 1);
    let log = d.log_text();
    assert!(
        log.lines().any(
            |l| l.contains("the API server does not serve streaming lists")
                && l.contains("kind=\"Services\"")
                && l.contains("HTTP 422, reason Invalid")
        ),
        "{log}"
    );
}

/// A server that ignores `sendInitialEvents` (before 1.27, or a proxy or aggregator that
/// drops the parameter) sends the objects but never the end of the initial events: each
/// kind is listed then watched after a bounded wait, said in one line per kind, and the
/// first sync has the whole state. While it waits, a line names the kinds still missing.
fn ignored_watch_list_falls_back(bookmarks: bool) {
    let (c, api) = setup();
    api.ignoring_watch_list(bookmarks);
    let t0 = Instant::now();
    // The daemon helper's wait is bounded (60 s); ours: 10 s quiet + a 5 s log period.
    let d = start(&c, &api);
    assert!(
        t0.elapsed() < Duration::from_secs(45),
        "first sync took {:?}",
        t0.elapsed()
    );
    // The full state: the Service, its slice and the Node's zone (only zone-a is used).
    assert_eq!(answered(&c, "10.96.0.10", 6), ["local".to_string()].into());
    let log = d.log_text();
    for kind in ["Services", "EndpointSlices", "Nodes"] {
        assert!(
            log.lines()
                .any(|l| l.contains("never ended the streaming list")
                    && l.contains(&format!("kind=\"{kind}\""))),
            "no fallback line for {kind}:\n{log}"
        );
    }
    assert!(
        log.lines()
            .any(|l| l.contains("waiting for the initial list")
                && l.contains("Services, EndpointSlices, Nodes")),
        "{log}"
    );
    assert!(api.lists("services") >= 1, "listed after the fallback");
    // And watched: a change arrives.
    api.apply(obj::service("default", "api5", "10.96.0.50", 80));
    c.wait_ruleset("ip", "api5 through the watch", |r| r.contains("10.96.0.50"));
}

#[test]
fn a_server_ignoring_watch_list_with_bookmarks_is_listed_then_watched() {
    ignored_watch_list_falls_back(true);
}

#[test]
fn a_server_ignoring_watch_list_without_bookmarks_is_listed_then_watched() {
    ignored_watch_list_falls_back(false);
}

/// Upstream waits for its Node (it needs the node's IPs): the first sync waits for it too,
/// saying so with the name it looks for, then programs with the Node's addresses.
#[test]
fn the_first_sync_waits_for_this_nodes_node_object() {
    let c = web_cluster(Backends::default());
    let api = c.node.run(ApiServer::start);
    let mut svc = obj::service("default", "web", "10.96.0.10", 80);
    svc["spec"]["type"] = "NodePort".into();
    svc["spec"]["ports"][0]["nodePort"] = 30080.into();
    api.apply(svc);
    api.apply(obj::slice(
        "default",
        "web",
        "web-1",
        8080,
        &[slice_endpoint("10.244.1.2").node("node1")],
    ));
    // NodePorts on the node's primary address: its Node's InternalIP, once known.
    let d = c.spawn_daemon_with(&["--master", &api.url(), "--nodeport-addresses", "primary"]);
    d.wait_for_log("waiting for this node's Node object", 1);
    let log = d.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("waiting for this node's Node object")
                && l.contains("node=\"node1\"")),
        "{log}"
    );
    assert!(!log.contains("synced"), "no sync before the Node:\n{log}");
    api.apply(obj::node("node1", "zone-a"));
    d.wait_for_log("synced", 1);
    assert!(
        c.ruleset("ip").contains("192.168.50.1"),
        "the Node's address:\n{}",
        c.ruleset("ip")
    );
    assert_eq!(answered(&c, "10.96.0.10", 3), ["local".to_string()].into());
}

#[test]
fn api_outage_keeps_rules_and_recovers() {
    let (c, mut api) = setup();
    let _d = start(&c, &api);
    assert_eq!(answered(&c, "10.96.0.10", 6), ["local".to_string()].into());
    api.stop();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        assert_eq!(
            answered(&c, "10.96.0.10", 2),
            ["local".to_string()].into(),
            "rules keep working during the outage"
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    api.restart();
    api.apply(obj::service("default", "after", "10.96.0.40", 80));
    api.apply(obj::slice(
        "default",
        "after",
        "after-1",
        8080,
        &[slice_endpoint("10.244.1.2").node("node1")],
    ));
    wait("recovery after the outage", Duration::from_secs(60), || {
        answered(&c, "10.96.0.40", 2) == ["local".to_string()].into()
    });
}

#[test]
fn config_sync_period_republishes_the_watched_state() {
    let (c, api) = setup();
    let d = c.start_daemon_with(&["--master", &api.url(), "--config-sync-period", "1s"]);
    let before = d.log_text().matches("] \"synced\"").count();
    d.wait_for_log("] \"synced\"", before + 2);
    // Nothing changed, so the resyncs send nothing to the kernel.
    let text = d.log_text();
    let last = text.lines().rfind(|l| l.contains("] \"synced\"")).unwrap();
    assert!(
        last.contains("ipv4_ops=0 ") && last.contains("ipv6_ops=0 ") && last.contains("full=false"),
        "{last}"
    );
}

/// One Service with a field of the wrong type (`port: "eighty"`, as a newer API server's
/// schema could send) is skipped with a warning naming it; every other object applies, at
/// start-up and on later watch events, and the client does not dump response bodies.
#[test]
fn an_undecodable_object_is_skipped_and_the_rest_programmed() {
    // Protobuf asked for, as upstream's default; this server answers JSON anyway, as one
    // that offers nothing else: our watcher reads the JSON.
    undecodable_skipped(&[], "application/vnd.kubernetes.protobuf, */*");
}

/// The same with JSON asked for (`Accept` as client-go's).
#[test]
fn with_json_asked_for_an_undecodable_object_is_skipped_too() {
    undecodable_skipped(
        &["--kube-api-content-type", "application/json"],
        "application/json, */*",
    );
}

fn undecodable_skipped(args: &[&str], accept: &str) {
    let (c, api) = setup();
    let mut bad = obj::service("default", "broken", "10.96.0.30", 80);
    bad["spec"]["ports"][0]["port"] = "eighty".into();
    api.apply(bad.clone());
    let url = api.url();
    let d = c.start_daemon_with(&[&["--master", url.as_str()], args].concat());
    wait("the good Service", Duration::from_secs(20), || {
        !answered(&c, "10.96.0.10", 4).is_empty() && c.ruleset("ip").contains("10.96.0.10")
    });
    d.wait_for_log(
        r#""cannot decode an object" kind="Service" object="default/broken""#,
        1,
    );
    // A later watch event with another bad object does not stop the next good change.
    bad["metadata"]["name"] = "broken2".into();
    api.apply(bad);
    api.apply(obj::service("default", "api3", "10.96.0.40", 80));
    c.wait_ruleset("ip", "api3 programmed", |r| r.contains("10.96.0.40"));
    d.wait_for_log(
        r#""cannot decode an object" kind="Service" object="default/broken2""#,
        1,
    );
    let log = d.log_text();
    assert!(
        !c.ruleset("ip").contains("10.96.0.30"),
        "the broken one is not"
    );
    assert!(
        !log.contains("\"kind\":\"ServiceList\""),
        "no response bodies: {log}"
    );
    let accepts = api.accepts();
    assert!(!accepts.is_empty());
    assert!(accepts.iter().all(|a| a == accept), "{accepts:?}");
}

/// ServiceCIDR objects reach the kernel: traffic to an unallocated address inside them is
/// dropped once one exists, and not before. An API server without ServiceCIDRs (404, before
/// 1.33) holds nothing back.
#[test]
fn service_cidr_objects_drop_unallocated_addresses() {
    let (c, api) = setup();
    let d = start(&c, &api);
    assert!(!answered(&c, "10.96.0.10", 4).is_empty());
    assert!(
        !c.ruleset("ip").contains("unallocated"),
        "no ServiceCIDR yet: nothing dropped"
    );
    api.apply(obj::service_cidr("kubernetes", &["10.96.0.0/16"]));
    c.wait_ruleset("ip", "the unallocated-address drop", |r| {
        r.contains("ip daddr 10.96.0.0/16 drop")
    });
    let r = netlink_tests::backend::tcp_probe(&c.pods[1], sa("10.96.0.77", 80));
    assert!(matches!(r, Reply::Timeout), "{r:?}");
    drop(d);
    let (c2, api2) = setup();
    api2.without_service_cidrs();
    let d2 = start(&c2, &api2);
    assert!(
        !answered(&c2, "10.96.0.10", 4).is_empty(),
        "{}",
        d2.log_text()
    );
    d2.wait_for_log("ServiceCIDRs cannot be listed", 1);
}

/// With detect-local-mode NodeCIDR the first sync also waits for the Node's podCIDRs (as
/// upstream's NodeManager does), naming the node, then detects local traffic by them.
#[test]
fn with_node_cidr_detection_the_first_sync_waits_for_the_pod_cidrs() {
    let c = web_cluster(Backends::default());
    let api = c.node.run(ApiServer::start);
    api.apply(obj::service("default", "web", "10.96.0.10", 80));
    api.apply(obj::slice(
        "default",
        "web",
        "web-1",
        8080,
        &[slice_endpoint("10.244.1.2").node("node1")],
    ));
    api.apply(obj::node("node1", "zone-a"));
    let d = c.spawn_daemon_with(&["--master", &api.url(), "--detect-local-mode", "NodeCIDR"]);
    d.wait_for_log("waiting for this node's podCIDRs", 1);
    let log = d.log_text();
    assert!(
        !log.contains("synced"),
        "no sync before the podCIDRs:\n{log}"
    );
    let mut node = obj::node("node1", "zone-a");
    node["spec"] = serde_json::json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]});
    api.apply(node);
    d.wait_for_log("synced", 1);
    assert!(
        c.ruleset("ip").contains("10.244.1.0/24"),
        "local traffic detected by the podCIDR:\n{}",
        c.ruleset("ip")
    );
    assert_eq!(answered(&c, "10.96.0.10", 3), ["local".to_string()].into());
}
