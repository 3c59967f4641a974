//! Fuzz entry points: one function per decoder of untrusted input, each taking arbitrary
//! bytes. None may panic, hang or allocate without bound, whatever the bytes. libFuzzer runs
//! them from `fuzz/` (`cargo xtask fuzz`); this module's tests run each over its seeds
//! ([`seeds`]) and every input that once failed (`fuzz/regressions/TARGET`). Pure but for
//! [`write_seeds_from_env`], which a libFuzzer binary calls once before it reads its corpus.
//!
//! What is untrusted: the kernel's netlink replies and notifications (another program may
//! have written the objects we read back), the API server's watch events, manifests and the
//! config file on disk, the command line, and the `explain` tool's packet description.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{ObjectList, WatchEvent};

use crate::kernel::netlink::msg::{parse_error, parse_msgs, RawMsg};
use crate::kernel::nft::Family;
use crate::source::convert::{build_state, Snapshot};
use crate::source::kube::lenient::Lenient;
use crate::source::kube::protobuf::ProtobufKind;

/// One fuzz target: its name (the libFuzzer binary's and the corpus directory's) and entry.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order `cargo xtask fuzz` runs them.
pub const TARGETS: &[Target] = &[
    ("nft_reply", nft_reply),
    ("ctnetlink_reply", ctnetlink_reply),
    ("ipvs_reply", ipvs_reply),
    ("rtnl_reply", rtnl_reply),
    ("ipset_reply", ipset_reply),
    ("xtables_blob", xtables_blob),
    ("watch_event", watch_event),
    ("protobuf_event", protobuf_event),
    ("manifest", manifest),
    ("config_file", config_file),
    ("flags", flags),
    ("duration", duration),
    ("explain", explain),
];

/// Writes `target`'s seeds as `seed-N` files into the directory `KNP_FUZZ_SEEDS` names, if
/// set: each libFuzzer binary's init, before libFuzzer reads that directory as its corpus
/// (`cargo xtask fuzz` sets it). A seed that cannot be written is reported and the rest
/// skipped. A separate seed-writing binary would not link: every crate
/// of an instrumented build needs libFuzzer's runtime.
pub fn write_seeds_from_env(target: &str) {
    let Some(dir) = std::env::var_os("KNP_FUZZ_SEEDS") else {
        return;
    };
    let dir = std::path::Path::new(&dir);
    let mine = seeds().into_iter().filter(|s| s.0 == target);
    for (i, (_, bytes)) in mine.enumerate() {
        let f = dir.join(format!("seed-{i}"));
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&f, bytes)) {
            // libFuzzer then starts from the corpus it has (or an empty input): the run is
            // weaker, not wrong, and the message says why.
            eprintln!("cannot write seed {}: {e}", f.display());
            return;
        }
    }
}

/// The node the Kubernetes inputs are converted for.
const NODE: &str = "node-1";

/// The messages of one datagram, each also read as an `NLMSG_ERROR` (what `recv` does first).
fn messages(data: &[u8]) -> Vec<RawMsg<'_>> {
    let msgs = parse_msgs(data).unwrap_or_default();
    for m in &msgs {
        let _ = parse_error(m);
    }
    msgs
}

/// nf_tables dump replies and monitor notifications: every decoder on every message (the
/// kernel's message type is the one field an attacker cannot choose, so none is skipped).
pub fn nft_reply(data: &[u8]) {
    use crate::kernel::nft::decode::*;
    for m in messages(data) {
        let _ = decode_gen_id(&m);
        let _ = decode_table(&m);
        let _ = decode_chain(&m);
        let _ = decode_set(&m);
        let _ = decode_rule(&m);
        let _ = decode_rule_jumps(&m);
        let _ = decode_elements(&m);
        let _ = crate::kernel::nft::monitor::is_foreign_change(
            &m,
            crate::proxy::names::DEFAULT_TABLE,
            &[Family::Ip, Family::Ip6],
            1,
        );
    }
}

/// ctnetlink dump replies (conntrack entries).
pub fn ctnetlink_reply(data: &[u8]) {
    for m in messages(data) {
        let _ = crate::kernel::conntrack::codec::decode_flow(&m);
    }
}

