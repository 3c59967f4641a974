//! Stale UDP conntrack entries: a client keeps sending from one source port while the
//! Service's endpoint is replaced, stops serving, or every endpoint goes, or the Service is
//! deleted. With the reconciler the next datagrams reach the new endpoint (or nobody, as
//! upstream v1.37); a control run without it shows them stuck. Unrelated entries survive.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_nlproxy::kernel::conntrack::ctnetlink::NetlinkConntrack;
use kube_nlproxy::kernel::conntrack::{Conntrack, Flow};
use kube_nlproxy::kernel::nft::Family;
use netlink_tests::backend::udp_backend;
use netlink_tests::cluster::{sa, yaml, Cluster, NODE_IP};

/// Sends a datagram every 50 ms from one socket; records who answered.
struct Sender {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Sender {
    fn start(c: &Cluster, ns_idx: Option<usize>, dst: SocketAddr) -> Sender {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let ns = match ns_idx {
            Some(i) => &c.pods[i],
            None => &c.ext,
        };
        let (s2, a2) = (stop.clone(), answers.clone());
        ns.spawn(move || {
            let any = if dst.is_ipv6() {
                "[::]:41000"
            } else {
                "0.0.0.0:41000"
            };
            let s = UdpSocket::bind(any).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut buf = [0u8; 200];
            while !s2.load(Ordering::SeqCst) {
                let _ = s.send_to(b"q", dst);
                if let Ok(n) = s.recv(&mut buf) {
                    let name = String::from_utf8_lossy(&buf[..n])
                        .split(' ')
                        .next()
                        .unwrap()
                        .to_string();
                    a2.lock().unwrap().push((Instant::now(), name));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sender { stop, answers }
    }
    fn names_since(&self, t: Instant) -> Vec<String> {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= t)
            .map(|(_, n)| n.clone())
            .collect()
    }
    fn wait_for(&self, name: &str, since: Instant, within: Duration) -> bool {
        while since.elapsed() < within {
            if self.names_since(since).iter().any(|n| n == name) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn dns_yaml(eps: &[&str]) -> String {
    let mut y = yaml::service(
        "kube-system",
        "dns",
        &["10.96.0.53"],
        &[("dns", "UDP", 53, 30053)],
        "type: NodePort",
    );
    let eps: Vec<_> = eps.iter().map(|ip| yaml::ready(ip, "node1")).collect();
    y += &yaml::slice(
        "kube-system",
        "dns",
        "dns-1",
        "IPv4",
        ("dns", "UDP", 53),
        &eps,
    );
    y
}

/// pods: 0 = A (10.244.1.2), 1 = B (10.244.1.4), 2 = client (10.244.1.3).
fn cluster() -> Cluster {
    let mut c = Cluster::new();
    c.add_pod(2);
    c.add_pod(4);
    c.add_pod(3);
    udp_backend(&c.pods[0], "A", sa("10.244.1.2", 53));
    udp_backend(&c.pods[1], "B", sa("10.244.1.4", 53));
    c
}

fn replace_endpoint(from_pod: Option<usize>, dst: SocketAddr, reconcile: bool) -> bool {
    let c = cluster();
    let extra: &[&str] = if reconcile {
        &[]
    } else {
        &["--no-conntrack-cleanup"]
    };
    let _d = c.start_daemon(&dns_yaml(&["10.244.1.2"]), extra);
    let s = Sender::start(&c, from_pod, dst);
    assert!(
        s.wait_for("A", Instant::now(), Duration::from_secs(5)),
        "A answers first"
    );
    // A goes away: the endpoint is replaced and A's pod is unreachable.
    c.write_manifests(&dns_yaml(&["10.244.1.4"]));
    c.wait_ruleset("ip", "endpoint B", |r| r.contains("10.244.1.4"));
    c.pods[0].ip("link set eth0 down");
    let t = Instant::now();
    s.wait_for("B", t, Duration::from_secs(3))
}

#[test]
fn cluster_ip_client_reaches_new_endpoint_after_replacement() {
    assert!(replace_endpoint(Some(2), sa("10.96.0.53", 53), true));
}

#[test]
fn without_reconciler_cluster_ip_client_stays_stuck() {
    assert!(
        !replace_endpoint(Some(2), sa("10.96.0.53", 53), false),
        "control: the stale entry blackholes the client"
    );
}

#[test]
fn node_port_client_reaches_new_endpoint_after_replacement() {
    assert!(replace_endpoint(None, sa(NODE_IP, 30053), true));
}

#[test]
fn without_reconciler_node_port_client_stays_stuck() {
    assert!(!replace_endpoint(None, sa(NODE_IP, 30053), false));
}

fn no_endpoints_then_one(reconcile: bool) -> bool {
    let c = cluster();
    let extra: &[&str] = if reconcile {
        &[]
    } else {
        &["--no-conntrack-cleanup"]
    };
    let _d = c.start_daemon(&dns_yaml(&[]), extra);
    let s = Sender::start(&c, Some(2), sa("10.96.0.53", 53));
    std::thread::sleep(Duration::from_millis(500));
    assert!(s
        .names_since(Instant::now() - Duration::from_secs(5))
        .is_empty());
    c.write_manifests(&dns_yaml(&["10.244.1.2"]));
    c.wait_ruleset("ip", "endpoint A", |r| r.contains("10.244.1.2"));
    s.wait_for("A", Instant::now(), Duration::from_secs(3))
}

#[test]
fn service_going_from_no_endpoints_to_one_is_reached() {
    // With no endpoints the ClusterIP is rejected (ICMP), which creates no lasting entry on
    // some paths; what matters is that the client is served once the endpoint exists.
    assert!(no_endpoints_then_one(true));
}

#[test]
fn without_reconciler_no_endpoints_then_one_still_works() {
    // Our rules reject new flows to a Service without endpoints in the filter hooks, before
    // conntrack confirms them, so no entry is left behind to go stale (unlike upstream's
    // iptables mode, which is why upstream needs the cleanup for this case).
    assert!(no_endpoints_then_one(false));
}

#[test]
fn unrelated_entries_survive_the_cleanup() {
    let c = cluster();
    let flow = |proto: u8, dst: &str, dport: u16, reply_src: &str, sport: u16| Flow {
        proto,
        orig_src: "10.244.1.3".parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        orig_sport: sport,
        orig_dport: dport,
        reply_src: reply_src.parse().unwrap(),
        reply_dst: "10.244.1.3".parse().unwrap(),
        reply_sport: dport,
        reply_dport: sport,
        zone: 0,
        id: None,
    };
    let keep = vec![
        flow(17, "10.96.0.54", 53, "10.244.1.9", 45001), // another (unknown) service
        flow(6, "10.96.0.53", 53, "10.244.1.9", 45002),  // TCP to our service
        flow(17, "10.244.1.7", 9999, "10.244.1.7", 45003), // not through any service
    ];
    // To our UDP service, answered by an address that is not a serving endpoint.
    let stale = flow(17, "10.96.0.53", 53, "10.244.1.9", 45004);
    let seeded: Vec<_> = keep
        .iter()
        .chain([&stale])
        .map(|f| (f.clone(), 300))
        .collect();
    c.node
        .run(move || NetlinkConntrack::open().unwrap().create(&seeded).unwrap());
    c.sync_once(&dns_yaml(&["10.244.1.2"]), &[]);
    let (udp, tcp) = c.node.run(|| {
        let mut ct = NetlinkConntrack::open().unwrap();
        (
            ct.list(Family::Ip, 17).unwrap(),
            ct.list(Family::Ip, 6).unwrap(),
        )
    });
    let present = |f: &Flow| {
        udp.iter().chain(&tcp).any(|g| {
            g.orig_dst == f.orig_dst
                && g.orig_dport == f.orig_dport
                && g.proto == f.proto
                && g.orig_sport == f.orig_sport
        })
    };
    for f in &keep {
        assert!(present(f), "unrelated entry {f:?} was deleted");
    }
    assert!(!present(&stale), "the stale entry is deleted");
}

/// The DNS Service with endpoints A (10.244.1.2) and B (10.244.1.4) as written here (built
/// by name from [`ep`]), all on node1, and node1 in zone-a.
fn dns_with(eps: &[yaml::SliceEndpoint]) -> String {
    let mut y = yaml::service(
        "kube-system",
        "dns",
        &["10.96.0.53"],
        &[("dns", "UDP", 53, 30053)],
        "type: NodePort",
    );
    y += "---\napiVersion: v1\nkind: Node\nmetadata: {name: node1, labels: {topology.kubernetes.io/zone: zone-a}}\n";
    y += &yaml::slice(
        "kube-system",
        "dns",
        "dns-1",
        "IPv4",
        ("dns", "UDP", 53),
        eps,
    );
    y
}

/// A ready endpoint on node1.
fn ep(ip: &str) -> yaml::SliceEndpoint {
    yaml::ready(ip, "node1")
}

/// A client in pod 2 talks to A through the ClusterIP from one source port; the Service
/// changes to `after`, which puts B in the ruleset (new connections go to B). Returns who
/// answered over the next two seconds, A's pod staying up all along: only "A" when the flow
/// was kept, "B" once it was deleted.
fn answers_after(before: &str, after: &str) -> Vec<String> {
    let c = cluster();
    let _d = c.start_daemon(before, &[]);
    let s = Sender::start(&c, Some(2), sa("10.96.0.53", 53));
    assert!(
        s.wait_for("A", Instant::now(), Duration::from_secs(5)),
        "A answers first"
    );
    c.write_manifests(after);
    c.wait_ruleset("ip", "endpoint B", |r| r.contains("10.244.1.4"));
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    s.names_since(t)
}

const A: &str = "10.244.1.2";
const B: &str = "10.244.1.4";

#[test]
fn a_flow_to_an_endpoint_terminating_but_serving_survives_the_sync() {
    let got = answers_after(
        &dns_with(&[ep(A)]),
        &dns_with(&[ep(A).not_ready().terminating(), ep(B)]),
    );
    assert!(
        !got.is_empty() && got.iter().all(|n| n == "A"),
        "A still serves its flow: {got:?}"
    );
}

#[test]
fn a_flow_to_an_endpoint_hinted_to_another_zone_survives_the_sync() {
    let got = answers_after(
        &dns_with(&[ep(A).zone_hint("zone-a"), ep(B).zone_hint("zone-b")]),
        &dns_with(&[ep(A).zone_hint("zone-b"), ep(B).zone_hint("zone-a")]),
    );
    assert!(
        !got.is_empty() && got.iter().all(|n| n == "A"),
        "A still serves its flow: {got:?}"
    );
}

#[test]
fn a_flow_to_an_endpoint_no_longer_serving_is_deleted() {
    let got = answers_after(
        &dns_with(&[ep(A)]),
        &dns_with(&[ep(A).not_ready().not_serving().terminating(), ep(B)]),
    );
    assert!(got.iter().any(|n| n == "B"), "moved to B: {got:?}");
}

#[test]
fn a_flow_to_a_removed_endpoint_is_deleted_while_its_pod_still_answers() {
    let got = answers_after(&dns_with(&[ep(A)]), &dns_with(&[ep(B)]));
    assert!(got.iter().any(|n| n == "B"), "moved to B: {got:?}");
}

/// One family's addresses for the tests of a Service that loses all of its endpoints or is
/// deleted (kubernetes#139628 and #141371): the ClusterIP, endpoints A and B (pods 0 and 1),
/// the slices' addressType and the nftables family.
struct Fam {
    service_ip: &'static str,
    a: &'static str,
    b: &'static str,
    address_type: &'static str,
    nft: &'static str,
}

const V4: Fam = Fam {
    service_ip: "10.96.0.53",
    a: A,
    b: B,
    address_type: "IPv4",
    nft: "ip",
};

const V6: Fam = Fam {
    service_ip: "fd00:96::53",
    a: "fd00:10:244:1::2",
    b: "fd00:10:244:1::4",
    address_type: "IPv6",
    nft: "ip6",
};

impl Fam {
    /// The cluster of [`cluster`] with A and B answering on this family's addresses.
    fn cluster(&self) -> Cluster {
        let mut c = Cluster::new();
        c.add_pod(2);
        c.add_pod(4);
        c.add_pod(3);
        udp_backend(&c.pods[0], "A", sa(self.a, 53));
        udp_backend(&c.pods[1], "B", sa(self.b, 53));
        c
    }

    /// The UDP DNS Service (NodePort 30053) with `eps`, or without the Service at all.
    fn dns(&self, service: bool, eps: &[&str]) -> String {
        let mut y = String::new();
        if service {
            y += &yaml::service(
                "kube-system",
                "dns",
                &[self.service_ip],
                &[("dns", "UDP", 53, 30053)],
                "type: NodePort",
            );
        }
        let eps: Vec<_> = eps.iter().map(|ip| ep(ip)).collect();
        y += &yaml::slice(
            "kube-system",
            "dns",
            "dns-1",
            self.address_type,
            ("dns", "UDP", 53),
            &eps,
        );
        y
    }
}

/// A client in pod 2 sends from one source port to the ClusterIP and A answers; then the
/// manifests become `gone` (A's pod still up and answering whatever reaches it). Returns who
/// answered over the next two seconds, and whether B answers once the Service is back with
/// B alone. Upstream v1.37's cleanup (and #141371 for a deleted Service): nobody, then B.
fn answers_after_losing_the_service(f: &Fam, gone: &str, cleanup: bool) -> (Vec<String>, bool) {
    let c = f.cluster();
    let extra: &[&str] = if cleanup {
        &[]
    } else {
        &["--no-conntrack-cleanup"]
    };
    let _d = c.start_daemon(&f.dns(true, &[f.a]), extra);
    let s = Sender::start(&c, Some(2), sa(f.service_ip, 53));
    assert!(
        s.wait_for("A", Instant::now(), Duration::from_secs(5)),
        "A answers first"
    );
    c.write_manifests(gone);
    c.wait_ruleset(f.nft, "A gone", |r| !r.contains(f.a));
    // The cleanup follows the commit in the same sync: give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let after = s.names_since(t);
    c.write_manifests(&f.dns(true, &[f.b]));
    c.wait_ruleset(f.nft, "endpoint B", |r| r.contains(f.b));
    (
        after,
        s.wait_for("B", Instant::now(), Duration::from_secs(3)),
    )
}

/// Scaled to zero: the Service stays, its slice has no endpoint.
fn scaled_to_zero(f: &Fam, cleanup: bool) -> (Vec<String>, bool) {
    answers_after_losing_the_service(f, &f.dns(true, &[]), cleanup)
}

/// Deleted: the Service and its slice are gone.
fn deleted(f: &Fam, cleanup: bool) -> (Vec<String>, bool) {
    answers_after_losing_the_service(
        f,
        &yaml::service(
            "default",
            "other",
            &["10.96.0.99"],
            &[("p", "TCP", 80, 0)],
            "",
        ),
        cleanup,
    )
}

#[test]
fn a_udp_flow_of_a_service_scaled_to_zero_is_deleted() {
    for f in [V4, V6] {
        let (after, back) = scaled_to_zero(&f, true);
        assert!(
            after.is_empty(),
            "{}: nobody answers: {after:?}",
            f.address_type
        );
        assert!(
            back,
            "{}: B answers once it is the endpoint",
            f.address_type
        );
    }
}

#[test]
fn without_cleanup_a_udp_flow_of_a_service_scaled_to_zero_stays_on_its_endpoint() {
    let (after, _) = scaled_to_zero(&V4, false);
    assert!(
        after.iter().any(|n| n == "A"),
        "control: the entry keeps the flow on A: {after:?}"
    );
}

#[test]
fn a_udp_flow_of_a_deleted_service_is_deleted() {
    for f in [V4, V6] {
        let (after, back) = deleted(&f, true);
        assert!(
            after.is_empty(),
            "{}: nobody answers: {after:?}",
            f.address_type
        );
        assert!(
            back,
            "{}: B answers once the Service is back",
            f.address_type
        );
    }
}

#[test]
fn without_cleanup_a_udp_flow_of_a_deleted_service_stays_on_its_endpoint() {
    let (after, _) = deleted(&V4, false);
    assert!(
        after.iter().any(|n| n == "A"),
        "control: the entry keeps the flow on A: {after:?}"
    );
}

#[test]
fn conntrack_tuning_from_the_config_file() {
    let c = Cluster::new();
    let cfg = c.dir.join("kp.yaml");
    // maxPerCore 0 leaves nf_conntrack_max (global to the host) alone.
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 1234s\n  tcpCloseWaitTimeout: 61s\n  tcpBeLiberal: true\n  udpTimeout: 45s\n  udpStreamTimeout: 150s\n",
    )
    .unwrap();
    c.sync_once(
        &dns_yaml(&["10.244.1.2"]),
        &["--config", cfg.to_str().unwrap()],
    );
    let read = |k: &str| {
        c.node
            .sh(&format!("cat /proc/sys/net/netfilter/{k}"))
            .trim()
            .to_string()
    };
    assert_eq!(read("nf_conntrack_tcp_timeout_established"), "1234");
    assert_eq!(read("nf_conntrack_tcp_timeout_close_wait"), "61");
    assert_eq!(read("nf_conntrack_tcp_be_liberal"), "1");
    assert_eq!(read("nf_conntrack_udp_timeout"), "45");
    assert_eq!(read("nf_conntrack_udp_timeout_stream"), "150");
}
