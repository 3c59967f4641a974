//! Upstream kube-proxy as the oracle for the data path. Two identical namespace clusters
//! (same addresses, same backends) share one real kube-apiserver: ours runs on the first
//! node, upstream's own kube-proxy (v1.37.2, built from its Go module; it execs Debian's
//! `nft` or `iptables`) on the twin, both as `node1`. One flow table goes through both, and
//! for each flow the outcome must be the same: which endpoints answer, which source address
//! they saw, refused or dropped. A mismatch fails the test unless README's "Deviations from
//! upstream" explains it and the flow is marked with it here.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};

use netlink_tests::backend::{tcp_probe_here, udp_probe, Reply};
use netlink_tests::cluster::{sa, Cluster, Daemon, EXT_IP, EXT_IP_OTHER, NODE_IP, NODE_IP6};
use netlink_tests::controlplane::{ControlPlane, K8S_VERSION};
use netlink_tests::ns::{require_root, sh, NetNs};
use netlink_tests::scenario::{self, Backends, LOCAL_EP, LOCAL_EP6, REMOTE_EP, REMOTE_EP6};

const TWIN_A: &str = "172.30.0.1";
const TWIN_B: &str = "172.30.0.2";
const EXTERNAL_IP: &str = "203.0.113.10";
const LB_IP: &str = "203.0.113.20";

fn upstream_bin() -> PathBuf {
    let p = PathBuf::from(format!(
        "/var/tmp/kube-nlproxy-upstream/{K8S_VERSION}/kube-proxy"
    ));
    assert!(
        p.exists(),
        "{} missing: run netlink-tests/upstream/build.sh",
        p.display()
    );
    p
}

/// Where a probe starts.
#[derive(Debug, Clone, Copy)]
enum From {
    /// The client pod (10.244.1.3).
    Pod,
    /// The local endpoint's own pod (10.244.1.2): hairpin when it picks itself.
    EndpointPod,
    /// Outside, from 192.168.50.2 (fd00:50::2 to IPv6 addresses).
    Ext,
    /// Outside, from 192.168.50.3 (not in the LB's source ranges).
    ExtOther,
    /// The node itself.
    Node,
}

struct Flow {
    name: &'static str,
    from: From,
    to: (&'static str, u16),
    /// Session affinity: one endpoint answers every probe, which one is chance.
    sticky: bool,
    udp: bool,
}

const fn flow(name: &'static str, from: From, to: (&'static str, u16)) -> Flow {
    Flow {
        name,
        from,
        to,
        sticky: false,
        udp: false,
    }
}

const fn udp_flow(name: &'static str, from: From, to: (&'static str, u16)) -> Flow {
    Flow {
        udp: true,
        ..flow(name, from, to)
    }
}

/// The flow table: every Service of [`create_objects`] from the clients that matter.
const FLOWS: &[Flow] = &[
    flow("ClusterIP from a pod", From::Pod, ("10.96.0.10", 80)),
    flow("ClusterIP from the node", From::Node, ("10.96.0.10", 80)),
    flow("ClusterIP, unused port", From::Pod, ("10.96.0.10", 81)),
    flow("unallocated service IP", From::Pod, ("10.96.0.99", 80)),
    flow("NodePort from outside", From::Ext, (NODE_IP, 30080)),
    flow("NodePort from a pod", From::Pod, (NODE_IP, 30080)),
    flow("NodePort via localhost", From::Node, ("127.0.0.1", 30080)),
    flow("externalIP from outside", From::Ext, (EXTERNAL_IP, 80)),
    flow("externalIP from a pod", From::Pod, (EXTERNAL_IP, 80)),
    flow(
        "externalTrafficPolicy Local, NodePort",
        From::Ext,
        (NODE_IP, 30081),
    ),
    flow(
        "externalTrafficPolicy Local, ClusterIP",
        From::Pod,
        ("10.96.0.11", 80),
    ),
    flow("LB IP, allowed source", From::Ext, (LB_IP, 80)),
    flow("LB IP, other source", From::ExtOther, (LB_IP, 80)),
    flow("LB IP from a pod", From::Pod, (LB_IP, 80)),
    flow(
        "LB NodePort, other source",
        From::ExtOther,
        (NODE_IP, 30082),
    ),
    flow("no endpoints, ClusterIP", From::Pod, ("10.96.0.13", 80)),
    flow("no endpoints, NodePort", From::Ext, (NODE_IP, 30083)),
    flow("internalTrafficPolicy Local", From::Pod, ("10.96.0.14", 80)),
    Flow {
        name: "ClientIP affinity",
        from: From::Pod,
        to: ("10.96.0.15", 80),
        sticky: true,
        udp: false,
    },
    flow("terminating endpoints only", From::Pod, ("10.96.0.16", 80)),
    flow("topology hints", From::Pod, ("10.96.0.17", 80)),
    flow(
        "hairpin through internalTrafficPolicy Local",
        From::EndpointPod,
        ("10.96.0.14", 80),
    ),
    flow("IPv6 ClusterIP from a pod", From::Pod, ("fd00:96::20", 80)),
    flow("IPv6 NodePort from outside", From::Ext, (NODE_IP6, 30090)),
    flow(
        "IPv6 ClusterIP, unused port",
        From::Pod,
        ("fd00:96::20", 81),
    ),
    flow("IPv6 no endpoints", From::Pod, ("fd00:96::21", 80)),
    udp_flow("UDP ClusterIP from a pod", From::Pod, ("10.96.0.53", 53)),
    udp_flow("UDP NodePort from outside", From::Ext, (NODE_IP, 30053)),
    udp_flow("UDP, no endpoints", From::Pod, ("10.96.0.54", 53)),
];

