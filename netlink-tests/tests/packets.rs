//! Real packets through the rules kube-nlproxy programs: backends in pod namespaces, clients
//! in pods, on the node and on an external host. Each test builds its own cluster.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use netlink_tests::backend::{
    tcp_backend, tcp_probe, tcp_probe_from, tcp_probes, udp_backend, udp_probe, OpenConn, Reply,
};
use netlink_tests::cluster::{
    sa, yaml, Cluster, EXT_IP, EXT_IP6, EXT_IP_OTHER, NODE_IP, NODE_IP6, POD_GW,
};
use netlink_tests::scenario::{self, dns_yaml, names, peer, Backends, LOCAL_EP, REMOTE_EP};

/// The shared scenario, dual-stack: pods A (local endpoint) and B (client), the remote
/// endpoint on node2, `default/web` on 10.96.0.10 and fd00:96::10.
fn web_cluster() -> Cluster {
    scenario::web_cluster(Backends {
        ipv6: true,
        udp: false,
    })
}

fn web_yaml(extra_spec: &str) -> String {
    scenario::web_yaml_with(extra_spec, &[LOCAL_EP, REMOTE_EP], true)
}

#[test]
fn cluster_ip_spreads_over_all_endpoints_and_keeps_pod_source() {
    let c = web_cluster();
    c.sync_once(&web_yaml(""), &[]);
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 40);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "{replies:?}"
    );
    for r in &replies {
        assert_eq!(peer(r), "10.244.1.3", "pod source address must be kept");
    }
}

#[test]
fn ipv6_cluster_ip_and_node_port() {
    let c = web_cluster();
    c.sync_once(&web_yaml(""), &[]);
    let replies = tcp_probes(&c.pods[1], sa("fd00:96::10", 80), 30);
    assert_eq!(
        names(&replies),
        ["local6", "remote6"].map(String::from).into(),
        "{replies:?}"
    );
    assert!(replies.iter().all(|r| peer(r) == "fd00:10:244:1::3"));
    let replies = tcp_probes(&c.ext, sa(NODE_IP6, 30080), 30);
    assert_eq!(
        names(&replies),
        ["local6", "remote6"].map(String::from).into(),
        "{replies:?}"
    );
    assert!(
        replies.iter().all(|r| peer(r) != EXT_IP6),
        "NodePort traffic is masqueraded"
    );
}

#[test]
fn node_port_from_outside_is_masqueraded() {
    let c = web_cluster();
    c.sync_once(&web_yaml(""), &[]);
    let replies = tcp_probes(&c.ext, sa(NODE_IP, 30080), 40);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "{replies:?}"
    );
    for r in &replies {
        assert_ne!(
            peer(r),
            EXT_IP,
            "external client must be masqueraded: {r:?}"
        );
    }
}

#[test]
fn external_traffic_policy_local_keeps_client_address_and_uses_local_endpoints() {
    let c = web_cluster();
    c.sync_once(&web_yaml("externalTrafficPolicy: Local"), &[]);
    let replies = tcp_probes(&c.ext, sa(NODE_IP, 30080), 30);
    assert_eq!(
        names(&replies),
        ["local"].map(String::from).into(),
        "{replies:?}"
    );
    assert!(replies.iter().all(|r| peer(r) == EXT_IP), "{replies:?}");
    // Internal traffic still uses every endpoint.
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 30);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into()
    );
}

#[test]
fn internal_traffic_policy_local_uses_only_local_endpoints() {
    let c = web_cluster();
    c.sync_once(&web_yaml("internalTrafficPolicy: Local"), &[]);
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 30);
    assert_eq!(
        names(&replies),
        ["local"].map(String::from).into(),
        "{replies:?}"
    );
}

#[test]
fn hairpin_pod_reaches_itself_through_its_service() {
    let c = web_cluster();
    c.sync_once(&web_yaml("internalTrafficPolicy: Local"), &[]);
    // pod A is the only local endpoint; it connects to its own Service.
    let r = tcp_probe(&c.pods[0], sa("10.96.0.10", 80));
    assert_eq!(r.name(), Some("local"), "{r:?}");
    assert_eq!(
        peer(&r),
        POD_GW,
        "hairpin traffic is masqueraded to the node's address"
    );
}

#[test]
fn service_without_endpoints_is_refused_at_once() {
    let c = web_cluster();
    let mut y = web_yaml("");
    y += &yaml::service(
        "default",
        "empty",
        &["10.96.0.99"],
        &[("p", "TCP", 8080, 30099)],
        "type: NodePort",
    );
    c.sync_once(&y, &[]);
    for (ns, dst) in [
        (&c.pods[1], sa("10.96.0.99", 8080)),
        (&c.ext, sa(NODE_IP, 30099)),
    ] {
        let t0 = Instant::now();
        let r = tcp_probe(ns, dst);
        assert_eq!(r, Reply::Refused, "to {dst}");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "refused at once, took {:?}",
            t0.elapsed()
        );
    }
    // A port of a ClusterIP that no Service uses is refused too.
    assert_eq!(tcp_probe(&c.pods[1], sa("10.96.0.10", 81)), Reply::Refused);
}

#[test]
fn client_ip_affinity_sticks() {
    let c = web_cluster();
    c.sync_once(
        &web_yaml(
            "sessionAffinity: ClientIP\nsessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}",
        ),
        &[],
    );
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 20);
    assert_eq!(
        names(&replies).len(),
        1,
        "all connections stick to one endpoint: {replies:?}"
    );
    assert!(
        c.ruleset("ip").contains("timeout 1m"),
        "{}",
        c.ruleset("ip")
    );
}

#[test]
fn udp_cluster_ip() {
    let mut c = Cluster::new();
    c.add_pod(2);
    c.add_pod(3);
    udp_backend(&c.pods[0], "dns", sa("10.244.1.2", 53));
    let y = dns_yaml("kube-system", 0, &[LOCAL_EP]);
    c.sync_once(&y, &[]);
    let r = udp_probe(&c.pods[1], sa("10.96.0.53", 53));
    assert_eq!(r.name(), Some("dns"), "{r:?}");
    assert_eq!(peer(&r), "10.244.1.3");
}

