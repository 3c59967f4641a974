//! A two-node test cluster in network namespaces:
//!
//! ```text
//!   ext (192.168.50.2, .3; fd00:50::2) ── eth-ext ── node (runs kube-nlproxy) ── node2 (192.168.60.2)
//!                                                    │  192.168.50.1 / 192.168.60.1      pods 10.244.2.x on lo
//!                                        pods 10.244.1.x (one namespace each, routed veths)
//! ```
//! Pod CIDR 10.244.0.0/16 (fd00:10:244::/48); this node's pods 10.244.1.0/24.
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use crate::bounded::{OutputWithin, TEST_LIMIT};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ns::NetNs;

pub const NODE_IP: &str = "192.168.50.1";
pub const NODE_IP6: &str = "fd00:50::1";
pub const NODE_TO_NODE2_IP: &str = "192.168.60.1";
pub const EXT_IP: &str = "192.168.50.2";
pub const EXT_IP_OTHER: &str = "192.168.50.3";
pub const EXT_IP6: &str = "fd00:50::2";
pub const POD_GW: &str = "10.244.1.1";
/// The daemon's log filter in tests: info, plus our per-sync summaries (V(2) upstream,
/// debug here) that the tests wait for, and the process set-up's V(2) lines (a failed
/// `oom_score_adj`, which upstream logs at V(2)).
pub const DAEMON_LOG: &str = "info,kube_nlproxy::app::hooks=debug,kube_nlproxy::app::process=debug";
pub const CLUSTER_CIDR: &str = "10.244.0.0/16,fd00:10:244::/48";

/// The namespaces of one test cluster.
pub struct Cluster {
    pub node: NetNs,
    pub ext: NetNs,
    pub node2: NetNs,
    pub pods: Vec<NetNs>,
    pub dir: PathBuf,
    veths: u32,
}

/// Whether the kernel has IPv6 (a guest booted with `ipv6.disable=1` has none): without it a
/// cluster is IPv4 only.
pub fn kernel_has_ipv6() -> bool {
    std::path::Path::new("/proc/net/if_inet6").exists()
}

/// `cmds` without their IPv6 lines (every one names an address with a colon) when the
/// kernel has no IPv6.
fn family_lines(cmds: Vec<String>) -> Vec<String> {
    if kernel_has_ipv6() {
        return cmds;
    }
    cmds.into_iter().filter(|l| !l.contains(':')).collect()
}

/// A pod on this node.
pub struct Pod<'a> {
    pub ns: &'a NetNs,
    pub ip: IpAddr,
    pub ip6: IpAddr,
}