/// IPVS generic netlink replies: virtual servers, real servers of either family, timeouts,
/// and the family-id lookup.
pub fn ipvs_reply(data: &[u8]) {
    use crate::kernel::ipvs::codec::*;
    for m in messages(data) {
        let _ = decode_family_id(&m);
        let _ = decode_service(&m);
        let _ = decode_dest(&m, libc::AF_INET as u16);
        let _ = decode_dest(&m, libc::AF_INET6 as u16);
        let _ = decode_config(&m);
    }
}

/// rtnetlink replies and notifications: links, routes, addresses.
pub fn rtnl_reply(data: &[u8]) {
    use crate::kernel::rtnl::codec::*;
    for m in messages(data) {
        let _ = decode_link(&m);
        let _ = decode_deleted_link(&m);
        let _ = decode_route(&m);
        let _ = decode_addr(&m);
    }
}

/// ipset replies (set names, read to remove upstream IPVS mode's leftovers).
pub fn ipset_reply(data: &[u8]) {
    for m in messages(data) {
        let _ = crate::kernel::ipset::codec::decode_set_name(&m);
    }
}

/// An x_tables table as `IPT_SO_GET_INFO` and `IPT_SO_GET_ENTRIES` return it, in both entry
/// layouts: its chains listed and upstream's removed (the legacy cleanup's rewrite).
/// The first `GETINFO_LEN` (84) bytes are the `ipt_getinfo`, the rest the entries.
pub fn xtables_blob(data: &[u8]) {
    use crate::kernel::xtables::blob::{parse_info, remove_chains, user_chains, TableBlob};
    use crate::kernel::xtables::uapi::{GETINFO_LEN, IPV4, IPV6};
    let (info, entries) = data.split_at(data.len().min(GETINFO_LEN));
    let Some((valid_hooks, hook_entry, underflow, num_entries, _)) = parse_info(info) else {
        return;
    };
    let blob = TableBlob {
        name: "filter".into(),
        valid_hooks,
        hook_entry,
        underflow,
        num_entries,
        entries: entries.to_vec(),
    };
    for layout in [IPV4, IPV6] {
        let _ = user_chains(layout, &blob);
        if let Ok(Some(rewrite)) = remove_chains(layout, &blob, |c| c.starts_with("KUBE-")) {
            let _ = user_chains(layout, &rewrite.table);
        }
    }
}

/// A watch event or a list from the API server, as the lenient decoder reads it, then
/// converted into the proxy's state. The first byte picks the kind (Service, EndpointSlice,
/// Node, ServiceCIDR), its low bit a watch event or a list.
pub fn watch_event(data: &[u8]) {
    let Some((&pick, json)) = data.split_first() else {
        return;
    };
    let mut snap = Snapshot::default();
    let list = pick & 1 == 1;
    match (pick >> 1) % 4 {
        0 => snap.services = decoded::<Service>(json, list),
        1 => snap.endpoint_slices = decoded::<EndpointSlice>(json, list),
        2 => snap.node = decoded::<Node>(json, list).into_iter().next(),
        _ => snap.service_cidrs = decoded::<ServiceCIDR>(json, list),
    }
    let _ = build_state(&snap, NODE, &Default::default());
}

/// A protobuf response from the API server, as the protobuf watcher reads it, then
/// converted into the proxy's state. The first byte picks the kind as in [`watch_event`],
/// its low bit a watch stream (4-byte frames, each a `WatchEvent`) or a list body.
pub fn protobuf_event(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let mut snap = Snapshot::default();
    let list = pick & 1 == 1;
    match (pick >> 1) % 4 {
        0 => snap.services = protobuf_decoded::<Service>(body, list),
        1 => snap.endpoint_slices = protobuf_decoded::<EndpointSlice>(body, list),
        2 => snap.node = protobuf_decoded::<Node>(body, list).into_iter().next(),
        _ => snap.service_cidrs = protobuf_decoded::<ServiceCIDR>(body, list),
    }
    let _ = build_state(&snap, NODE, &Default::default());
}

fn protobuf_decoded<K: ProtobufKind>(body: &[u8], list: bool) -> Vec<K> {
    use crate::source::kube::protobuf::decode::{self, WatchEvent};
    let objects: Vec<Lenient<K>> = if list {
        decode::list::<K>(body).map(|l| l.items).unwrap_or_default()
    } else {
        let mut frames = crate::source::kube::protobuf::wire::Frames::default();
        frames.push(body);
        let mut out = Vec::new();
        while let Ok(Some(f)) = frames.next_frame() {
            if let Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) =
                decode::watch_event::<K>(f)
            {
                out.push(o);
            }
        }
        let _ = frames.finish();
        out
    };
    objects
        .into_iter()
        .filter_map(|o| o.decoded().ok())
        .collect()
}