#[test]
fn load_balancer_source_ranges_and_external_ips() {
    let c = web_cluster();
    let y = web_yaml(&format!(
        "externalIPs: [192.0.2.10]\nloadBalancerSourceRanges: [{EXT_IP}/32]"
    ))
    .replace(
        "kind: Service\nmetadata: {name: web, namespace: default}\n",
        "kind: Service\nmetadata: {name: web, namespace: default}\nstatus: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}\n",
    );
    c.sync_once(&y, &[]);
    let lb = sa("198.51.100.7", 80);
    assert!(
        tcp_probe_from(&c.ext, EXT_IP.parse().unwrap(), lb)
            .name()
            .is_some(),
        "allowed source is answered"
    );
    assert_eq!(
        tcp_probe_from(&c.ext, EXT_IP_OTHER.parse().unwrap(), lb),
        Reply::Timeout,
        "other sources are dropped"
    );
    // externalIPs and NodePorts are not subject to the source ranges.
    assert!(
        tcp_probe_from(&c.ext, EXT_IP_OTHER.parse().unwrap(), sa("192.0.2.10", 80))
            .name()
            .is_some()
    );
    assert!(
        tcp_probe_from(&c.ext, EXT_IP_OTHER.parse().unwrap(), sa(NODE_IP, 30080))
            .name()
            .is_some()
    );
}

/// Upstream's `AllowServiceExternalIPs` gate off: a Service's externalIPs are not served
/// (its `ServicePort.ExternalIPs()` answers none), its ClusterIP and NodePort still are.
#[test]
fn external_ips_are_not_served_with_allow_service_external_ips_off() {
    let c = web_cluster();
    let y = web_yaml("externalIPs: [192.0.2.10]");
    let ext_ip = sa("192.0.2.10", 80);
    c.sync_once(&y, &[]);
    assert!(
        tcp_probe_from(&c.ext, EXT_IP.parse().unwrap(), ext_ip)
            .name()
            .is_some(),
        "control: served with the gate on (its default)"
    );
    c.sync_once(&y, &["--feature-gates=AllowServiceExternalIPs=false"]);
    let r = tcp_probe_from(&c.ext, EXT_IP.parse().unwrap(), ext_ip);
    assert!(
        r.name().is_none(),
        "externalIP served with the gate off: {r:?}"
    );
    assert!(!c
        .node
        .sh("nft list table ip kube-nlproxy")
        .contains("192.0.2.10"));
    assert!(
        tcp_probe_from(&c.ext, EXT_IP.parse().unwrap(), sa(NODE_IP, 30080))
            .name()
            .is_some(),
        "the NodePort still is"
    );
    assert!(tcp_probe(&c.pods[1], sa("10.96.0.10", 80)).name().is_some());
}

#[test]
fn services_labelled_for_another_proxy_are_ignored() {
    let c = web_cluster();
    let y = web_yaml("").replace(
        "metadata: {name: web, namespace: default}",
        "metadata: {name: web, namespace: default, labels: {service.kubernetes.io/service-proxy-name: other}}",
    );
    c.sync_once(&y, &[]);
    assert!(
        !c.ruleset("ip").contains("10.96.0.10"),
        "{}",
        c.ruleset("ip")
    );
    assert_ne!(
        tcp_probe(&c.pods[1], sa("10.96.0.10", 80)).name(),
        Some("local")
    );
}

#[test]
fn terminating_endpoints_serve_when_none_is_ready() {
    let c = web_cluster();
    let mut y = yaml::service(
        "default",
        "web",
        &["10.96.0.10"],
        &[("http", "TCP", 80, 0)],
        "",
    );
    y += &yaml::slice(
        "default",
        "web",
        "web-v4",
        "IPv4",
        ("http", "TCP", 8080),
        &[
            yaml::ready("10.244.1.2", "node1").not_ready().terminating(),
            yaml::ready("10.244.2.2", "node2")
                .not_ready()
                .not_serving()
                .terminating(),
        ],
    );
    c.sync_once(&y, &[]);
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 10);
    assert_eq!(
        names(&replies),
        ["local"].map(String::from).into(),
        "{replies:?}"
    );
}

#[test]
fn established_connection_survives_endpoint_removal_and_resync() {
    let c = web_cluster();
    let mut d = c.start_daemon(&web_yaml(""), &[]);
    // Open connections until one lands on the remote endpoint.
    let mut conn = loop {
        let oc = OpenConn::open(&c.pods[1], sa("10.96.0.10", 80));
        if oc.greeting.name() == Some("remote") {
            break oc;
        }
    };
    assert_eq!(conn.echo("one").unwrap(), "one");
    // Remove the local endpoint; the daemon picks up the rename-replaced file.
    let y = web_yaml("").replace("- {addresses: [\"10.244.1.2\"], nodeName: node1, conditions: {ready: true, serving: true, terminating: false}}\n", "");
    c.write_manifests(&y);
    c.wait_ruleset("ip", "the local endpoint removed", |r| {
        // The one endpoint left is an endpoint-map element too.
        !r.contains("10.244.1.2 . 8080") && r.contains("10.244.2.2 . 8080")
    });
    assert_eq!(
        conn.echo("two").unwrap(),
        "two",
        "established connection must survive"
    );
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 10);
    assert_eq!(names(&replies), ["remote"].map(String::from).into());
    // A restart reconciles without breaking it either.
    let (st, took) = d.terminate();
    assert!(st.success(), "SIGTERM exits 0: {st:?}\n{}", d.log_text());
    assert!(took < Duration::from_secs(3), "exit took {took:?}");
    assert!(
        c.ruleset("ip").contains("10.244.2.2"),
        "rules stay in place after exit"
    );
    let _d2 = c.start_daemon(&y, &[]);
    assert_eq!(conn.echo("three").unwrap(), "three");
}