/// What a flow did: each (endpoint, source it saw) and each kind of failure.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome(BTreeSet<String>);

fn probe_once(c: &Cluster, f: &Flow, dst: std::net::SocketAddr) -> Reply {
    let (t, from) = (Duration::from_secs(2), f.from);
    if f.udp {
        let ns = match from {
            From::Pod => &c.pods[1],
            From::Ext => &c.ext,
            other => panic!("UDP flows from {other:?} are not probed"),
        };
        return udp_probe(ns, dst);
    }
    let (ns, src): (&NetNs, Option<IpAddr>) = match from {
        From::Pod => (&c.pods[1], None),
        From::EndpointPod => (&c.pods[0], None),
        // ext has one IPv6 address, fd00:50::2.
        From::Ext if dst.is_ipv6() => (&c.ext, None),
        From::Ext => (&c.ext, Some(EXT_IP.parse().unwrap())),
        From::ExtOther => (&c.ext, Some(EXT_IP_OTHER.parse().unwrap())),
        From::Node => (&c.node, None),
    };
    ns.run(move || tcp_probe_here(dst, src, t))
}

/// Probes until the outcome is known: a failure twice, an answer 16 times (both of two
/// endpoints answer at least once with probability 1 - 2^-15).
fn outcome(c: &Cluster, f: &Flow) -> Outcome {
    let dst = sa(f.to.0, f.to.1);
    let first = probe_once(c, f, dst);
    let n = if matches!(first, Reply::Answered { .. }) {
        16
    } else {
        2
    };
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    for r in std::iter::once(first).chain((1..n).map(|_| probe_once(c, f, dst))) {
        match r {
            Reply::Answered { name, peer } => {
                names.insert(name.clone());
                seen.insert(format!("{name} saw {peer}"));
            }
            Reply::Refused => {
                seen.insert("refused".into());
            }
            Reply::Timeout => {
                seen.insert("dropped".into());
            }
            Reply::Error(e) => {
                seen.insert(format!("error {e}"));
            }
        }
    }
    if f.sticky && names.len() == 1 {
        let name = names.into_iter().next().unwrap();
        seen = seen
            .into_iter()
            .map(|s| s.replacen(&name, "one endpoint", 1))
            .collect();
    }
    Outcome(seen)
}

fn slice(name: &str, service: &str, eps: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": "kube-nlproxy-tests"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    }))
    .unwrap()
}

fn slice6(name: &str, service: &str, eps: serde_json::Value) -> EndpointSlice {
    let mut s = slice(name, service, eps);
    s.address_type = "IPv6".into();
    s
}