/// The objects of kind `K` that decode from a watch event (`list` false) or a list.
fn decoded<K>(json: &[u8], list: bool) -> Vec<K>
where
    K: serde::de::DeserializeOwned + kube::Resource + Clone,
{
    let objects: Vec<Lenient<K>> = if list {
        serde_json::from_slice::<ObjectList<Lenient<K>>>(json)
            .map(|l| l.items)
            .unwrap_or_default()
    } else {
        match serde_json::from_slice::<WatchEvent<Lenient<K>>>(json) {
            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                vec![o]
            }
            _ => Vec::new(),
        }
    };
    objects
        .into_iter()
        .filter_map(|o| o.decoded().ok())
        .collect()
}

/// A manifest file (`--manifests`): YAML or JSON documents of every kind we read, then the
/// state built from them.
pub fn manifest(data: &[u8]) {
    let mut snap = Snapshot::default();
    let mut warnings = Vec::new();
    crate::source::manifest::parse_manifest_bytes(
        data,
        "fuzz.yaml",
        NODE,
        &mut snap,
        &mut warnings,
    );
    let _ = build_state(&snap, NODE, &Default::default());
}

/// The `--config` file: decoded alone, then merged with no flags, validated and resolved as
/// the daemon does at start.
pub fn config_file(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::config::file::decode::decode(text);
    }
    let _ = crate::config::Config::from_parsed_with(
        &crate::config::flags::Parsed::default(),
        Some(("fuzz.yaml".into(), data.to_vec())),
    );
}

/// The command line (pflag syntax), NUL-separated arguments: parsed, then merged, validated
/// and resolved without a config file (a `--config` given is ignored: no file is read).
pub fn flags(data: &[u8]) {
    let args: Vec<String> = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if let Ok(parsed) = crate::config::flags::parse(&args) {
        let _ = crate::config::Config::from_parsed_with(&parsed, None);
    }
}

/// Go's duration syntax (`time.ParseDuration`), as the config file and flags spell periods;
/// a parsed value is formatted back.
pub fn duration(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(ns) = crate::config::file::duration::parse(s) {
            let _ = crate::config::file::duration::format(ns);
        }
    }
}

/// `kube-nlproxy explain`'s packet description (`--from`, `--to`, …, NUL-separated) traced
/// through nftables mode's plan of one Service on a fake node, rendered as text and JSON.
pub fn explain(data: &[u8]) {
    use crate::tools::explain::{self, fake::FakeView};
    let args: Vec<String> = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let Ok(a) = crate::tools::args::parse("explain", explain::USAGE, explain::FLAGS, &args) else {
        return;
    };
    if let Ok(report) = explain::explain(&mut FakeView::default(), &a) {
        let _ = explain::render_text(&report);
        let _ = crate::tools::to_json("PacketExplanation", &report);
    }
}

/// The seed inputs of every target, made by the encoders and fixtures the unit tests use:
/// what the kernel and the API server really send, for libFuzzer to mutate. `cargo xtask
/// fuzz` writes them into each target's corpus before a run.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for family in [Family::Ip, Family::Ip6] {
        out.push(("nft_reply", nft_seed(family)));
    }
    out.extend(kernel_seeds());
    out.extend(api_seeds());
    out.extend(text_seeds());
    out
}

/// nftables mode's plan of `default/web` (ClusterIP, NodePort, a local and a remote
/// endpoint) as the batch a first full sync sends (`plan_full`): a dump reply carries the
/// same attributes.
fn nft_seed(family: Family) -> Vec<u8> {
    let st = crate::model::fixtures::web_state(Some(30080));
    let cfg = crate::proxy::ProxierConfig {
        local_detector: crate::proxy::LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        ..Default::default()
    };
    let rs = crate::modes::nftables::plan::build_ruleset(&st, &cfg, family);
    let plan = crate::proxy::ruleset::plan_full(&rs, None, &[]);
    crate::kernel::nft::encode::encode_transaction(&plan.tx, 1).bytes
}