#[test]
fn foreign_table_survives_sync_and_cleanup() {
    let c = web_cluster();
    c.node
        .sh("nft add table ip other; nft add chain ip other c; nft add rule ip other c counter");
    c.sync_once(&web_yaml(""), &[]);
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    let all = c.node.sh("nft list ruleset");
    assert!(all.contains("table ip other"), "{all}");
    assert!(
        !all.contains("kube-nlproxy"),
        "cleanup removes our tables: {all}"
    );
    assert_ne!(
        tcp_probe(&c.pods[1], sa("10.96.0.10", 80)).name(),
        Some("local")
    );
}

#[test]
fn cleanup_also_removes_upstream_kube_proxy_tables() {
    let c = web_cluster();
    let upstream = "nft add table ip kube-proxy; nft add chain ip kube-proxy services; nft add table ip6 kube-proxy; nft add table inet kube-proxy";
    // Starting removes them (as upstream's nftables mode removes other modes' rules).
    c.node.sh(upstream);
    c.sync_once(&web_yaml(""), &[]);
    let all = c.node.sh("nft list ruleset");
    assert!(
        !all.contains("table ip kube-proxy") && !all.contains("table ip6 kube-proxy"),
        "{all}"
    );
    assert!(
        all.contains("table inet kube-proxy"),
        "not upstream's: {all}"
    );
    // And so does --cleanup.
    c.node.sh("nft add table ip kube-proxy; nft add chain ip kube-proxy services; nft add table ip6 kube-proxy");
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    assert!(
        err.contains(
            r#""removed a leftover" mode="upstream kube-proxy" object="table ip kube-proxy""#
        ),
        "{err}"
    );
    assert!(
        err.contains(
            r#""removed a leftover" mode="upstream kube-proxy" object="table ip6 kube-proxy""#
        ),
        "{err}"
    );
    let all = c.node.sh("nft list ruleset");
    assert!(
        !all.contains("table ip kube-proxy") && !all.contains("table ip6 kube-proxy"),
        "{all}"
    );
    assert!(
        all.contains("table inet kube-proxy"),
        "only upstream's ip and ip6 tables are its: {all}"
    );
}

#[test]
fn cleanup_leaves_a_same_named_table_it_did_not_create() {
    let c = web_cluster();
    c.node.sh("nft add table ip kube-nlproxy");
    let (ok, err) = c.run_proxy(&["--cleanup"]);
    assert!(ok, "{err}");
    assert!(err.contains("not our comment"), "{err}");
    assert!(c
        .node
        .sh("nft list ruleset")
        .contains("table ip kube-nlproxy"));
}

fn http_get(
    ns: &netlink_tests::ns::NetNs,
    addr: std::net::SocketAddr,
    path: &str,
) -> Option<(u16, String, String)> {
    let path = path.to_string();
    ns.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut r = String::new();
        s.read_to_string(&mut r).ok()?;
        let code = r.split_whitespace().nth(1)?.parse().ok()?;
        let (head, body) = r.split_once("\r\n\r\n")?;
        Some((code, head.to_string(), body.to_string()))
    })
}