fn ep(ip: &str, node: &str, ready: bool, serving: bool, terminating: bool) -> serde_json::Value {
    serde_json::json!({"addresses": [ip], "nodeName": node,
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
}

fn both() -> serde_json::Value {
    serde_json::json!([
        ep(LOCAL_EP, "node1", true, true, false),
        ep(REMOTE_EP, "node2", true, true, false)
    ])
}

/// The Node (zone-a) and the flow table's Services and EndpointSlices, through the API.
fn create_objects(cp: &ControlPlane, ns: &NetNs) {
    cp.with_admin(ns, |client| {
        Box::pin(async move {
            let pp = PostParams::default();
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node1", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
                "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP},
                                         {"type": "InternalIP", "address": NODE_IP6}]},
            }))
            .unwrap();
            Api::<Node>::all(client.clone())
                .create(&pp, &node)
                .await
                .unwrap();
            let http = |node_port: Option<u16>| {
                let mut p = serde_json::json!({"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"});
                if let Some(np) = node_port {
                    p["nodePort"] = np.into();
                }
                serde_json::json!([p])
            };
            let services = [
                ("web", serde_json::json!({"type": "NodePort", "clusterIP": "10.96.0.10",
                    "externalIPs": [EXTERNAL_IP], "ports": http(Some(30080))})),
                ("web-local", serde_json::json!({"type": "NodePort", "clusterIP": "10.96.0.11",
                    "externalTrafficPolicy": "Local", "ports": http(Some(30081))})),
                ("lb", serde_json::json!({"type": "LoadBalancer", "clusterIP": "10.96.0.12",
                    "loadBalancerSourceRanges": [format!("{EXT_IP}/32")], "ports": http(Some(30082))})),
                ("empty", serde_json::json!({"type": "NodePort", "clusterIP": "10.96.0.13",
                    "ports": http(Some(30083))})),
                ("itp-local", serde_json::json!({"clusterIP": "10.96.0.14",
                    "internalTrafficPolicy": "Local", "ports": http(None)})),
                ("sticky", serde_json::json!({"clusterIP": "10.96.0.15",
                    "sessionAffinity": "ClientIP", "ports": http(None)})),
                ("term", serde_json::json!({"clusterIP": "10.96.0.16", "ports": http(None)})),
                ("hinted", serde_json::json!({"clusterIP": "10.96.0.17", "ports": http(None)})),
                ("web6", serde_json::json!({"type": "NodePort", "ipFamilyPolicy": "RequireDualStack",
                    "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20", "fd00:96::20"], "ports": http(Some(30090))})),
                ("empty6", serde_json::json!({"ipFamilies": ["IPv6"], "clusterIP": "fd00:96::21",
                    "ports": http(None)})),
                ("dns", serde_json::json!({"type": "NodePort", "clusterIP": "10.96.0.53",
                    "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]})),
                ("dns-empty", serde_json::json!({"clusterIP": "10.96.0.54",
                    "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}]})),
            ];
            let svcs = Api::<Service>::namespaced(client.clone(), "default");
            for (name, spec) in services {
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": name, "namespace": "default"}, "spec": spec,
                }))
                .unwrap();
                svcs.create(&pp, &svc).await.unwrap();
            }
            // The cloud provider's part: the load balancer's address.
            svcs.patch_status(
                "lb",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"loadBalancer": {"ingress": [{"ip": LB_IP}]}}})),
            )
            .await
            .unwrap();
            let mut hinted = both();
            hinted[0]["hints"] = serde_json::json!({"forZones": [{"name": "zone-a"}]});
            hinted[1]["hints"] = serde_json::json!({"forZones": [{"name": "zone-b"}]});
            let slices = [
                slice("web-1", "web", both()),
                slice("web-local-1", "web-local", both()),
                slice("lb-1", "lb", both()),
                slice("itp-local-1", "itp-local", both()),
                slice("sticky-1", "sticky", both()),
                slice(
                    "term-1",
                    "term",
                    serde_json::json!([
                        ep(LOCAL_EP, "node1", false, true, true),
                        ep(REMOTE_EP, "node2", false, false, true)
                    ]),
                ),
                slice("hinted-1", "hinted", hinted),
                slice("web6-1", "web6", both()),
                {
                    let mut s = slice("dns-1", "dns", both());
                    s.ports = Some(vec![serde_json::from_value(
                        serde_json::json!({"name": "dns", "port": 53, "protocol": "UDP"}),
                    )
                    .unwrap()]);
                    s
                },
                slice6(
                    "web6-2",
                    "web6",
                    serde_json::json!([
                        ep(LOCAL_EP6, "node1", true, true, false),
                        ep(REMOTE_EP6, "node2", true, true, false)
                    ]),
                ),
            ];
            let api = Api::<EndpointSlice>::namespaced(client, "default");
            for s in slices {
                api.create(&pp, &s).await.unwrap();
            }
        })
    });
}

/// Upstream kube-proxy in `ns`, reaching the apiserver over the twin link.
struct Upstream {
    child: Child,
    log: PathBuf,
}