impl Cluster {
    /// Builds node, node2 and ext. Pods are added with [`add_pod`](Self::add_pod).
    /// Each namespace is set up by one `ip -batch` (see [`NetNs::ip_batch`]); IPv6 lines
    /// name their family by their addresses (`::/0` for the default route), as a batch
    /// line takes no `-6`.
    pub fn new() -> Cluster {
        crate::ns::require_root();
        let node = NetNs::new("node");
        let ext = NetNs::new("ext");
        let node2 = NetNs::new("node2");
        let dir = std::env::temp_dir().join(format!("nlp-{}", node.name));
        std::fs::create_dir_all(&dir).unwrap();
        let ipv6 = kernel_has_ipv6();
        for ns in [&node, &node2] {
            ns.write_sysctl("net/ipv4/ip_forward", "1");
            if ipv6 {
                ns.write_sysctl("net/ipv6/conf/all/forwarding", "1");
            }
        }
        for ns in [&node, &ext, &node2].into_iter().filter(|_| ipv6) {
            ns.write_sysctl("net/ipv6/conf/default/accept_dad", "0");
        }
        // node <-> ext, node <-> node2
        crate::ns::ip_batch(
            &[],
            &[
                format!(
                    "link add eth-ext netns {} type veth peer name eth0 netns {}",
                    node.name, ext.name
                ),
                format!(
                    "link add eth-n2 netns {} type veth peer name eth0 netns {}",
                    node.name, node2.name
                ),
            ],
        );
        node.ip_batch(&family_lines(vec![
            "link set eth-ext up".into(),
            format!("addr add {NODE_IP}/24 dev eth-ext"),
            format!("addr add {NODE_IP6}/64 dev eth-ext nodad"),
            "link set eth-n2 up".into(),
            format!("addr add {NODE_TO_NODE2_IP}/24 dev eth-n2"),
            "addr add fd00:60::1/64 dev eth-n2 nodad".into(),
            "route add 10.244.2.0/24 via 192.168.60.2".into(),
            // Real nodes have a default route; without one, traffic to an unprogrammed
            // ClusterIP fails routing before the filter hooks see it.
            format!("route add default via {EXT_IP}"),
            format!("route add ::/0 via {EXT_IP6}"),
            "route add fd00:10:244:2::/64 via fd00:60::2".into(),
        ]));
        ext.ip_batch(&family_lines(vec![
            "link set eth0 up".into(),
            format!("addr add {EXT_IP}/24 dev eth0"),
            format!("addr add {EXT_IP_OTHER}/24 dev eth0"),
            format!("addr add {EXT_IP6}/64 dev eth0 nodad"),
            format!("route add default via {NODE_IP}"),
            format!("route add ::/0 via {NODE_IP6}"),
        ]));
        node2.ip_batch(&family_lines(vec![
            "link set eth0 up".into(),
            "addr add 192.168.60.2/24 dev eth0".into(),
            "addr add fd00:60::2/64 dev eth0 nodad".into(),
            "route add default via 192.168.60.1".into(),
            "route add ::/0 via fd00:60::1".into(),
        ]));
        Cluster {
            node,
            ext,
            node2,
            pods: Vec::new(),
            dir,
            veths: 0,
        }
    }

    /// Adds a pod on this node with addresses 10.244.1.N and fd00:10:244:1::N.
    pub fn add_pod(&mut self, n: u8) -> usize {
        let pod = NetNs::new("pod");
        self.veths += 1;
        let v = format!("vpod{}", self.veths);
        if kernel_has_ipv6() {
            pod.write_sysctl("net/ipv6/conf/default/accept_dad", "0");
        }
        crate::ns::ip_batch(
            &[],
            &[format!(
                "link add {v} netns {} type veth peer name eth0 netns {}",
                self.node.name, pod.name
            )],
        );
        let ip = format!("10.244.1.{n}");
        let ip6 = format!("fd00:10:244:1::{n}");
        self.node.ip_batch(&family_lines(vec![
            format!("link set {v} up"),
            format!("addr add {POD_GW}/32 dev {v}"),
            format!("addr add fd00:10:244:1::1/128 dev {v} nodad"),
            format!("route add {ip}/32 dev {v}"),
            format!("route add {ip6}/128 dev {v}"),
        ]));
        pod.ip_batch(&family_lines(vec![
            "link set eth0 up".into(),
            format!("addr add {ip}/32 dev eth0"),
            format!("addr add {ip6}/128 dev eth0 nodad"),
            format!("route add {POD_GW} dev eth0"),
            format!("route add default via {POD_GW}"),
            "route add fd00:10:244:1::1 dev eth0".into(),
            "route add ::/0 via fd00:10:244:1::1".into(),
        ]));
        self.pods.push(pod);
        self.pods.len() - 1
    }

    /// Adds an address on node2's loopback to stand for a pod there.
    pub fn add_remote_pod_ip(&self, ip: &str) {
        let plen = if ip.contains(':') { 128 } else { 32 };
        self.node2.ip(&format!("addr add {ip}/{plen} dev lo"));
    }

    /// Writes the manifests file and returns its path.
    pub fn write_manifests(&self, yaml: &str) -> PathBuf {
        let p = self.dir.join("cluster.yaml");
        let tmp = self.dir.join(".cluster.yaml.tmp");
        std::fs::write(&tmp, yaml).unwrap();
        // Replace by rename, as config management tools do.
        std::fs::rename(&tmp, &p).unwrap();
        p
    }