/// Conntrack entries, IPVS servers, links, addresses and ipset names as our encoders write
/// them (the kernel's replies carry the same attributes).
fn kernel_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::kernel::conntrack::{codec as ct, Flow};
    use crate::kernel::ipvs::{codec as ipvs, Forward, RealServer, VirtualServer};
    use crate::kernel::netlink::msg::MsgWriter;
    use crate::kernel::rtnl::codec as rtnl;
    let flow = |src: &str, dst: &str, to: &str| Flow {
        proto: 17,
        orig_src: src.parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        orig_sport: 40000,
        orig_dport: 53,
        reply_src: to.parse().unwrap(),
        reply_dst: src.parse().unwrap(),
        reply_sport: 53,
        reply_dport: 40000,
        zone: 0,
        id: Some(7),
    };
    let mut w = MsgWriter::new();
    ct::encode_new(
        &mut w,
        &flow("10.244.1.3", "10.96.0.10", "10.244.2.5"),
        120,
        1,
    );
    ct::encode_new(
        &mut w,
        &flow("fd00::3", "fd00:96::a", "fd00:244::5"),
        120,
        2,
    );
    let vs = VirtualServer {
        addr: "10.96.0.10".parse().unwrap(),
        port: 80,
        protocol: 6,
        scheduler: "rr".into(),
        persistence: 10800,
        sched_flags: 0,
    };
    let rs = RealServer {
        addr: "10.244.2.5".parse().unwrap(),
        port: 8080,
        weight: 1,
        forward: Forward::Masquerade,
        active_conns: 3,
        inactive_conns: 1,
    };
    let af = libc::AF_INET as u16;
    let mut ipvs_msgs = ipvs::encode_service(af, 1, &vs, 1);
    ipvs_msgs.extend(ipvs::encode_dest(af, 4, &vs, &rs, 2));
    ipvs_msgs.extend(ipvs::encode_get_family("IPVS", 3));
    let addr = rtnl::IfAddr {
        index: 2,
        addr: "10.96.0.10".parse().unwrap(),
        prefix_len: 32,
    };
    let mut rtnl_msgs = rtnl::encode_new_dummy("kube-ipvs0", 1);
    rtnl_msgs.extend(rtnl::encode_addr(true, &addr, 2));
    rtnl_msgs.extend(rtnl::encode_get_route("10.244.2.5".parse().unwrap(), 3));
    let mut xt = Vec::new();
    for layout in [
        crate::kernel::xtables::uapi::IPV4,
        crate::kernel::xtables::uapi::IPV6,
    ] {
        let (t, _) = crate::kernel::xtables::blob::fixtures::sample(layout);
        let mut info = vec![0u8; crate::kernel::xtables::uapi::GETINFO_LEN];
        info[..t.name.len()].copy_from_slice(t.name.as_bytes());
        let mut put = |at: usize, v: u32| info[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        put(32, t.valid_hooks);
        for h in 0..t.hook_entry.len() {
            put(36 + 4 * h, t.hook_entry[h]);
            put(56 + 4 * h, t.underflow[h]);
        }
        put(76, t.num_entries);
        put(80, t.entries.len() as u32);
        info.extend_from_slice(&t.entries);
        xt.push(info);
    }
    let mut out = vec![
        ("ctnetlink_reply", w.into_bytes()),
        ("ipvs_reply", ipvs_msgs),
        ("rtnl_reply", rtnl_msgs),
        (
            "ipset_reply",
            crate::kernel::ipset::codec::encode_destroy("KUBE-CLUSTER-IP", 1),
        ),
    ];
    out.extend(xt.into_iter().map(|b| ("xtables_blob", b)));
    out
}