#[test]
fn health_check_node_port_follows_local_endpoints() {
    let c = web_cluster();
    let y = web_yaml("externalTrafficPolicy: Local\nhealthCheckNodePort: 32000");
    let _d = c.start_daemon(&y, &[]);
    let hc = sa(NODE_IP, 32000);
    let t0 = Instant::now();
    let (code, head, body) = loop {
        if let Some(r) = http_get(&c.ext, hc, "/healthz") {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "health check port never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, 200, "{body}");
    assert!(
        head.to_lowercase()
            .contains("x-load-balancing-endpoint-weight: 1"),
        "{head}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["service"]["namespace"], "default");
    assert_eq!(v["service"]["name"], "web");
    assert_eq!(v["localEndpoints"], 1);
    assert_eq!(v["serviceProxyHealthy"], true);
    // The local endpoint goes away: 503 with zero local endpoints.
    let y2 = y.replace("- {addresses: [\"10.244.1.2\"], nodeName: node1, conditions: {ready: true, serving: true, terminating: false}}\n", "");
    c.write_manifests(&y2);
    let t0 = Instant::now();
    loop {
        let (code, head, body) = http_get(&c.ext, hc, "/").expect("still served");
        if code == 503 {
            assert!(body.contains("\"localEndpoints\":0"), "{body}");
            assert!(
                head.to_lowercase()
                    .contains("x-load-balancing-endpoint-weight: 0"),
                "{head}"
            );
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "never 503: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The daemon's own endpoints: /healthz from outside, /metrics on the node's loopback.
    let (code, _, body) = http_get(&c.ext, sa(NODE_IP, 10256), "/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, _, m) = http_get(&c.node, sa("127.0.0.1", 10249), "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        m.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        "{m}"
    );
    // The Service is removed: the port stops answering.
    c.write_manifests("");
    let t0 = Instant::now();
    while http_get(&c.ext, hc, "/").is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "health check port still open"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn table_flushed_by_someone_else_is_restored_within_a_second() {
    let c = web_cluster();
    let _d = c.start_daemon(&web_yaml(""), &[]);
    c.node
        .sh("nft add table ip other; nft add chain ip other c");
    for how in [
        "nft flush ruleset",
        "nft delete table ip kube-nlproxy",
        "nft flush table ip kube-nlproxy",
    ] {
        c.node.sh(how);
        let t0 = Instant::now();
        // Rules and elements: `nft flush table` removes the rules and keeps the sets'
        // elements, so an endpoint alone says nothing about the restore.
        c.wait_ruleset("ip", "our table restored", |r| {
            r.contains("vmap @service-ips")
                && (r.contains("10.244.2.2 . 8080") || r.contains("10.244.2.2:8080"))
        });
        assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "{how}: restored after {:?}",
            t0.elapsed()
        );
        let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 10);
        assert!(
            replies.iter().all(|r| r.name().is_some()),
            "{how}: {replies:?}"
        );
    }
    // Changes to other tables are not ours to react to (and never touched).
    c.node
        .sh("nft add table ip other2; nft add chain ip other2 c2");
    std::thread::sleep(Duration::from_millis(300));
    assert!(c.node.sh("nft list ruleset").contains("table ip other2"));
    let (code, head, m) = http_get(&c.node, sa("127.0.0.1", 10249), "/metrics").unwrap();
    assert_eq!(code, 200, "{head}");
    let restores: f64 = m
        .lines()
        .find(|l| l.starts_with("kubeproxy_sync_proxy_rules_nftables_restores_total "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no restores metric in\n{m}"));
    assert!(restores >= 3.0, "{m}");
}

fn many_services_yaml(n: usize, skip_odd: bool) -> String {
    let mut y = web_yaml("");
    for i in 0..n {
        if skip_odd && i % 2 == 1 {
            continue;
        }
        let ip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
        y += &yaml::service("bulk", &format!("s{i}"), &[&ip], &[("p", "TCP", 80, 0)], "");
        y += &yaml::slice(
            "bulk",
            &format!("s{i}"),
            &format!("s{i}-1"),
            "IPv4",
            ("p", "TCP", 8080),
            &[yaml::ready("10.244.2.2", "node2")],
        );
    }
    y
}

/// The `10.97.*` elements of the `service-ips` map in `nft list` output.
fn service_ips(ruleset: &str) -> BTreeSet<String> {
    let mut inside = false;
    ruleset
        .lines()
        .filter(|l| {
            let t = l.trim();
            if t.starts_with("map ") {
                inside = t == "map service-ips {";
            } else if t == "}" {
                inside = false;
            }
            inside
        })
        .filter_map(|l| {
            l.trim()
                .strip_prefix("elements = {")
                .or_else(|| Some(l.trim()))
        })
        .flat_map(|l| {
            l.split(',')
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|e| e.starts_with("10.97.") && e.contains(". tcp . 80"))
        .collect()
}

#[test]
fn sigkill_mid_sync_leaves_old_or_new_and_restart_fixes_it() {
    let c = web_cluster();
    let old = many_services_yaml(3000, false);
    let new = many_services_yaml(3000, true);
    let mut d = c.start_daemon(&old, &[]);
    let mut conn = OpenConn::open(&c.pods[1], sa("10.96.0.10", 80));
    assert!(conn.greeting.name().is_some());
    let old_ips = service_ips(&c.ruleset("ip"));
    assert_eq!(old_ips.len(), 3000);
    // Change the manifests and kill the daemon while it reloads and syncs.
    c.write_manifests(&new);
    std::thread::sleep(Duration::from_millis(
        250 + (std::process::id() % 200) as u64,
    ));
    // SAFETY: killing our own child.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGKILL) };
    let _ = d.child.wait();
    let mid = service_ips(&c.ruleset("ip"));
    assert!(
        mid.len() == 3000 || mid.len() == 1500,
        "the kernel holds the old or the new ruleset, never a mix: {} services",
        mid.len()
    );
    assert_eq!(conn.echo("during").unwrap(), "during");
    let _d2 = c.start_daemon(&new, &[]);
    c.wait_ruleset("ip", "the new ruleset after restart", |r| {
        service_ips(r).len() == 1500
    });
    assert_eq!(
        conn.echo("after").unwrap(),
        "after",
        "the established connection never broke"
    );
}

#[test]
fn detect_local_by_interface_decides_masquerading() {
    // InterfaceNamePrefix: our pods hang off routed veths named vpodN.
    let c = web_cluster();
    c.sync_once(
        &web_yaml(""),
        &[
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "vpod",
        ],
    );
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 80));
    assert!(r.name().is_some(), "{r:?}");
    assert_eq!(
        peer(&r),
        "10.244.1.3",
        "traffic from a vpod* interface is a pod's: kept"
    );
    let from_ext = tcp_probes(&c.ext, sa("10.96.0.10", 80), 6);
    assert!(
        from_ext.iter().all(|r| peer(r) != EXT_IP),
        "other traffic to a ClusterIP is masqueraded: {from_ext:?}"
    );

    // BridgeInterface: a pod on a bridge.
    let pod = netlink_tests::ns::NetNs::new("brpod");
    c.node.ip("link add br-pods type bridge");
    c.node.ip("link set br-pods up");
    c.node.ip("addr add 10.244.3.1/24 dev br-pods");
    netlink_tests::ns::sh(&format!(
        "ip link add vbr0 netns {} type veth peer name eth0 netns {}",
        c.node.name, pod.name
    ));
    c.node.ip("link set vbr0 master br-pods");
    c.node.ip("link set vbr0 up");
    pod.ip("link set eth0 up");
    pod.ip("addr add 10.244.3.2/24 dev eth0");
    pod.ip("route add default via 10.244.3.1");
    c.sync_once(
        &web_yaml(""),
        &[
            "--detect-local-mode",
            "BridgeInterface",
            "--pod-bridge-interface",
            "br-pods",
        ],
    );
    let r = tcp_probe(&pod, sa("10.96.0.10", 80));
    assert_eq!(
        peer(&r),
        "10.244.3.2",
        "traffic from the pod bridge is kept: {r:?}"
    );
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 80));
    assert_ne!(
        peer(&r),
        "10.244.1.3",
        "a pod not on the bridge counts as outside: {r:?}"
    );
}

#[test]
fn localhost_node_ports_follow_the_mode_and_the_options() {
    let mut c = web_cluster();
    c.add_pod(5);
    udp_backend(&c.pods[2], "dns", sa("10.244.1.5", 53));
    let mut y = web_yaml("");
    y += &dns_yaml("kube-system", 30053, &["10.244.1.5"]);
    for (args, why) in [
        (
            &["--proxy-mode=nftables", "--nodeport-addresses=0.0.0.0/0"][..],
            "none in nftables mode (upstream's gate is off)",
        ),
        (
            &["--iptables-localhost-nodeports=false"],
            "none in iptables mode with --iptables-localhost-nodeports=false",
        ),
    ] {
        let d = c.start_daemon(&y, args);
        d.wait_for_log("synced", 1);
        assert_eq!(
            tcp_probe(&c.node, sa("127.0.0.1", 30080)),
            Reply::Refused,
            "{why}"
        );
        assert_eq!(route_localnet(&c), "0", "{why}: route_localnet untouched");
    }
    // Upstream's default mode (iptables) serves them, as its route_localnet rules do; ours
    // is a userspace forwarder. --localhost-nodeports does the same in every mode.
    let d = c.start_daemon(&y, &[]);
    d.wait_for_log("synced", 1);
    // The node as upstream's iptables mode leaves it: route_localnet=1, with its guard.
    assert_eq!(route_localnet(&c), "1");
    assert!(
        d.log_text()
            .contains("Setting route_localnet=1 to allow node-ports on localhost"),
        "{}",
        d.log_text()
    );
    assert!(c
        .ruleset("ip")
        .contains("ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state new jump localnet-guard"));
    let replies = all_answered(&c, sa("127.0.0.1", 30080));
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "round-robin over the endpoints"
    );
    let r = udp_probe(&c.node, sa("127.0.0.1", 30053));
    assert_eq!(r.name(), Some("dns"), "{r:?}");
    // Upstream's iptables-mode counter of accepted localhost NodePort traffic (the first
    // packet of each connection): one more connection, one more.
    let accepted = || {
        let (code, _, m) = http_get(&c.node, sa("127.0.0.1", 10249), "/metrics").unwrap();
        assert_eq!(code, 200);
        let name = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total ";
        m.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name}in {m}"))
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let before = accepted();
    assert!(before >= 21, "20 connections and a UDP session: {before}");
    assert!(tcp_probe(&c.node, sa("127.0.0.1", 30080)).name().is_some());
    assert_eq!(accepted(), before + 1);
    // An established connection survives an endpoint change.
    let mut conn = OpenConn::open(&c.node, sa("127.0.0.1", 30080));
    let gone = if conn.greeting.name() == Some("local") {
        "10.244.1.2"
    } else {
        "10.244.2.2"
    };
    let y2 = y.replace(&format!("- {{addresses: [\"{gone}\"], nodeName: node{}, conditions: {{ready: true, serving: true, terminating: false}}}}\n", if gone == "10.244.1.2" { 1 } else { 2 }), "");
    assert_ne!(y, y2);
    c.write_manifests(&y2);
    c.wait_ruleset("ip", "the endpoint removed", |r| {
        !r.contains(&format!("{gone}:8080")) && !r.contains(&format!("{gone} . 8080"))
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(conn.echo("still").unwrap(), "still");
}

/// nftables mode with upstream 1.37's alpha gate `KubeProxyNFTablesLocalhostNodePorts`: with
/// loopback listed in `nodePortAddresses`, TCP NodePorts answer on 127.0.0.1 and ::1 through a
/// userspace proxy to the family's endpoints and UDP is rejected; without it every protocol is
/// rejected. Each reject is counted in
/// `kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family,protocol}` (what
/// tells our rule's reject from a port nobody listens on), and the listeners in
/// `kubeproxy_nftables_localhost_nodeport_listeners{ip_family}`.
#[test]
fn nftables_mode_serves_or_rejects_localhost_node_ports_behind_upstreams_gate() {
    let mut c = web_cluster();
    c.add_pod(5);
    udp_backend(&c.pods[2], "dns", sa("10.244.1.5", 53));
    let mut y = web_yaml("");
    y += &dns_yaml("kube-system", 30053, &["10.244.1.5"]);
    let gate = "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true";
    let metric = |name: &str, labels: &str| -> Option<u64> {
        let (code, _, m) = http_get(&c.node, sa("127.0.0.1", 10249), "/metrics").unwrap();
        assert_eq!(code, 200);
        let prefix = format!("{name}{{{labels}}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.trim().parse::<u64>().unwrap())
    };
    const REJECTED: &str = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total";
    const LISTENERS: &str = "kubeproxy_nftables_localhost_nodeport_listeners";
    {
        let d = c.start_daemon(
            &y,
            &[
                "--proxy-mode=nftables",
                gate,
                "--nodeport-addresses=primary,localhost",
            ],
        );
        d.wait_for_log("synced", 1);
        for (lo, want) in [
            ("127.0.0.1", ["local", "remote"]),
            ("::1", ["local6", "remote6"]),
        ] {
            let replies = all_answered(&c, sa(lo, 30080));
            assert_eq!(
                names(&replies),
                want.map(String::from).into(),
                "{lo}: the family's endpoints"
            );
        }
        assert_eq!(
            udp_probe(&c.node, sa("127.0.0.1", 30053)),
            Reply::Refused,
            "UDP is not proxied: rejected"
        );
        let udp = metric(REJECTED, r#"ip_family="IPv4",protocol="UDP""#);
        assert!(udp.is_some_and(|n| n >= 1), "UDP reject counted: {udp:?}");
        assert_eq!(
            metric(REJECTED, r#"ip_family="IPv4",protocol="TCP""#),
            None,
            "TCP is served, so not rejected"
        );
        for f in ["IPv4", "IPv6"] {
            assert_eq!(
                metric(LISTENERS, &format!("ip_family=\"{f}\"")),
                Some(1),
                "{f}: one TCP NodePort with endpoints"
            );
        }
    }
    let _d = c.start_daemon(&y, &["--proxy-mode=nftables", gate]);
    let rejected = |family: &str| {
        metric(
            REJECTED,
            &format!("ip_family=\"{family}\",protocol=\"TCP\""),
        )
    };
    let t0 = Instant::now();
    while rejected("IPv4").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no IPv4 TCP reject chain"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (lo, family) in [("127.0.0.1", "IPv4"), ("::1", "IPv6")] {
        let before = rejected(family).unwrap();
        assert_eq!(
            tcp_probe(&c.node, sa(lo, 30080)),
            Reply::Refused,
            "{lo}: loopback not listed: TCP rejected"
        );
        // Counted in packets: one refused connect may count more than one (two for ::1 here).
        let after = rejected(family).unwrap();
        assert!(after > before, "{lo}: by our rule: {before} then {after}");
    }
    assert_eq!(
        metric(LISTENERS, r#"ip_family="IPv4""#),
        None,
        "no proxy, no listener gauge (as upstream)"
    );
}

/// With route_localnet=1 the kernel routes a packet for 127.0.0.0/8 that arrives from the
/// network to local sockets (kubernetes#90259, CVE-2020-8558); upstream's iptables mode guards
/// it with KUBE-FIREWALL's rule and so does ours. A TCP SYN for 127.0.0.1 is written straight
/// onto the outside link (an AF_PACKET frame: no stack would route it) toward a listener
/// on the node's 127.0.0.1, whose half-open connections show whether it got in. Control: the same frame with route_localnet=1 and
/// no guard (nftables mode) does get in.
#[test]
fn route_localnet_is_guarded_against_packets_from_the_network() {
    let c = web_cluster();
    let y = web_yaml("");
    let dev_to = |ns: &netlink_tests::ns::NetNs, ip: &str| {
        let r = ns.sh(&format!("ip -o route get {ip}"));
        let dev = r
            .split_whitespace()
            .skip_while(|w| *w != "dev")
            .nth(1)
            .unwrap()
            .to_string();
        let link = ns.sh(&format!("ip -o link show {dev}"));
        let mac = link
            .split_whitespace()
            .skip_while(|w| *w != "link/ether")
            .nth(1)
            .unwrap()
            .to_string();
        (dev, mac)
    };
    // A service on the node's loopback only.
    tcp_backend(&c.node, "loopback-only", sa("127.0.0.1", 30099));
    let (ext_dev, ext_mac) = dev_to(&c.ext, NODE_IP);
    let (_, node_mac) = dev_to(&c.node, EXT_IP);
    let inject = |sport: u16| {
        c.ext.sh(&format!(
            r#"python3 - <<EOF
import socket, struct
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
src, dst = socket.inet_aton("{EXT_IP}"), socket.inet_aton("127.0.0.1")
tcp = struct.pack("!HHIIBBHHH", {sport}, 30099, 1, 0, 5 << 4, 0x02, 64240, 0, 0)
tcp = tcp[:16] + struct.pack("!H", csum(src + dst + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, src, dst)
ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
eth = bytes.fromhex("{node}") + bytes.fromhex("{ext}") + b"\x08\x00"
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("{ext_dev}", 0))
s.send(eth + ip + tcp)
EOF"#,
            node = node_mac.replace(':', ""),
            ext = ext_mac.replace(':', ""),
        ));
        std::thread::sleep(Duration::from_millis(300));
        // A SYN that got in left a half-open connection on the listener (its SYN-ACK, from
        // 127.0.0.1, is a martian the client drops).
        c.node
            .sh(&format!(
                "ss -Htn state syn-recv src 127.0.0.1:30099 dst {EXT_IP}:{sport}"
            ))
            .lines()
            .count()
    };
    {
        let d = c.start_daemon(&y, &[]);
        d.wait_for_log("synced", 1);
        assert_eq!(route_localnet(&c), "1");
        assert_eq!(inject(45001), 0, "iptables mode: the guard drops it");
    }
    let d = c.start_daemon(&y, &["--proxy-mode=nftables"]);
    d.wait_for_log("synced", 1);
    // (the emptied chain itself goes at a later sync, as every stale chain)
    assert!(!c.ruleset("ip").contains("jump localnet-guard"));
    c.node.write_sysctl("net/ipv4/conf/all/route_localnet", "1");
    assert_eq!(inject(45002), 1, "control: without the guard it gets in");
}

/// 20 connections from the node to `to` once every one is answered (a listener starts after
/// the sync that plans it), waiting at most 5 s.
fn all_answered(c: &Cluster, to: std::net::SocketAddr) -> Vec<Reply> {
    let t0 = Instant::now();
    loop {
        let r = tcp_probes(&c.node, to, 20);
        if r.iter().all(|r| r.name().is_some()) {
            return r;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{to}: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `net.ipv4.conf.all.route_localnet` in the node's namespace.
fn route_localnet(c: &Cluster) -> String {
    c.node
        .sh("cat /proc/sys/net/ipv4/conf/all/route_localnet")
        .trim()
        .to_string()
}

/// The single manifest file disappears (an editor's unlink-and-create, a ConfigMap volume
/// swap): the daemon keeps the last good state with a warning, and picks the file up again
/// when it returns.
#[test]
fn a_vanished_manifest_keeps_the_last_good_state() {
    let c = web_cluster();
    let y = web_yaml("");
    let d = c.start_daemon(&y, &[]);
    d.wait_for_log("synced", 1);
    let path = c.write_manifests(&y);
    std::fs::remove_file(&path).unwrap();
    d.wait_for_log("keeping the last good state", 1);
    // Several poll periods later the Service still answers.
    std::thread::sleep(Duration::from_millis(800));
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 80));
    assert!(
        matches!(r, Reply::Answered { .. }),
        "{r:?}\n{}",
        d.log_text()
    );
    assert!(c.ruleset("ip").contains("10.96.0.10"));
    // It comes back without the remote endpoint: that change applies.
    let back = scenario::web_yaml_with("", &[LOCAL_EP], true);
    c.write_manifests(&back);
    c.wait_ruleset("ip", "the remote endpoint removed", |r| {
        !r.contains("10.244.2.2")
    });
}

/// Two Services claim one ClusterIP:port (manifests and objects in flight can): the first by
/// namespace/name owns it, a warning names both; when the owner is deleted the other takes
/// the address in that same sync, and later Services still program (no sync fails).
#[test]
fn a_shared_service_address_passes_to_the_other_service_when_its_owner_goes() {
    let c = web_cluster();
    let rival = |eps: &[&str]| {
        let mut y = yaml::service(
            "default",
            "a-rival",
            &["10.96.0.10"],
            &[("http", "TCP", 80, 0)],
            "",
        );
        y += &yaml::slice(
            "default",
            "a-rival",
            "a-rival-1",
            "IPv4",
            ("http", "TCP", 8080),
            &eps.iter()
                .map(|ip| yaml::ready(ip, "node2"))
                .collect::<Vec<_>>(),
        );
        y
    };
    let only_local = scenario::web_yaml_with("", &[LOCAL_EP], false);
    let d = c.start_daemon(&(only_local.clone() + &rival(&[REMOTE_EP])), &[]);
    d.wait_for_log("both claim 10.96.0.10:80/tcp", 1);
    // One line, the losing Service in upstream's field for its kind.
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("both claim 10.96.0.10:80/tcp"))
        .unwrap();
    assert!(
        line.contains(r#""object not fully usable" service="default/web" problem="#),
        "{line}"
    );
    assert_eq!(
        names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 6)),
        ["remote".to_string()].into(),
        "default/a-rival sorts first and owns the address\n{}",
        c.ruleset("ip")
    );
    // The owner goes: web takes the address.
    c.write_manifests(&only_local);
    let t0 = Instant::now();
    loop {
        let got = names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 4));
        if got == ["local".to_string()].into() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{got:?}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    late_service_is_programmed(&c, &d, &only_local);
}

/// externalTrafficPolicy Local and no endpoint on this node: pods and the node itself
/// reaching the externalIP or NodePort get the cluster-wide endpoint (pods unmasqueraded);
/// traffic from outside is dropped (no answer), not refused.
#[test]
fn external_policy_local_without_local_endpoints_serves_pods_and_the_node() {
    let c = web_cluster();
    let y = scenario::web_yaml_with(
        "externalTrafficPolicy: Local\nexternalIPs: [192.0.2.20]",
        &[REMOTE_EP],
        false,
    );
    c.sync_once(&y, &[]);
    let r = tcp_probe(&c.pods[1], sa("192.0.2.20", 80));
    assert_eq!(r.name(), Some("remote"), "pod → externalIP: {r:?}");
    assert_eq!(peer(&r), "10.244.1.3", "pods are not masqueraded");
    let r = tcp_probe(&c.pods[1], sa(NODE_IP, 30080));
    assert_eq!(r.name(), Some("remote"), "pod → NodePort: {r:?}");
    let r = tcp_probe(&c.node, sa("192.0.2.20", 80));
    assert_eq!(r.name(), Some("remote"), "node → externalIP: {r:?}");
    for dst in [sa("192.0.2.20", 80), sa(NODE_IP, 30080)] {
        let r = tcp_probe(&c.ext, dst);
        assert!(
            matches!(r, Reply::Timeout),
            "outside → {dst}: dropped, got {r:?}"
        );
    }
}

/// internalTrafficPolicy Local and externalTrafficPolicy Local with an endpoint on this node
/// (upstream's "iTP: Local, eTP: Local, some endpoints local"): an external client reaches the
/// local endpoint through the NodePort and the externalIP with its own address kept; pods
/// reaching the NodePort are short-circuited to every endpoint; the ClusterIP stays local
/// (issue #35.1: the NodePort and externalIP had no element at all).
#[test]
fn internal_and_external_policy_local_node_port_keeps_the_client_and_the_local_endpoint() {
    let c = web_cluster();
    c.sync_once(
        &web_yaml(
            "internalTrafficPolicy: Local\nexternalTrafficPolicy: Local\nexternalIPs: [192.0.2.20]",
        ),
        &[],
    );
    for dst in [sa(NODE_IP, 30080), sa("192.0.2.20", 80)] {
        let replies = tcp_probes(&c.ext, dst, 20);
        assert_eq!(
            names(&replies),
            ["local"].map(String::from).into(),
            "outside → {dst}: {replies:?}"
        );
        assert!(
            replies.iter().all(|r| peer(r) == EXT_IP),
            "outside → {dst}: source kept: {replies:?}"
        );
    }
    let replies = tcp_probes(&c.pods[1], sa(NODE_IP, 30080), 40);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "pod → NodePort: {replies:?}"
    );
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 20);
    assert_eq!(
        names(&replies),
        ["local"].map(String::from).into(),
        "pod → ClusterIP: {replies:?}"
    );
}

/// internalTrafficPolicy Local picks endpoints, not masquerading: an off-cluster client routed
/// to the node reaches the local endpoint masqueraded (its replies come back through the
/// node), pods keep their address.
#[test]
fn internal_policy_local_still_masquerades_off_cluster_clients() {
    let c = web_cluster();
    c.sync_once(&web_yaml("internalTrafficPolicy: Local"), &[]);
    let r = tcp_probe(&c.ext, sa("10.96.0.10", 80));
    assert_eq!(r.name(), Some("local"), "{r:?}");
    assert_ne!(peer(&r), EXT_IP, "off-cluster source masqueraded: {r:?}");
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 80));
    assert_eq!(peer(&r), "10.244.1.3", "{r:?}");
}

/// Service CIDRs (`--service-cidrs` here; ServiceCIDR objects in API mode): a new connection to
/// an address inside them that no Service owns is dropped, one to an unused port of a
/// ClusterIP refused; Services keep working.
#[test]
fn unallocated_service_ips_are_dropped_and_unused_ports_refused() {
    let c = web_cluster();
    c.sync_once(
        &web_yaml(""),
        &["--service-cidrs", "10.96.0.0/16,fd00:96::/112"],
    );
    let r = tcp_probe(&c.pods[1], sa("10.96.0.99", 80));
    assert!(
        matches!(r, Reply::Timeout),
        "unallocated: dropped, got {r:?}"
    );
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 81));
    assert!(
        matches!(r, Reply::Refused),
        "unused port: refused, got {r:?}"
    );
    let r = tcp_probe(&c.pods[1], sa("10.96.0.10", 80));
    assert!(r.name().is_some(), "{r:?}");
    let r = tcp_probe(&c.pods[1], sa("fd00:96::99", 80));
    assert!(
        matches!(r, Reply::Timeout),
        "IPv6 unallocated: dropped, got {r:?}"
    );
}