    /// Runs `kube-nlproxy ARGS` in the node namespace and returns (success, stderr).
    pub fn run_proxy(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.node.name,
                proxy_bin().to_str().unwrap(),
            ])
            .args(args)
            .env("RUST_LOG", DAEMON_LOG)
            .output_within(TEST_LIMIT)
            .expect("spawn kube-nlproxy");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs `kube-nlproxy ARGS` in the node namespace with this node's flags
    /// (`--hostname-override node1 --cluster-cidr …`) added, as the daemon gets them;
    /// panics with its stderr on failure, else returns its stdout.
    pub fn proxy_stdout(&self, args: &[&str]) -> String {
        self.proxy_report(args, 0)
    }

    /// As [`Cluster::proxy_stdout`], for an operator tool whose exit status says what it
    /// found (`diff(1)`'s: 0 nothing, 1 a finding, 2 trouble): panics unless it exits
    /// `want`, else returns its stdout.
    pub fn proxy_report(&self, args: &[&str], want: i32) -> String {
        let mut all = args.to_vec();
        all.extend([
            "--hostname-override",
            "node1",
            "--cluster-cidr",
            CLUSTER_CIDR,
        ]);
        let out = self.node.output(proxy_bin().to_str().unwrap(), &all);
        assert_eq!(
            out.status.code(),
            Some(want),
            "kube-nlproxy {all:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// One full sync of `yaml` (`--once`), panicking on failure.
    pub fn sync_once(&self, yaml: &str, extra: &[&str]) {
        let mut args = vec!["--cluster-cidr", CLUSTER_CIDR];
        args.extend_from_slice(extra);
        let (ok, err) = self.try_once(yaml, &args);
        assert!(ok, "kube-nlproxy --once failed:\n{err}");
    }

    /// `kube-nlproxy --manifests (yaml) --hostname-override node1 --once EXTRA` in the node
    /// namespace, which may fail: (success, stderr).
    pub fn try_once(&self, yaml: &str, extra: &[&str]) -> (bool, String) {
        let p = self.write_manifests(yaml);
        let mut args = vec![
            "--manifests",
            p.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--once",
        ];
        args.extend_from_slice(extra);
        self.run_proxy(&args)
    }

    /// Starts the daemon on `yaml`; it is stopped with SIGTERM when the guard drops.
    pub fn start_daemon(&self, yaml: &str, extra: &[&str]) -> Daemon {
        let p = self.write_manifests(yaml);
        let mut args = vec!["--manifests", p.to_str().unwrap()];
        args.extend_from_slice(extra);
        self.start_daemon_with(&args)
    }

    /// Starts the daemon with `args` (no manifests: e.g. `--master URL`) and waits for its
    /// first sync.
    pub fn start_daemon_with(&self, args: &[&str]) -> Daemon {
        let d = self.spawn_daemon_with(args);
        d.wait_for_log("synced", 1);
        d
    }

    /// [`Cluster::start_daemon_with`] without waiting for anything.
    pub fn spawn_daemon_with(&self, args: &[&str]) -> Daemon {
        let log = self.dir.join("daemon.log");
        let f = std::fs::File::create(&log).unwrap();
        let child = crate::bounded::dies_with_parent(&mut Command::new("ip"))
            .args([
                "netns",
                "exec",
                &self.node.name,
                proxy_bin().to_str().unwrap(),
            ])
            .args([
                "--hostname-override",
                "node1",
                "--cluster-cidr",
                CLUSTER_CIDR,
                "--min-sync-period",
                "100ms",
            ])
            .args(args)
            .env("RUST_LOG", DAEMON_LOG)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn daemon");
        Daemon { child, log }
    }

    /// `nft list table FAMILY kube-nlproxy` in the node namespace.
    pub fn ruleset(&self, family: &str) -> String {
        let out = self
            .node
            .output("nft", &["list", "table", family, "kube-nlproxy"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until `pred(ruleset)` holds for the ip table.
    pub fn wait_ruleset(&self, family: &str, what: &str, pred: impl Fn(&str) -> bool) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if pred(&self.ruleset(family)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("ruleset never showed {what}:\n{}", self.ruleset(family));
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster::new()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running daemon.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Waits until `needle` occurs at least `n` times in the log.
    pub fn wait_for_log(&self, needle: &str, n: usize) {
        let t0 = Instant::now();
        // 60 s: in the IPVS tests' emulated VM a first sync of a small cluster has taken
        // over 15 s (start 11:53:51, initial list 11:53:55, still syncing at 11:54:10) while
        // the same test passed in the run before. Only a failing wait lasts this long.
        while t0.elapsed() < Duration::from_secs(60) {
            if self.log_text().matches(needle).count() >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "daemon log never showed {n}x {needle:?}:\n{}",
            self.log_text()
        );
    }
    /// Sends SIGTERM and returns the exit status and how long the exit took.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, Duration) {
        // The child is `ip netns exec`, which execs the proxy in place: same pid.
        // SAFETY: signalling a child process we own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        let st = crate::bounded::wait_within(
            &mut self.child,
            Duration::from_secs(30),
            "the daemon after SIGTERM",
        );
        (st, t0.elapsed())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.terminate();
        }
    }
}

/// What tests start as the daemon: `seccomp-run`, which runs the kube-nlproxy built beside
/// it under deploy/'s seccomp profile (`crate::seccomp`; `KNP_SECCOMP=off` runs it bare).
/// `KUBE_NLPROXY_BIN` overrides both.
pub fn proxy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("KUBE_NLPROXY_BIN") {
        return PathBuf::from(p);
    }
    let bare = proxy_bin_bare();
    if crate::seccomp::Mismatch::from_env() == Ok(crate::seccomp::Mismatch::Off) {
        return bare;
    }
    let wrapper = bare.with_file_name("seccomp-run");
    assert!(
        wrapper.exists(),
        "{} not built: run the tests with `cargo test --workspace` (or KNP_SECCOMP=off)",
        wrapper.display()
    );
    wrapper
}

/// The file `/proc/PID/exe` names once [`proxy_bin`] has become the daemon: the bare binary
/// when `seccomp-run` execs it.
pub fn daemon_exe() -> PathBuf {
    let bin = proxy_bin();
    if bin.file_name() == Some(std::ffi::OsStr::new("seccomp-run")) {
        proxy_bin_bare()
    } else {
        bin
    }
}

/// The kube-nlproxy binary built alongside the tests, run as it is (what benchmarks measure
/// and what strace-based tests trace).
pub fn proxy_bin_bare() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // Test binaries live in target/<profile>/deps, harness binaries in target/<profile>.
    let dir = exe.parent().unwrap();
    let p = if dir.ends_with("deps") {
        dir.parent().unwrap().join("kube-nlproxy")
    } else {
        dir.join("kube-nlproxy")
    };
    assert!(
        p.exists(),
        "{} not built: run the tests with `cargo test --workspace` (or set KUBE_NLPROXY_BIN)",
        p.display()
    );
    p
}