/// A Service, an EndpointSlice, a Node and a ServiceCIDR as watch events and lists, and as
/// a manifest file.
fn api_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use serde_json::json;
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "uid": "u1", "resourceVersion": "5",
            "annotations": {"service.kubernetes.io/topology-mode": "Auto"}},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00:96::a"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}],
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            "externalIPs": ["192.0.2.7"], "loadBalancerSourceRanges": ["203.0.113.0/24"]},
        "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}});
    let slice = crate::source::fixtures::endpoint_slice("default", "web", "web-1")
        .port("http", 8080)
        .endpoint(
            crate::source::fixtures::slice_endpoint("10.244.1.5")
                .node(NODE)
                .zone_hint("zone-a"),
        )
        .endpoint(crate::source::fixtures::slice_endpoint("10.244.2.5").terminating())
        .json();
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}});
    let cidr = json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/16", "fd00:96::/112"]}});
    let mut out = Vec::new();
    for (kind, object) in [(0u8, &service), (1, &slice), (2, &node), (3, &cidr)] {
        let event = json!({"type": "ADDED", "object": object});
        let list = json!({"apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": "9"}, "items": [object]});
        for (bit, doc) in [(0u8, event), (1, list)] {
            let mut b = vec![kind << 1 | bit];
            b.extend(serde_json::to_vec(&doc).unwrap());
            out.push(("watch_event", b));
        }
    }
    out.extend(protobuf_seeds());
    let docs = [&service, &slice, &node]
        .iter()
        .map(|o| serde_json::to_string(o).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n");
    out.push(("manifest", docs.into_bytes()));
    out.push(("manifest", MANIFEST_YAML.as_bytes().to_vec()));
    out
}

/// A manifest as an operator writes it: YAML, two documents.
const MANIFEST_YAML: &str = "apiVersion: v1
kind: Service
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: kube-system
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports:
- {name: dns, port: 53, protocol: UDP}
endpoints:
- addresses: [10.244.1.7]
  conditions: {ready: true}
";

/// kubeadm's configuration file for kube-proxy as its ConfigMap holds it.
const KUBEADM_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  acceptContentTypes: \"\"
  burst: 0
  contentType: \"\"
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
detectLocalMode: \"\"
enableProfiling: false
healthzBindAddress: \"\"
hostnameOverride: \"\"
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: \"\"
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
metricsBindAddress: \"\"
mode: \"nftables\"
nodePortAddresses: null
oomScoreAdj: null
portRange: \"\"
showHiddenMetricsForVersion: \"\"
winkernel:
  enableDSR: false
";

/// The config file, command lines as installers pass them, durations, `explain`'s flags.
fn text_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let args = |a: &[&str]| a.join("\0").into_bytes();
    let mut out = vec![
        ("config_file", KUBEADM_CONFIG.as_bytes().to_vec()),
        (
            "flags",
            args(&[
                "--config=/var/lib/kube-proxy/config.conf",
                "--hostname-override=node-1",
            ]),
        ),
        (
            "flags",
            args(&[
                "--proxy-mode=ipvs",
                "--cluster-cidr",
                "10.42.0.0/16",
                "--conntrack-max-per-core=0",
                "--healthz-bind-address=127.0.0.1",
                "--metrics-bind-address",
                "127.0.0.1:10249",
                "--nodeport-addresses=primary",
                "--v=2",
                "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
            ]),
        ),
        (
            "explain",
            args(&["--from", "external", "--to", "192.168.0.2:30080"]),
        ),
        (
            "explain",
            args(&[
                "--from",
                "default/client-0",
                "--to",
                "[fd00:96::a]:80/udp",
                "--json",
            ]),
        ),
    ];
    for d in ["1h2m3.5s", "-1.5h", "300ms", "0", "1us2ns", ".5m"] {
        out.push(("duration", d.as_bytes().to_vec()));
    }
    out
}

