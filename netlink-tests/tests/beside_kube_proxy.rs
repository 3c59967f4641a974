//! Issue #55.1: ours beside upstream kube-proxy on one node, one Service at a time. Upstream
//! kube-proxy v1.37.2 (its own binary, in nftables mode and in iptables mode; its IPVS mode
//! needs the VM's kernel) serves every Service without the
//! `service.kubernetes.io/service-proxy-name` label; ours, with `--service-proxy-name
//! kube-nlproxy`, serves only those labelled so. Both program the same node namespace, both
//! watch one real kube-apiserver. Real packets say who answered; an established connection
//! must survive its Service's move from one proxy to the other and back; neither proxy's
//! start, nor ours' `--cleanup`, may touch the other's rules.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};

use netlink_tests::backend::{tcp_probe, OpenConn, Reply};
use netlink_tests::cluster::NODE_IP;
use netlink_tests::controlplane::ControlPlane;
use netlink_tests::differential::Upstream;
use netlink_tests::ns::{require_root, NetNs};

const LABEL: &str = "service.kubernetes.io/service-proxy-name";
const OURS: &str = "kube-nlproxy";
/// Ours' servers, clear of upstream's 10256 and 10249 on the same node.
const OURS_HEALTHZ: &str = "127.0.0.1:10356";
const OURS_METRICS: &str = "127.0.0.1:10349";
/// How long either proxy may take to follow a change through the API server.
const FOLLOW: Duration = Duration::from_secs(30);

/// Creates this node's Node and a Service `name` at `cluster_ip`:80 (labelled for ours when
/// `ours`), with one slice whose endpoint is `backend`:8080 on this node.
fn create(
    cp: &ControlPlane,
    ns: &NetNs,
    name: &'static str,
    cluster_ip: &'static str,
    backend: &'static str,
    ours: bool,
) {
    cp.with_admin(ns, move |client| {
        Box::pin(async move {
            let pp = PostParams::default();
            let nodes = Api::<Node>::all(client.clone());
            if nodes.get_opt("node1").await.unwrap().is_none() {
                let node: Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "node1"},
                    "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
                }))
                .unwrap();
                nodes.create(&pp, &node).await.unwrap();
            }
            let labels = if ours {
                serde_json::json!({ LABEL: OURS })
            } else {
                serde_json::json!({})
            };
            let svc: Service = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            }))
            .unwrap();
            Api::<Service>::namespaced(client.clone(), "default")
                .create(&pp, &svc)
                .await
                .unwrap();
            // The EndpointSlice controller copies the Service's labels onto its slices; there
            // is none here, so the test does.
            let mut slice_labels = labels.clone();
            slice_labels["kubernetes.io/service-name"] = name.into();
            let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{name}-1"), "namespace": "default", "labels": slice_labels},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [backend], "nodeName": "node1", "conditions": {"ready": true}}],
            }))
            .unwrap();
            Api::<EndpointSlice>::namespaced(client, "default")
                .create(&pp, &slice)
                .await
                .unwrap();
        })
    });
}

/// Labels `name` and its slice for ours (`Some`) or takes the label off (`None`).
fn relabel(cp: &ControlPlane, ns: &NetNs, name: &'static str, proxy: Option<&'static str>) {
    relabel_service(cp, ns, name, proxy);
    relabel_slice(cp, ns, name, proxy);
}

/// [`relabel`] of the Service alone: the EndpointSlice controller follows a moment later.
fn relabel_service(cp: &ControlPlane, ns: &NetNs, name: &'static str, proxy: Option<&'static str>) {
    cp.with_admin(ns, move |client| {
        Box::pin(async move {
            let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": { LABEL: proxy }}}));
            Api::<Service>::namespaced(client, "default")
                .patch(name, &PatchParams::default(), &patch)
                .await
                .unwrap();
        })
    });
}

/// [`relabel`] of the Service's slice alone, as the EndpointSlice controller does.
fn relabel_slice(cp: &ControlPlane, ns: &NetNs, name: &'static str, proxy: Option<&'static str>) {
    cp.with_admin(ns, move |client| {
        Box::pin(async move {
            let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": { LABEL: proxy }}}));
            Api::<EndpointSlice>::namespaced(client, "default")
                .patch(&format!("{name}-1"), &PatchParams::default(), &patch)
                .await
                .unwrap();
        })
    });
}

