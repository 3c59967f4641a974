//! The differential flow table shared by the data-path oracle tests: upstream kube-proxy
//! (built from its Go module) on a twin namespace cluster beside ours, one table of flows
//! through both, outcomes compared (`tests/upstream_differential.rs` against a real
//! kube-apiserver; `tests/ipvs.rs` in the VM, for IPVS mode, against two of our fake API
//! servers serving the same objects).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_nlproxy::source::fixtures::{endpoint_slice, slice_endpoint, SliceBuilder, SliceEndpoint};
use serde_json::{json, Value};

use crate::backend::{tcp_probe_here, udp_probe, Reply};
use crate::cluster::{sa, Cluster, EXT_IP, EXT_IP_OTHER, NODE_IP, NODE_IP6};
use crate::controlplane::K8S_VERSION;
use crate::ns::{sh, NetNs};
use crate::scenario::{LOCAL_EP, LOCAL_EP6, REMOTE_EP, REMOTE_EP6};

pub const TWIN_A: &str = "172.30.0.1";
pub const TWIN_B: &str = "172.30.0.2";
pub const EXTERNAL_IP: &str = "203.0.113.10";
pub const LB_IP: &str = "203.0.113.20";

/// Upstream kube-proxy, as `netlink-tests/upstream/build.sh` caches it.
pub fn upstream_bin() -> PathBuf {
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

/// Links the two nodes (TWIN_A on `a`, TWIN_B on `b`), so that `b` reaches an apiserver
/// listening in `a`.
pub fn twin_link(a: &Cluster, b: &Cluster) {
    twin_link_n(a, b, 0);
}

/// The `k`th twin of `a`: link `eth-twinK`, 172.30.K.1 on `a`, 172.30.K.2 on `b`; returns
/// `a`'s address.
pub fn twin_link_n(a: &Cluster, b: &Cluster, k: u8) -> String {
    let dev = format!(
        "eth-twin{}",
        if k == 0 { String::new() } else { k.to_string() }
    );
    sh(&format!(
        "ip link add {dev} netns {} type veth peer name {dev} netns {}",
        a.node.name, b.node.name
    ));
    let (ours, theirs) = if k == 0 {
        (TWIN_A.to_string(), TWIN_B.to_string())
    } else {
        (format!("172.30.{k}.1"), format!("172.30.{k}.2"))
    };
    a.node.ip(&format!("link set {dev} up"));
    a.node.ip(&format!("addr add {ours}/30 dev {dev}"));
    b.node.ip(&format!("link set {dev} up"));
    b.node.ip(&format!("addr add {theirs}/30 dev {dev}"));
    ours
}

/// The side-by-side harness: two identical dual-stack clusters with UDP backends (ours,
/// theirs), linked (`TWIN_A` on ours' node, `TWIN_B` on theirs'), and one real
/// kube-apiserver in ours' node namespace.
pub fn twins() -> (Cluster, Cluster, crate::controlplane::ControlPlane) {
    let dual = crate::scenario::Backends {
        ipv6: true,
        udp: true,
    };
    let ours = crate::scenario::web_cluster(dual);
    let theirs = crate::scenario::web_cluster(dual);
    twin_link(&ours, &theirs);
    let cp = crate::controlplane::ControlPlane::start(&ours.node);
    (ours, theirs, cp)
}

/// `GET /metrics` from `addr` inside `ns` (the proxies' metrics servers).
pub fn metrics(ns: &NetNs, addr: &str) -> String {
    use std::io::{Read, Write};
    let addr = addr.to_string();
    ns.run(move || {
        let Ok(mut s) = std::net::TcpStream::connect(&addr) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let _ = write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        );
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
}

/// The sum over label sets of the Prometheus sample `name` in `text` (0 when absent).
pub fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Where a probe starts.
#[derive(Debug, Clone, Copy)]
pub enum From {
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

pub struct Flow {
    pub name: &'static str,
    pub from: From,
    pub to: (&'static str, u16),
    /// Session affinity: one endpoint answers every probe, which one is chance.
    pub sticky: bool,
    pub udp: bool,
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
pub const FLOWS: &[Flow] = &[
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

/// Flows to loopback NodePorts beyond [`FLOWS`]' TCP one, for the runs where upstream serves
/// or rejects them (nftables mode with its gate `KubeProxyNFTablesLocalhostNodePorts`).
pub const LOCALHOST_FLOWS: &[Flow] = &[
    udp_flow(
        "UDP NodePort via localhost",
        From::Node,
        ("127.0.0.1", 30053),
    ),
    flow("IPv6 NodePort via localhost", From::Node, ("::1", 30090)),
];

/// What a flow did: each (endpoint, source it saw) and each kind of failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome(pub BTreeSet<String>);

fn probe_once(c: &Cluster, f: &Flow, dst: std::net::SocketAddr) -> Reply {
    let (t, from) = (Duration::from_secs(2), f.from);
    if f.udp {
        let ns = match from {
            From::Pod => &c.pods[1],
            From::Ext => &c.ext,
            From::Node => &c.node,
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
pub fn outcome(c: &Cluster, f: &Flow) -> Outcome {
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

/// A slice of `service` in `default` from the shared builder, managed by the tests (the
/// real API server keeps the controller's hands off it).
fn slice(name: &str, service: &str) -> SliceBuilder {
    endpoint_slice("default", service, name).label(
        "endpointslice.kubernetes.io/managed-by",
        "kube-nlproxy-tests",
    )
}

/// The Node (zone-a) and the flow table's Services and EndpointSlices, with every field the
/// API server defaults written out (a fake server serves them as they are; the real one
/// accepts them unchanged). A Service's `status` is the cloud provider's part: create
/// without it, then set it.
pub fn objects() -> Vec<Value> {
    let http = |node_port: Option<u16>| {
        let mut p = json!({"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"});
        if let Some(np) = node_port {
            p["nodePort"] = np.into();
        }
        json!([p])
    };
    let dns = |node_port: Option<u16>| {
        let mut p = json!({"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"});
        if let Some(np) = node_port {
            p["nodePort"] = np.into();
        }
        json!([p])
    };
    let mut out = vec![json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node1", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP},
                                 {"type": "InternalIP", "address": NODE_IP6}]},
    })];
    let service = |name: &str, ty: &str, ips: &[&str], ports: Value, extra: Value| {
        let family = |ip: &&str| if ip.contains(':') { "IPv6" } else { "IPv4" };
        let mut spec = json!({
            "type": ty, "clusterIP": ips[0], "clusterIPs": ips,
            "ipFamilies": ips.iter().map(family).collect::<Vec<_>>(),
            "ipFamilyPolicy": if ips.len() > 1 { "RequireDualStack" } else { "SingleStack" },
            "sessionAffinity": "None", "internalTrafficPolicy": "Cluster", "ports": ports,
        });
        if ty != "ClusterIP" {
            spec["externalTrafficPolicy"] = "Cluster".into();
        }
        if ty == "LoadBalancer" {
            spec["allocateLoadBalancerNodePorts"] = true.into();
        }
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "default"}, "spec": spec})
    };
    out.extend([
        service(
            "web",
            "NodePort",
            &["10.96.0.10"],
            http(Some(30080)),
            json!({"externalIPs": [EXTERNAL_IP]}),
        ),
        service(
            "web-local",
            "NodePort",
            &["10.96.0.11"],
            http(Some(30081)),
            json!({"externalTrafficPolicy": "Local"}),
        ),
        {
            let mut lb = service(
                "lb",
                "LoadBalancer",
                &["10.96.0.12"],
                http(Some(30082)),
                json!({"loadBalancerSourceRanges": [format!("{EXT_IP}/32")]}),
            );
            lb["status"] = json!({"loadBalancer": {"ingress": [{"ip": LB_IP, "ipMode": "VIP"}]}});
            lb
        },
        service(
            "empty",
            "NodePort",
            &["10.96.0.13"],
            http(Some(30083)),
            json!({}),
        ),
        service(
            "itp-local",
            "ClusterIP",
            &["10.96.0.14"],
            http(None),
            json!({"internalTrafficPolicy": "Local"}),
        ),
        service(
            "sticky",
            "ClusterIP",
            &["10.96.0.15"],
            http(None),
            json!({"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}}}),
        ),
        service("term", "ClusterIP", &["10.96.0.16"], http(None), json!({})),
        service(
            "hinted",
            "ClusterIP",
            &["10.96.0.17"],
            http(None),
            json!({}),
        ),
        service(
            "web6",
            "NodePort",
            &["10.96.0.20", "fd00:96::20"],
            http(Some(30090)),
            json!({}),
        ),
        service(
            "empty6",
            "ClusterIP",
            &["fd00:96::21"],
            http(None),
            json!({}),
        ),
        service(
            "dns",
            "NodePort",
            &["10.96.0.53"],
            dns(Some(30053)),
            json!({}),
        ),
        service(
            "dns-empty",
            "ClusterIP",
            &["10.96.0.54"],
            dns(None),
            json!({}),
        ),
    ]);
    let local = |ip: &str| slice_endpoint(ip).node("node1");
    let remote = |ip: &str| slice_endpoint(ip).node("node2");
    let both = [local(LOCAL_EP), remote(REMOTE_EP)];
    let hinted = [
        local(LOCAL_EP).zone_hint("zone-a"),
        remote(REMOTE_EP).zone_hint("zone-b"),
    ];
    let v4 = |name: &str, svc: &str, eps: &[SliceEndpoint]| {
        slice(name, svc)
            .port("http", 8080)
            .endpoints(eps.iter().cloned())
            .json()
    };
    out.extend([
        v4("web-1", "web", &both),
        v4("web-local-1", "web-local", &both),
        v4("lb-1", "lb", &both),
        v4("itp-local-1", "itp-local", &both),
        v4("sticky-1", "sticky", &both),
        v4(
            "term-1",
            "term",
            &[
                local(LOCAL_EP).not_ready().terminating(),
                remote(REMOTE_EP).not_ready().not_serving().terminating(),
            ],
        ),
        v4("hinted-1", "hinted", &hinted),
        v4("web6-1", "web6", &both),
        slice("web6-2", "web6")
            .address_type("IPv6")
            .port("http", 8080)
            .endpoints([local(LOCAL_EP6), remote(REMOTE_EP6)])
            .json(),
        slice("dns-1", "dns")
            .port_with_protocol("dns", "UDP", 53)
            .endpoints(both)
            .json(),
    ]);
    out
}

/// Upstream kube-proxy in `ns`, reaching the apiserver over the twin link.
pub struct Upstream {
    pub child: Child,
    log: PathBuf,
}

impl Upstream {
    /// Starts it in `ns` in `mode`; `api` says where the API server is (`--kubeconfig=…`
    /// or `--master=…`); its log goes to `dir`.
    pub fn start(ns: &NetNs, mode: &str, api: &[&str], dir: &Path) -> Upstream {
        let log = dir.join(format!("upstream-{mode}.log"));
        let child = crate::bounded::dies_with_parent(&mut Command::new("ip"))
            .args(["netns", "exec", &ns.name])
            .arg(upstream_bin())
            .args(api)
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

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = crate::bounded::wait_within(
            &mut self.child,
            Duration::from_secs(10),
            "upstream kube-proxy",
        );
    }
}

/// How long upstream may take to program [`objects`]. On the host it takes seconds. In the
/// IPVS tests' emulated VM, v1.37.2's IPVS mode runs `ipset add` once per set entry, each
/// process ~0.1-0.3 s there, and its IPv6 proxier starts only once the IPv4 one has finished
/// its first sync (the metaproxier calls them in turn): IPv6 was still unprogrammed 60 s on.
const UPSTREAM_PROGRAM_WAIT: Duration = Duration::from_secs(240);

/// Waits (bounded by [`UPSTREAM_PROGRAM_WAIT`]) until `done` holds in `ns`'s ruleset dump
/// `cmd`, failing at once when upstream exits.
pub fn wait_programmed(
    ns: &NetNs,
    cmd: &str,
    done: impl Fn(&str) -> bool,
    upstream: &mut Upstream,
) {
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
            t0.elapsed() < UPSTREAM_PROGRAM_WAIT,
            "never programmed ({cmd}) within {UPSTREAM_PROGRAM_WAIT:?}:\n{out}\n{}",
            upstream.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Compares every flow of [`FLOWS`] and `extra` on `ours` and `theirs`; `deviations` are the
/// flows that must differ (docs/features.md, "Deviations from upstream"). Returns the table and the
/// flows that broke the expectation (a listed deviation that no longer differs included).
pub fn compare(
    ours: &Cluster,
    theirs: &Cluster,
    deviations: &[&str],
    extra: &[Flow],
) -> (String, Vec<&'static str>) {
    let mut mismatches = Vec::new();
    let mut table = String::new();
    for f in FLOWS.iter().chain(extra) {
        let (a, b) = (outcome(ours, f), outcome(theirs, f));
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
        if same == deviations.contains(&f.name) {
            mismatches.push(f.name);
        }
    }
    (table, mismatches)
}

/// How a mode's programmed state is read back, to wait until a proxy has every Service
/// before probing: (command, what its output must contain).
fn programmed_checks(mode: &str, upstream: bool) -> Vec<(&'static str, Vec<&'static str>)> {
    match (mode, upstream) {
        ("ipvs", _) => vec![(
            "ipvsadm -Ln",
            vec!["10.96.0.17:80", "[fd00:96::20]:80", LB_IP],
        )],
        ("nftables", true) => vec![
            (
                "nft list table ip kube-proxy",
                vec!["10.96.0.17", LB_IP, "10.96.0.16"],
            ),
            (
                "nft list table ip6 kube-proxy",
                vec!["fd00:96::20", "fd00:96::21"],
            ),
        ],
        (_, true) => vec![
            (
                "iptables-save -t nat",
                vec!["10.96.0.17", LB_IP, "10.96.0.16"],
            ),
            // (iptables mode rejects the endpoint-less one in the filter table)
            ("ip6tables-save -t nat", vec!["fd00:96::20"]),
        ],
        (_, false) => vec![
            (
                "nft list table ip kube-nlproxy",
                vec!["10.96.0.17", LB_IP, "10.96.0.16"],
            ),
            (
                "nft list table ip6 kube-nlproxy",
                vec!["fd00:96::20", "fd00:96::21"],
            ),
        ],
    }
}

/// The comparison where no real apiserver can run (the VM): each twin node gets one of our
/// fake API servers, both serving [`objects`]; ours runs with `ours_args`, upstream in
/// `upstream_mode`. Panics with both logs on a mismatch not in `deviations`.
pub fn fake_differential(ours_args: &[&str], upstream_mode: &str, deviations: &[&str]) {
    use crate::apiserver::ApiServer;
    let dual = crate::scenario::Backends {
        ipv6: true,
        udp: true,
    };
    let ours = crate::scenario::web_cluster(dual);
    let theirs = crate::scenario::web_cluster(dual);
    let serve = |c: &Cluster| {
        let api = c.node.run(ApiServer::start);
        for o in objects() {
            api.apply(o);
        }
        api
    };
    let (api_ours, api_theirs) = (serve(&ours), serve(&theirs));
    let master = format!("--master={}", api_theirs.url());
    let mut upstream = Upstream::start(
        &theirs.node,
        upstream_mode,
        &[&master, "--kube-api-content-type=application/json"],
        &theirs.dir,
    );
    let url = api_ours.url();
    let mut args = vec!["--master", url.as_str()];
    args.extend_from_slice(ours_args);
    let d = ours.start_daemon_with(&args);
    let ours_mode = if upstream_mode == "ipvs" {
        "ipvs"
    } else {
        "ours"
    };
    let relabel = |zone: &str| {
        let mut node = objects().swap_remove(0);
        node["metadata"]["labels"]["topology.kubernetes.io/zone"] = zone.into();
        api_theirs.apply(node);
    };
    check_flows(
        (&ours, ours_mode, &|| d.log_text()),
        (&theirs, upstream_mode, &mut upstream),
        &relabel,
        &format!("ours ({ours_args:?}) vs upstream {upstream_mode} mode"),
        deviations,
        &[],
    );
}

/// Waits (bounded) until both proxies have programmed every Service of [`objects`], then
/// runs [`compare`] and fails with both logs on a mismatch not in `deviations`. `ours` is
/// (cluster, its mode's readback key: "ours" or "ipvs", its log); `theirs` is (cluster,
/// upstream's mode, upstream); `relabel_theirs` sets the zone label of upstream's Node;
/// `extra` flows go through both after [`FLOWS`].
pub fn check_flows(
    ours: (&Cluster, &str, &dyn Fn() -> String),
    theirs: (&Cluster, &str, &mut Upstream),
    relabel_theirs: &dyn Fn(&str),
    label: &str,
    deviations: &[&str],
    extra: &[Flow],
) {
    let (ours, ours_mode, ours_log) = ours;
    let (theirs, upstream_mode, upstream) = theirs;
    wait_ours_programmed(ours, ours_mode, ours_log);
    for (cmd, want) in programmed_checks(upstream_mode, true) {
        wait_programmed(
            &theirs.node,
            cmd,
            |r| want.iter().all(|w| r.contains(w)),
            upstream,
        );
    }
    tell_upstream_its_zone(ours, theirs, relabel_theirs);
    let (table, mismatches) = compare(ours, theirs, deviations, extra);
    eprintln!("{label}:\n{table}");
    assert!(
        mismatches.is_empty(),
        "{label}: outcomes differ for {mismatches:?} (or a listed deviation no longer differs):\n{table}\nours:\n{}\nupstream:\n{}",
        ours_log(),
        upstream.log_text().lines().rev().take(60).collect::<Vec<_>>().join("\n")
    );
}

/// Upstream v1.37.2 adds its Node topology handler to the NodeManager's informer, already
/// synced, and registers the proxier with it one statement later
/// (`cmd/kube-proxy/app/server.go:632-633`): the informer's replayed Add can run in between,
/// and the zone it records is then never passed on (upstream logs "Ignoring same-zone
/// topology hints ... node is missing label" at every sync; seen in the VM, where its start
/// is slow). Moving upstream's Node to another zone and back makes two label changes that do
/// reach its proxier; then wait (bounded) until both proxies route the "topology hints" flow
/// as ours did before, so the comparison sees upstream with its zone.
fn tell_upstream_its_zone(ours: &Cluster, theirs: &Cluster, relabel_theirs: &dyn Fn(&str)) {
    let flow = FLOWS
        .iter()
        .find(|f| f.name == "topology hints")
        .expect("the flow table has a topology hints flow");
    let want = outcome(ours, flow);
    relabel_theirs("zone-elsewhere");
    relabel_theirs("zone-a");
    let deadline = Instant::now() + Duration::from_secs(30);
    while outcome(theirs, flow) != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The backend `web_cluster` runs behind an endpoint of [`objects`] (`ip:port`).
pub fn backend_at(endpoint: &str) -> Option<&'static str> {
    Some(match endpoint {
        "10.244.1.2:8080" => "local",
        "10.244.2.2:8080" => "remote",
        "[fd00:10:244:1::2]:8080" => "local6",
        "[fd00:10:244:2::2]:8080" => "remote6",
        "10.244.1.2:53" => "dns-local",
        "10.244.2.2:53" => "dns-remote",
        _ => return None,
    })
}

/// The source address `ns` sends to `dst` from (`ip route get`).
fn route_src(ns: &NetNs, dst: &str) -> String {
    let out = ns.sh(&format!("ip route get {dst}"));
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            if let Some(a) = words.next() {
                return a.to_string();
            }
        }
    }
    panic!("no src in `ip route get {dst}`: {out}")
}

/// Runs `kube-nlproxy explain --json ARGS` in `ns`: the report, or its error line.
pub fn explain_json(ns: &NetNs, args: &[&str]) -> Result<Value, String> {
    let bin = crate::cluster::proxy_bin();
    let mut all = vec!["explain", "--json"];
    all.extend_from_slice(args);
    let out = ns.output(bin.to_str().unwrap(), &all);
    let code = out.status.code();
    if !matches!(code, Some(0 | 1)) {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let report: Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("explain printed no JSON: {e}"))?;
    // Exit status 1 exactly when some outcome is a drop or a reject (0 otherwise).
    let refused = report["tables"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["outcomes"].as_array().into_iter().flatten())
        .any(|o| matches!(o["verdict"].as_str(), Some("drop" | "reject")));
    if code != Some(i32::from(refused)) {
        return Err(format!(
            "explain exited {code:?}, but the report {} a drop or reject",
            if refused { "has" } else { "has no" }
        ));
    }
    Ok(report)
}

/// What `kube-nlproxy explain` says flow `f` does on `c`'s node, in [`outcome`]'s terms:
/// each endpoint that may answer with the source it sees (the client's, or the node's
/// address towards the endpoint when masqueraded), refused or dropped. `Err` when explain
/// cannot name the answer (a packet accepted to a local socket) or failed.
pub fn explained(c: &Cluster, f: &Flow) -> Result<Outcome, String> {
    let dst = sa(f.to.0, f.to.1);
    let from = match f.from {
        From::Pod if dst.is_ipv6() => "fd00:10:244:1::3",
        From::Pod => "10.244.1.3",
        From::EndpointPod if dst.is_ipv6() => LOCAL_EP6,
        From::EndpointPod => LOCAL_EP,
        From::Ext if dst.is_ipv6() => crate::cluster::EXT_IP6,
        From::Ext => EXT_IP,
        From::ExtOther => EXT_IP_OTHER,
        From::Node => "node",
    };
    let to = format!("{dst}/{}", if f.udp { "udp" } else { "tcp" });
    let r = explain_json(&c.node, &["--from", from, "--to", &to])?;
    let client = r["source"]
        .as_str()
        .and_then(|s| s.parse::<std::net::SocketAddr>().ok())
        .map(|s| s.ip().to_string())
        .ok_or("no source in the report")?;
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    let mut answer = |endpoint: &str, masq: bool, seen: &mut BTreeSet<String>| {
        let name = backend_at(endpoint).ok_or(format!("DNAT to unknown endpoint {endpoint}"))?;
        let ip = endpoint
            .parse::<std::net::SocketAddr>()
            .map_err(|e| e.to_string())?
            .ip()
            .to_string();
        let peer = if masq {
            route_src(&c.node, &ip)
        } else {
            client.clone()
        };
        names.insert(name.to_string());
        seen.insert(format!("{name} saw {peer}"));
        Ok::<(), String>(())
    };
    let tables = r["tables"].as_array().cloned().unwrap_or_default();
    for t in &tables {
        for o in t["outcomes"].as_array().cloned().unwrap_or_default() {
            if o["probability"].as_f64().unwrap_or(0.0) <= 0.0 {
                continue;
            }
            let masq = o["masquerade"].as_bool().unwrap_or(false);
            match o["verdict"].as_str().unwrap_or("") {
                "dnat" => answer(o["destination"].as_str().unwrap_or(""), masq, &mut seen)?,
                "reject" => {
                    seen.insert("refused".into());
                }
                "drop" => {
                    seen.insert("dropped".into());
                }
                // Delivered to a socket on loopback (our localhost NodePort listener):
                // explain cannot see behind a socket.
                "accept" if r["ipvs"].is_null() && dst.ip().is_loopback() => {
                    return Err("delivered to a local socket on loopback".into())
                }
                // Delivered to this host (a VIP of IPVS mode's dummy link without a
                // virtual server for the port): nothing of the test network listens there.
                "accept"
                    if r["ipvs"].is_null()
                        && o["detail"]
                            .as_str()
                            .is_some_and(|d| d.ends_with("delivered to this host")) =>
                {
                    seen.insert("refused".into());
                }
                "accept" if !r["ipvs"].is_null() => {
                    let servers = r["ipvs"]["realServers"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if servers.is_empty() {
                        seen.insert("refused".into());
                    }
                    for s in servers {
                        if s["weight"].as_u64().unwrap_or(0) > 0 {
                            let masq = s["masquerade"].as_bool().unwrap_or(false);
                            answer(s["address"].as_str().unwrap_or(""), masq, &mut seen)?;
                        }
                    }
                }
                // Untouched by our rules and routed on: in the test network nothing past
                // the node answers an address no Service holds, so the client times out.
                "accept"
                    if o["detail"]
                        .as_str()
                        .is_some_and(|d| d.ends_with("routed on")) =>
                {
                    seen.insert("dropped".into());
                }
                v => return Err(format!("explain: {v} ({})", o["detail"])),
            }
        }
    }
    // IPVS persistence: the scheduler picks once, then the same real server answers.
    let persistent = r["ipvs"]["persistence"].as_u64().unwrap_or(0) > 0;
    if f.sticky && (names.len() == 1 || persistent) {
        seen = seen
            .into_iter()
            .map(|s| {
                names.iter().fold(s, |s, n| {
                    s.replacen(&format!("{n} saw"), "one endpoint saw", 1)
                })
            })
            .collect();
    }
    Ok(Outcome(seen))
}

/// Waits (bounded) until ours has programmed every Service of [`objects`] in `mode`
/// ("ours" for the nftables table, "ipvs").
pub fn wait_ours_programmed(c: &Cluster, mode: &str, log: &dyn Fn() -> String) {
    for (cmd, want) in programmed_checks(mode, false) {
        let t0 = Instant::now();
        loop {
            let out = c.node.sh(&format!("{cmd} 2>/dev/null || true"));
            if want.iter().all(|w| out.contains(w)) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "ours never programmed ({cmd}):\n{out}\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Every flow of [`FLOWS`] through real packets and through `explain` on `c` (ours
/// running in `mode`); fails listing each flow where they differ. `unexplained` names the
/// flows explain cannot predict (and says why in the caller); each must stay so.
pub fn check_explained(c: &Cluster, unexplained: &[&str], log: &dyn Fn() -> String) {
    let mut table = String::new();
    let mut bad = Vec::new();
    for f in FLOWS {
        // Probes first: a sticky flow's affinity entry is then in the kernel, and explain
        // must find it.
        let real = outcome(c, f);
        let predicted = explained(c, f);
        let ok = match &predicted {
            Ok(p) => *p == real && !unexplained.contains(&f.name),
            Err(_) => unexplained.contains(&f.name),
        };
        table.push_str(&format!(
            "{} {:<45} packets {:?}\n{:>48} explain {:?}\n",
            if ok { " " } else { "✗" },
            f.name,
            real.0,
            "",
            predicted.as_ref().map(|p| &p.0)
        ));
        if !ok {
            bad.push(f.name);
        }
    }
    eprintln!("{table}");
    assert!(
        bad.is_empty(),
        "explain differs from real packets for {bad:?}:\n{table}\nours:\n{}",
        log()
    );
}