/// Two Services claim one externalIP:port (the API server allows it): the older one (by
/// `metadata.creationTimestamp`) gets the traffic whatever the names; when it is deleted the
/// other takes the address in that same sync; a Service added afterwards is programmed.
#[test]
fn a_shared_external_ip_goes_to_the_older_service_then_to_the_other() {
    let c = web_cluster();
    let with_time = |y: String, name: &str, t: &str| {
        y.replace(
            &format!("metadata: {{name: {name}, namespace: default}}\n"),
            &format!(
                "metadata: {{name: {name}, namespace: default, creationTimestamp: \"{t}\"}}\n"
            ),
        )
    };
    // web (local endpoint) is newer; z-rival (remote endpoint) is older and sorts last.
    let web = with_time(
        scenario::web_yaml_with("externalIPs: [192.0.2.10]", &[LOCAL_EP], false),
        "web",
        "2026-06-01T00:00:00Z",
    );
    let mut rival = yaml::service(
        "default",
        "z-rival",
        &["10.96.0.11"],
        &[("http", "TCP", 80, 0)],
        "externalIPs: [192.0.2.10]",
    );
    rival += &yaml::slice(
        "default",
        "z-rival",
        "z-rival-1",
        "IPv4",
        ("http", "TCP", 8080),
        &[yaml::ready(REMOTE_EP, "node2")],
    );
    let rival = with_time(rival, "z-rival", "2026-01-01T00:00:00Z");
    let d = c.start_daemon(&(web.clone() + &rival), &[]);
    d.wait_for_log("both claim 192.0.2.10:80/tcp", 1);
    let from_outside = |n| names(&tcp_probes(&c.ext, sa("192.0.2.10", 80), n));
    assert_eq!(
        from_outside(6),
        ["remote".to_string()].into(),
        "the older default/z-rival owns the externalIP\n{}",
        d.log_text()
    );
    // The owner goes: web takes the address at the next sync.
    c.write_manifests(&web);
    let t0 = Instant::now();
    while from_outside(4) != ["local".to_string()].into() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{}", d.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    late_service_is_programmed(&c, &d, &web);
}