/// Waits until `what` holds, bounded by [`FOLLOW`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool, log: &dyn Fn() -> String) {
    let t0 = Instant::now();
    while !done() {
        assert!(
            t0.elapsed() < FOLLOW,
            "not within {FOLLOW:?}: {what}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `nft list table ip NAME` in the node (empty when there is none).
fn table(ns: &NetNs, name: &str) -> String {
    String::from_utf8_lossy(&ns.output("nft", &["list", "table", "ip", name]).stdout).into_owned()
}

/// Upstream's rules in `mode`, as text: its nftables table, or its iptables nat table
/// (`iptables-save`, the same `iptables` upstream itself runs).
fn upstream_rules(ns: &NetNs, mode: &str) -> String {
    match mode {
        "nftables" => table(ns, "kube-proxy"),
        _ => {
            String::from_utf8_lossy(&ns.output("iptables-save", &["-t", "nat"]).stdout).into_owned()
        }
    }
}

#[test]
fn ours_serves_only_its_labelled_services_beside_upstream_kube_proxy_in_nftables_mode() {
    ours_serves_only_its_labelled_services_beside("nftables");
}

/// Upstream's iptables mode (Debian's `iptables`, nft-backed, in its own tables) has no
/// reject for unallocated ClusterIPs; its `KUBE-SERVICES` jumps share the nat hooks with
/// ours' DNAT chains, and neither side may take the other's ClusterIPs or connections.
#[test]
fn ours_serves_only_its_labelled_services_beside_upstream_kube_proxy_in_iptables_mode() {
    ours_serves_only_its_labelled_services_beside("iptables");
}

fn ours_serves_only_its_labelled_services_beside(mode: &str) {
    require_root();
    let (c, client) = netlink_tests::scenario::beside_cluster();
    let cp = ControlPlane::start(&c.node);
    create(&cp, &c.node, "theirs", "10.96.0.20", "10.244.1.2", false);
    create(&cp, &c.node, "moved", "10.96.0.30", "10.244.1.3", true);
    let admin = cp.admin_kubeconfig();
    let kubeconfig = format!("--kubeconfig={}", admin.display());
    let upstream = Upstream::start(&c.node, mode, &[&kubeconfig], &c.dir);
    let upstream_log = || upstream.log_text();
    wait_until(
        "upstream's rules hold theirs",
        || upstream_rules(&c.node, mode).contains("10.96.0.20"),
        &upstream_log,
    );
    let (healthz, metrics) = (
        format!("--healthz-bind-address={OURS_HEALTHZ}"),
        format!("--metrics-bind-address={OURS_METRICS}"),
    );
    let ours_args = [
        kubeconfig.as_str(),
        "--proxy-mode=nftables",
        "--service-proxy-name",
        OURS,
        &healthz,
        &metrics,
    ];
    let ours = c.start_daemon_with(&ours_args);
    let ours_log = || ours.log_text();
    // Each serves its own: upstream's table never names ours' Service and ours' never names
    // upstream's; ours' start left upstream's table alone.
    let theirs_ip: SocketAddr = "10.96.0.20:80".parse().unwrap();
    let moved_ip: SocketAddr = "10.96.0.30:80".parse().unwrap();
    let answered = |dst| tcp_probe(&c.pods[client], dst);
    let by = |r: Reply| r.name().map(str::to_string);
    wait_until(
        "ours serves moved",
        || by(answered(moved_ip)).as_deref() == Some("ours"),
        &ours_log,
    );
    assert_eq!(
        by(answered(theirs_ip)).as_deref(),
        Some("theirs"),
        "{}",
        upstream_log()
    );
    let ours_table = table(&c.node, "kube-nlproxy");
    assert!(
        ours_table.contains("10.96.0.30") && !ours_table.contains("10.96.0.20"),
        "{ours_table}"
    );
    let upstream_table = upstream_rules(&c.node, mode);
    assert!(
        upstream_table.contains("10.96.0.20") && !upstream_table.contains("10.96.0.30"),
        "{upstream_table}"
    );
    // From the node itself too.
    assert_eq!(by(tcp_probe(&c.node, moved_ip)).as_deref(), Some("ours"));
    assert_eq!(by(tcp_probe(&c.node, theirs_ip)).as_deref(), Some("theirs"));

    // The move back to upstream and over to ours again, with a connection held through it.
    let mut held = OpenConn::open(&c.pods[client], moved_ip);
    assert_eq!(held.greeting.name(), Some("ours"));
    relabel(&cp, &c.node, "moved", None);
    wait_until(
        "upstream serves moved once unlabelled",
        || {
            upstream_rules(&c.node, mode).contains("10.96.0.30")
                && !table(&c.node, "kube-nlproxy").contains("10.96.0.30")
        },
        &ours_log,
    );
    assert_eq!(
        by(answered(moved_ip)).as_deref(),
        Some("ours"),
        "the same backend, now through upstream"
    );
    let echoed = held.echo("after the move to upstream");
    assert_eq!(
        echoed.ok().as_deref(),
        Some("after the move to upstream"),
        "the held connection survives the move to upstream"
    );
    // The Service first, its slice after, as the EndpointSlice controller relabels it: ours
    // has the endpoint at once (it takes every slice), so it never serves the Service
    // without it, which would reject new connections and clear UDP flows until then.
    relabel_service(&cp, &c.node, "moved", Some(OURS));
    wait_until(
        "ours serves moved once labelled again",
        || {
            table(&c.node, "kube-nlproxy").contains("10.96.0.30")
                && !upstream_rules(&c.node, mode).contains("10.96.0.30")
        },
        &ours_log,
    );
    assert_eq!(
        by(answered(moved_ip)).as_deref(),
        Some("ours"),
        "ours serves its endpoint before the slice is relabelled:\n{}",
        ours_log()
    );
    relabel_slice(&cp, &c.node, "moved", Some(OURS));
    let echoed = held.echo("after the move back to ours");
    assert_eq!(
        echoed.ok().as_deref(),
        Some("after the move back to ours"),
        "the held connection survives the move back"
    );

    // Each restarts with a connection held through the other's Service: that connection,
    // and the other's Services, carry on. A restart rewrites the restarted proxy's own rules
    // whole (both flush their own table or chains at their first sync).
    let mut held_theirs = OpenConn::open(&c.pods[client], theirs_ip);
    assert_eq!(held_theirs.greeting.name(), Some("theirs"));
    drop(upstream);
    let mut upstream = Upstream::start(&c.node, mode, &[&kubeconfig], &c.dir);
    wait_until(
        "restarted upstream's first sync",
        || upstream.log_text().contains("SyncProxyRules complete"),
        &|| upstream.log_text(),
    );
    assert_eq!(
        held.echo("after upstream's restart").ok().as_deref(),
        Some("after upstream's restart"),
        "ours' held connection survives upstream's restart"
    );
    assert_eq!(by(answered(moved_ip)).as_deref(), Some("ours"));
    assert_eq!(by(answered(theirs_ip)).as_deref(), Some("theirs"));
    drop(ours);
    let ours = c.start_daemon_with(&ours_args);
    assert_eq!(
        held_theirs.echo("after ours' restart").ok().as_deref(),
        Some("after ours' restart"),
        "upstream's held connection survives ours' restart:\n{}",
        ours.log_text()
    );
    assert_eq!(by(answered(theirs_ip)).as_deref(), Some("theirs"));
    assert_eq!(by(answered(moved_ip)).as_deref(), Some("ours"));
    assert!(
        upstream_rules(&c.node, mode).contains("10.96.0.20"),
        "ours' restart left upstream's rules alone"
    );

    // Ours' --cleanup removes its own table only.
    drop(ours);
    let out = c.node.output(
        netlink_tests::cluster::proxy_bin().to_str().unwrap(),
        &["--cleanup", "--service-proxy-name", OURS],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(table(&c.node, "kube-nlproxy").is_empty());
    assert!(
        upstream_rules(&c.node, mode).contains("10.96.0.20"),
        "upstream's rules survive ours' --cleanup"
    );
    assert_eq!(by(answered(theirs_ip)).as_deref(), Some("theirs"));
    let running = upstream.child.try_wait().unwrap().is_none();
    assert!(running, "upstream kept running:\n{}", upstream.log_text());
}