/// `protobuf_event`'s seeds: for each kind, a watch stream of one ADDED event and a list
/// of one object, as apimachinery writes them (`k8s\0` and the envelope).
/// One object of each kind `protobuf_event` picks, as protobuf messages.
fn protobuf_seed_objects() -> [(&'static str, Vec<u8>); 4] {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::discovery::v1 as discovery;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use prost::Message;
    let m = |name: &str| meta::ObjectMeta {
        name: Some(name.into()),
        namespace: Some("default".into()),
        resource_version: Some("9".into()),
        labels: [("kubernetes.io/service-name".to_string(), "web".to_string())].into(),
        ..Default::default()
    };
    let service = core::Service {
        metadata: Some(m("web")),
        spec: Some(core::ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            cluster_ips: vec!["10.96.0.10".into()],
            r#type: Some("NodePort".into()),
            ports: vec![core::ServicePort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(80),
                node_port: Some(30080),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let slice = discovery::EndpointSlice {
        metadata: Some(m("web-1")),
        address_type: Some("IPv4".into()),
        endpoints: vec![discovery::Endpoint {
            addresses: vec!["10.244.1.5".into()],
            node_name: Some(NODE.into()),
            conditions: Some(discovery::EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ports: vec![discovery::EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }],
    };
    let node = core::Node {
        metadata: Some(meta::ObjectMeta {
            name: Some(NODE.into()),
            ..Default::default()
        }),
        spec: Some(core::NodeSpec {
            pod_cid_rs: vec!["10.244.1.0/24".into()],
            ..Default::default()
        }),
        status: None,
    };
    let cidr = k8s_pb::api::networking::v1::ServiceCIDR {
        metadata: Some(m("kubernetes")),
        spec: Some(k8s_pb::api::networking::v1::ServiceCIDRSpec {
            cidrs: vec!["10.96.0.0/16".into()],
        }),
        status: None,
    };
    [
        ("Service", service.encode_to_vec()),
        ("EndpointSlice", slice.encode_to_vec()),
        ("Node", node.encode_to_vec()),
        ("ServiceCIDR", cidr.encode_to_vec()),
    ]
}

fn protobuf_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::source::kube::protobuf::wire::fixtures::{enveloped, event, framed, list};
    let mut out = Vec::new();
    for (pick, (kind, object)) in (0u8..).zip(protobuf_seed_objects()) {
        let mut watch = vec![pick << 1];
        watch.extend(framed(&[event("ADDED", kind, object.clone())]));
        out.push(("protobuf_event", watch));
        let mut body = vec![pick << 1 | 1];
        body.extend(enveloped(
            "v1",
            &format!("{kind}List"),
            list("9", &[object]),
        ));
        out.push(("protobuf_event", body));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Every seed through its target, so that a decoder change that panics on what the
    /// kernel or the API server really sends fails here, without libFuzzer; and every target
    /// has seeds.
    #[test]
    fn protobuf_seeds_decode_to_one_object_each() {
        let seeds = protobuf_seeds();
        assert_eq!(seeds.len(), 8);
        for (_, seed) in seeds {
            let (pick, body) = seed.split_first().unwrap();
            let list = pick & 1 == 1;
            let n = match pick >> 1 {
                0 => protobuf_decoded::<Service>(body, list).len(),
                1 => protobuf_decoded::<EndpointSlice>(body, list).len(),
                2 => protobuf_decoded::<Node>(body, list).len(),
                _ => protobuf_decoded::<ServiceCIDR>(body, list).len(),
            };
            assert_eq!(n, 1, "seed {pick}");
        }
    }

    #[test]
    fn every_target_survives_its_seeds() {
        let seeds = seeds();
        for (name, target) in TARGETS {
            let mine: Vec<&Vec<u8>> = seeds
                .iter()
                .filter(|s| s.0 == *name)
                .map(|s| &s.1)
                .collect();
            assert!(!mine.is_empty(), "target {name} has no seed");
            for s in mine {
                target(s);
            }
        }
        let unknown: Vec<&str> = seeds
            .iter()
            .map(|s| s.0)
            .filter(|n| !TARGETS.iter().any(|t| t.0 == *n))
            .collect();
        assert!(unknown.is_empty(), "seeds of no target: {unknown:?}");
    }

    /// Every input under `fuzz/regressions/TARGET` (one that once panicked, hung or ran away
    /// under libFuzzer) through its target.
    #[test]
    fn every_target_survives_its_regressions() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        for (name, target) in TARGETS {
            {
                let Ok(entries) = std::fs::read_dir(root.join(name)) else {
                    continue;
                };
                for e in entries.flatten() {
                    let data = std::fs::read(e.path()).unwrap();
                    target(&data);
                }
            }
        }
    }

    /// `fuzz/fuzz_targets/` has one libFuzzer binary per target and no other.
    #[test]
    fn every_target_has_its_libfuzzer_binary() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut want: Vec<String> = TARGETS.iter().map(|t| format!("{}.rs", t.0)).collect();
        want.sort();
        assert_eq!(files, want);
        for (name, _) in TARGETS {
            let text = std::fs::read_to_string(dir.join(format!("{name}.rs"))).unwrap();
            assert!(
                text.contains(&format!("kube_nlproxy::fuzz::{name}(data)")),
                "fuzz/fuzz_targets/{name}.rs does not call its target"
            );
        }
    }

    #[test]
    fn targets_have_distinct_names() {
        let mut names: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TARGETS.len());
    }
}