/// Socket address helper.
pub fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// YAML builders for manifests.
pub mod yaml {
    use std::fmt::Write;

    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube_nlproxy::source::fixtures::{endpoint_slice, SERVICE_NAME_LABEL};
    pub use kube_nlproxy::source::fixtures::{slice_endpoint, SliceEndpoint};

    /// A Service. `ports` are (name, protocol, port, nodePort or 0); `extra` is YAML spliced
    /// into `spec` (indented two spaces).
    pub fn service(
        ns: &str,
        name: &str,
        cluster_ips: &[&str],
        ports: &[(&str, &str, u16, u16)],
        extra: &str,
    ) -> String {
        let mut s = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  clusterIPs: [{}]\n  ports:\n",
            cluster_ips.iter().map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(", ")
        );
        for (pn, proto, port, np) in ports {
            write!(s, "  - {{name: {pn}, protocol: {proto}, port: {port}").unwrap();
            if *np != 0 {
                write!(s, ", nodePort: {np}").unwrap();
            }
            s.push_str("}\n");
        }
        for line in extra.lines() {
            writeln!(s, "  {line}").unwrap();
        }
        s
    }

    /// A ready endpoint on `node`.
    pub fn ready(ip: &str, node: &str) -> SliceEndpoint {
        slice_endpoint(ip).node(node)
    }

    /// An EndpointSlice for `svc` with one port (name, protocol, port), its endpoints built
    /// by name ([`slice_endpoint`]).
    pub fn slice(
        ns: &str,
        svc: &str,
        slice: &str,
        family: &str,
        port: (&str, &str, u16),
        eps: &[SliceEndpoint],
    ) -> String {
        endpoint_slice_doc(
            &endpoint_slice(ns, svc, slice)
                .address_type(family)
                .port_with_protocol(port.0, port.1, port.2)
                .endpoints(eps.iter().cloned())
                .build(),
        )
    }

    /// One EndpointSlice as a manifest document, one line per endpoint (tests edit the text
    /// line by line). Writes what the shared builder sets: name, namespace, the Service
    /// label, addressType, ports, and per endpoint its address, node, conditions and zone
    /// hints.
    pub fn endpoint_slice_doc(o: &EndpointSlice) -> String {
        let m = &o.metadata;
        let svc = m
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .map_or("", String::as_str);
        let ports: Vec<String> = o
            .ports
            .iter()
            .flatten()
            .map(|p| {
                format!(
                    "{{name: {}, protocol: {}, port: {}}}",
                    p.name.as_deref().unwrap_or_default(),
                    p.protocol.as_deref().unwrap_or("TCP"),
                    p.port.unwrap_or_default()
                )
            })
            .collect();
        let mut s = format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {}\n  namespace: {}\n  labels: {{kubernetes.io/service-name: {svc}}}\naddressType: {}\nports: [{}]\nendpoints:\n",
            m.name.as_deref().unwrap_or_default(),
            m.namespace.as_deref().unwrap_or_default(),
            o.address_type,
            ports.join(", ")
        );
        let eps = o.endpoints.as_deref().unwrap_or_default();
        if eps.is_empty() {
            s.push_str("  []\n");
        }
        for e in eps {
            let c = e.conditions.clone().unwrap_or_default();
            write!(
                s,
                "- {{addresses: [\"{}\"], nodeName: {}, conditions: {{ready: {}, serving: {}, terminating: {}}}",
                e.addresses.join("\", \""),
                e.node_name.as_deref().unwrap_or_default(),
                c.ready.unwrap_or(true),
                c.serving.unwrap_or(true),
                c.terminating.unwrap_or(false)
            )
            .unwrap();
            let zones: Vec<String> = e
                .hints
                .iter()
                .flat_map(|h| h.for_zones.iter().flatten())
                .map(|z| format!("{{name: {}}}", z.name))
                .collect();
            if !zones.is_empty() {
                write!(s, ", hints: {{forZones: [{}]}}", zones.join(", ")).unwrap();
            }
            s.push_str("}\n");
        }
        s
    }
}