impl Upstream {
    fn start(
        ns: &NetNs,
        kubeconfig: &std::path::Path,
        mode: &str,
        dir: &std::path::Path,
    ) -> Upstream {
        let log = dir.join(format!("upstream-{mode}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(upstream_bin())
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "--hostname-override=node1",
                &format!("--proxy-mode={mode}"),
                "--cluster-cidr=10.244.0.0/16,fd00:10:244::/48",
                // Global sysctls a network namespace cannot write.
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0s",
                "--conntrack-tcp-timeout-close-wait=0s",
                "--oom-score-adj=0",
                "--v=2",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start upstream kube-proxy");
        Upstream { child, log }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = netlink_tests::bounded::wait_within(
            &mut self.child,
            Duration::from_secs(10),
            "upstream kube-proxy",
        );
    }
}

/// Waits (bounded) until `done` holds in `ns`'s ruleset dump `cmd`, failing at once when
/// upstream exits.
fn wait_programmed(ns: &NetNs, cmd: &str, done: impl Fn(&str) -> bool, upstream: &mut Upstream) {
    let t0 = Instant::now();
    loop {
        let out = ns.sh(&format!("{cmd} 2>/dev/null || true"));
        if done(&out) {
            return;
        }
        if let Ok(Some(st)) = upstream.child.try_wait() {
            panic!(
                "upstream kube-proxy exited ({st}):\n{}",
                upstream.log_text()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "never programmed ({cmd}):\n{out}\n{}",
            upstream.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Runs the flow table through ours (with `ours_args`) and upstream (in `upstream_mode`),
/// and compares. `deviations`: flows whose outcomes differ by design (README says why).
fn differential(ours_args: &[&str], upstream_mode: &str, deviations: &[&str]) {
    require_root();
    let dual = Backends {
        ipv6: true,
        udp: true,
    };
    let ours = scenario::web_cluster(dual);
    let theirs = scenario::web_cluster(dual);
    sh(&format!(
        "ip link add eth-twin netns {} type veth peer name eth-twin netns {}",
        ours.node.name, theirs.node.name
    ));
    ours.node.ip("link set eth-twin up");
    ours.node.ip(&format!("addr add {TWIN_A}/30 dev eth-twin"));
    theirs.node.ip("link set eth-twin up");
    theirs
        .node
        .ip(&format!("addr add {TWIN_B}/30 dev eth-twin"));
    let cp = ControlPlane::start(&ours.node);
    create_objects(&cp, &ours.node);
    let via = cp.admin_kubeconfig_via(&format!("https://{TWIN_A}:6443"));
    let mut upstream = Upstream::start(&theirs.node, &via, upstream_mode, &cp.dir);
    let admin = cp.admin_kubeconfig();
    let mut args = vec!["--kubeconfig", admin.to_str().unwrap()];
    args.extend_from_slice(ours_args);
    let d: Daemon = ours.start_daemon_with(&args);
    // Both have the last Service's rules before the first probe.
    ours.wait_ruleset("ip", "every Service", |r| r.contains("10.96.0.17"));
    let dump = match upstream_mode {
        "nftables" => "nft list table ip kube-proxy",
        _ => "iptables-save -t nat",
    };
    wait_programmed(
        &theirs.node,
        dump,
        |r| r.contains("10.96.0.17") && r.contains(LB_IP) && r.contains("10.96.0.16"),
        &mut upstream,
    );
    ours.wait_ruleset("ip6", "the IPv6 Services", |r| r.contains("fd00:96::21"));
    let dump6 = match upstream_mode {
        "nftables" => "nft list table ip6 kube-proxy",
        _ => "ip6tables-save -t nat",
    };
    wait_programmed(
        &theirs.node,
        dump6,
        // (iptables mode rejects the endpoint-less one in the filter table)
        |r| r.contains("fd00:96::20"),
        &mut upstream,
    );
    let mut mismatches = Vec::new();
    let mut table = String::new();
    for f in FLOWS {
        let (a, b) = (outcome(&ours, f), outcome(&theirs, f));
        let same = a == b;
        table += &format!(
            "{:<48} {} ours {:?}{}\n",
            f.name,
            if same { "==" } else { "!=" },
            a.0,
            if same {
                String::new()
            } else {
                format!(" upstream {:?}", b.0)
            }
        );
        if !same && !deviations.contains(&f.name) {
            mismatches.push(f.name);
        }
        if same && deviations.contains(&f.name) {
            mismatches.push(f.name); // a listed deviation that no longer differs
        }
    }
    eprintln!("ours ({ours_args:?}) vs upstream {upstream_mode} mode:\n{table}");
    assert!(
        mismatches.is_empty(),
        "outcomes differ from upstream {upstream_mode} mode for {mismatches:?}:\n{table}\nours:\n{}\nupstream:\n{}",
        d.log_text(),
        upstream.log_text().lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn flows_match_upstream_nftables_mode() {
    differential(&["--proxy-mode", "nftables"], "nftables", &[]);
}

#[test]
fn flows_match_upstream_iptables_mode() {
    // README "Deviations from upstream": a ClusterIP's unused port is rejected, as upstream's
    // nftables mode does; upstream's iptables mode leaves it to routing.
    differential(
        &["--proxy-mode", "iptables"],
        "iptables",
        &["ClusterIP, unused port", "IPv6 ClusterIP, unused port"],
    );
}