/// After a collision is resolved, a Service added on top of `base` is programmed and
/// answered: nothing is wedged, and no sync failed on the way.
fn late_service_is_programmed(c: &Cluster, d: &netlink_tests::cluster::Daemon, base: &str) {
    let mut more = base.to_string();
    more += &yaml::service(
        "default",
        "late",
        &["10.96.0.12"],
        &[("http", "TCP", 80, 0)],
        "",
    );
    more += &yaml::slice(
        "default",
        "late",
        "late-1",
        "IPv4",
        ("http", "TCP", 8080),
        &[yaml::ready(REMOTE_EP, "node2")],
    );
    c.write_manifests(&more);
    c.wait_ruleset("ip", "the late Service", |r| r.contains("10.96.0.12"));
    assert_eq!(
        names(&tcp_probes(&c.pods[1], sa("10.96.0.12", 80), 3)),
        ["remote".to_string()].into()
    );
    let log = d.log_text();
    assert!(
        !log.contains("sync failed") && !log.contains("busy"),
        "{log}"
    );
}

/// Issue #56.5, a deliberate deviation: when this Node's InternalIP changes, upstream 1.37
/// exits (the kubelet restarts it); ours follows the change live. NodePorts on `primary`
/// move to the new address (the old one no longer serves them), and nothing else is
/// disturbed: the ClusterIP keeps answering and a connection established through it before
/// the change keeps working.
#[test]
fn a_node_whose_internal_ip_changes_moves_its_node_ports_and_disturbs_nothing_else() {
    const NEW_NODE_IP: &str = "192.168.50.9";
    let c = web_cluster();
    c.node.ip(&format!("addr add {NEW_NODE_IP}/24 dev eth-ext"));
    let node = |ip: &str| {
        format!("---\napiVersion: v1\nkind: Node\nmetadata: {{name: node1}}\nstatus: {{addresses: [{{type: InternalIP, address: {ip}}}]}}\n")
    };
    let y = web_yaml("");
    let d = c.start_daemon(
        &(y.clone() + &node(NODE_IP)),
        &[
            "--nodeport-addresses",
            "primary",
            "--proxy-mode",
            "nftables",
        ],
    );
    assert!(tcp_probe(&c.ext, sa(NODE_IP, 30080)).name().is_some());
    assert!(
        tcp_probe(&c.ext, sa(NEW_NODE_IP, 30080)).name().is_none(),
        "not served on another address yet"
    );
    let mut conn = OpenConn::open(&c.pods[1], sa("10.96.0.10", 80));
    assert!(conn.greeting.name().is_some(), "{:?}", conn.greeting);
    assert_eq!(conn.echo("before").unwrap(), "before");
    let syncs = d.log_text().matches("synced").count();
    c.write_manifests(&(y + &node(NEW_NODE_IP)));
    d.wait_for_log("synced", syncs + 1);
    let t0 = Instant::now();
    while tcp_probe(&c.ext, sa(NEW_NODE_IP, 30080)).name().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the NodePort moved to the new InternalIP"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        tcp_probe(&c.ext, sa(NODE_IP, 30080)).name().is_none(),
        "the old address no longer serves NodePorts"
    );
    assert!(
        tcp_probe(&c.pods[1], sa("10.96.0.10", 80)).name().is_some(),
        "the ClusterIP still answers"
    );
    assert_eq!(
        conn.echo("after").unwrap(),
        "after",
        "the connection established before the change still works"
    );
    assert!(!d.log_text().contains("exiting"), "ours runs on");
}