/// Appends to a log file (for debugging test failures).
pub fn note(path: &std::path::Path, msg: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = writeln!(f, "{msg}");
    }
}

#[cfg(test)]
mod tests {
    use super::yaml;

    /// Tests edit manifests line by line (`packets.rs` drops an endpoint's line): the text
    /// stays as it was written before the shared builder.
    #[test]
    fn a_slice_document_keeps_one_line_per_endpoint() {
        let doc = yaml::slice(
            "kube-system",
            "dns",
            "dns-1",
            "IPv4",
            ("dns", "UDP", 53),
            &[
                yaml::ready("10.244.1.2", "node1"),
                yaml::ready("10.244.1.4", "node1")
                    .not_ready()
                    .terminating()
                    .zone_hint("zone-b"),
            ],
        );
        assert_eq!(
            doc,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: dns-1\n  namespace: kube-system\n  labels: {kubernetes.io/service-name: dns}\naddressType: IPv4\nports: [{name: dns, protocol: UDP, port: 53}]\nendpoints:\n\
             - {addresses: [\"10.244.1.2\"], nodeName: node1, conditions: {ready: true, serving: true, terminating: false}}\n\
             - {addresses: [\"10.244.1.4\"], nodeName: node1, conditions: {ready: false, serving: true, terminating: true}, hints: {forZones: [{name: zone-b}]}}\n"
        );
        let empty = yaml::slice("ns", "s", "s-1", "IPv6", ("p", "TCP", 80), &[]);
        assert!(empty.ends_with("addressType: IPv6\nports: [{name: p, protocol: TCP, port: 80}]\nendpoints:\n  []\n"), "{empty}");
    }
}
