//! A cluster of real Kubernetes nodes on one machine, for the tests that run kube-nlproxy the
//! way users run it: as the DaemonSet pod of `deploy/`, started by a kubelet from the image
//! `cargo xtask image` builds, beside pods a container runtime and a CNI created, and judged
//! by upstream's e2e suite.
//!
//! Layout: a fabric namespace holds a bridge (10.99.0.1/24); the control plane (etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler) lives in its own namespace at
//! 10.99.0.10, and each node in its own at 10.99.0.1N with a holder (`host.rs`), containerd,
//! the bridge CNI and a kubelet labelled with a zone. kube-controller-manager allocates each
//! node a /24 of 10.244.0.0/16; the harness writes the node's CNI configuration from it and
//! routes the pod CIDRs between namespaces, as a flannel-like CNI would. CoreDNS runs as
//! kubeadm's Deployment behind `kube-system/kube-dns` (10.96.0.10), so DNS goes through the
//! proxy under test. Nodes authenticate with static tokens for `system:node:NAME` under
//! `--authorization-mode=Node,RBAC`.
//!
//! That is the IPv4 plan, the default. [`Family::Dual`] (`ClusterConfig::family`) gives every
//! namespace, node, pod CIDR, Service range and kube-dns an IPv6 twin as well, with IPv4
//! primary; [`Family::Ipv6`] has the IPv6 twins alone (`family.rs` has the plan).
//!
//! Every wait is bounded; [`Cluster`]'s drop kills every process (pods through the nodes'
//! cgroups, daemons through the holders' mount namespaces), removes the cgroups, namespaces
//! and files; [`sweep`] does the same for a run that was killed before it could.
//!
//! I/O: processes, namespaces, files.

mod coredns;
pub mod e2e;
pub mod family;
pub mod flannel;
pub mod host;
pub mod images;
pub mod node;
pub mod proxies;
pub mod readme;
pub mod traffic;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::bounded::OutputWithin;
use crate::ns::NetNs;
pub use family::{Family, IpFamily};
pub use flannel::Cni;
use node::Node;

pub const K8S_VERSION: &str = "v1.37.2";
// The IPv4 (primary) plan; `family.rs` has it for every family.
pub const FABRIC_IP: &str = "10.99.0.1";
pub const CP_IP: &str = "10.99.0.10";
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub const DNS_IP: &str = "10.96.0.10";
const ADMIN_TOKEN: &str = "nlp-real-node-admin";
/// Names of the cgroups and the veth ends this harness makes start with it (the sweep's key).
pub const TAG: &str = "nlprn";

/// One cluster at a time: three nodes take most of the machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Where the binaries are.
pub struct Binaries {
    /// kubelet, containerd, e2e.test, …: `target/real-node/bin`, unpacked by
    /// `netlink-tests/upstream/build.sh --node`.
    pub node: PathBuf,
    /// kube-apiserver (and kube-proxy) as `build.sh` caches them.
    pub upstream: PathBuf,
    pub etcd: PathBuf,
    /// k8s.io/kubernetes in the Go module cache (agnhost's test certificates).
    pub k8s_module: PathBuf,
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn binaries() -> Binaries {
    let node = workspace_root().join("target/real-node/bin");
    let upstream = PathBuf::from(format!("/var/tmp/kube-nlproxy-upstream/{K8S_VERSION}"));
    let etcd = PathBuf::from("/var/tmp/kube-nlproxy-upstream/etcd-v3.6.14/etcd");
    for p in [
        node.join("kubelet"),
        node.join("e2e.test"),
        node.join("containerd"),
        upstream.join("kube-apiserver"),
        etcd.clone(),
    ] {
        assert!(
            p.exists(),
            "{} missing: run netlink-tests/upstream/build.sh --node (.ci/run does)",
            p.display()
        );
    }
    let gomodcache = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output_within(Duration::from_secs(30))
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "/root/go/pkg/mod".into());
    Binaries {
        node,
        upstream,
        etcd,
        k8s_module: PathBuf::from(format!("{gomodcache}/k8s.io/kubernetes@{K8S_VERSION}")),
    }
}

/// Plugs `ns` into the fabric's bridge with a veth pair (`name` on the fabric side, `eth0`
/// inside) and gives it `ips` (one per family, on the fabric's prefix) with a default route
/// through the fabric in each family.
pub fn plug(fabric: &NetNs, ns: &NetNs, name: &str, ips: &[String]) {
    fabric.ip(&format!(
        "link add {name} type veth peer name eth0 netns {}",
        ns.name
    ));
    fabric.ip(&format!("link set {name} master br0 up"));
    for ip in ips {
        ns.ip(&format!("addr add {} dev eth0", fabric_addr(ip)));
    }
    ns.ip("link set eth0 up");
    for ip in ips {
        let family = IpFamily::of(ip);
        let flag = if family == IpFamily::V6 { "-6 " } else { "" };
        ns.ip(&format!(
            "{flag}route add default via {}",
            family.fabric_ip()
        ));
    }
}

/// `ip addr add`'s argument for `ip` on the fabric: its prefix, and for IPv6 `nodad`, so the
/// address is usable at once (a tentative address cannot be bound to, and the kubelet and
/// the API server start within the second duplicate address detection takes).
fn fabric_addr(ip: &str) -> String {
    let family = IpFamily::of(ip);
    match family {
        IpFamily::V4 => format!("{ip}/{}", family.fabric_prefix_len()),
        IpFamily::V6 => format!("{ip}/{} nodad", family.fabric_prefix_len()),
    }
}

/// etcd, kube-apiserver, kube-controller-manager and kube-scheduler in their namespace.
pub struct ControlPlane {
    pub ns: NetNs,
    pub dir: PathBuf,
    pub family: Family,
    procs: Vec<(String, Child)>,
}

impl ControlPlane {
    fn spawn(&mut self, name: &str, program: &Path, args: &[String]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .unwrap();
        let child = crate::bounded::dies_with_parent(&mut Command::new("nsenter"))
            .arg(format!("--net=/run/netns/{}", self.ns.name))
            .arg("--")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.procs.push((name.into(), child));
    }

    fn apiserver_args(&self, node_tokens: &[(String, String)]) -> Vec<String> {
        let d = |f: &str| self.dir.join(f).display().to_string();
        let mut tokens = format!("{ADMIN_TOKEN},nlp-admin,nlp-admin,\"system:masters\"\n");
        for (node, token) in node_tokens {
            tokens.push_str(&format!(
                "{token},system:node:{node},system:node:{node},\"system:nodes\"\n"
            ));
        }
        std::fs::write(self.dir.join("tokens.csv"), tokens).unwrap();
        vec![
            "--etcd-servers=http://127.0.0.1:2379".into(),
            format!("--bind-address={}", self.family.primary().any()),
            format!("--advertise-address={}", self.family.primary().cp_ip()),
            "--secure-port=6443".into(),
            format!("--cert-dir={}", d("certs")),
            format!("--service-cluster-ip-range={}", self.family.service_cidrs()),
            "--authorization-mode=Node,RBAC".into(),
            format!("--token-auth-file={}", d("tokens.csv")),
            format!("--service-account-key-file={}", d("sa.pub")),
            format!("--service-account-signing-key-file={}", d("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--allow-privileged=true".into(),
            // `kubectl exec` (used by every spec) reaches the kubelet by the node's address.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            "--service-node-port-range=30000-32767".into(),
        ]
    }

    fn start(
        fabric: &NetNs,
        dir: &Path,
        node_tokens: &[(String, String)],
        family: Family,
    ) -> ControlPlane {
        let ns = NetNs::new("rncp");
        plug(fabric, &ns, &format!("{TAG}cp"), &family.cp_ips());
        let dir = dir.join("control-plane");
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl genrsa -out {d}/sa.key 2048 2>/dev/null && openssl rsa -in {d}/sa.key -pubout -out {d}/sa.pub 2>/dev/null",
                d = dir.display()
            ))
            .output_within(Duration::from_secs(60))
            .unwrap();
        assert!(out.status.success(), "openssl: {out:?}");
        let mut cp = ControlPlane {
            ns,
            dir,
            family,
            procs: Vec::new(),
        };
        let bins = binaries();
        let etcd_dir = cp.dir.join("etcd").display().to_string();
        cp.spawn(
            "etcd",
            &bins.etcd,
            &[
                format!("--data-dir={etcd_dir}"),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        let args = cp.apiserver_args(node_tokens);
        cp.spawn(
            "kube-apiserver",
            &bins.upstream.join("kube-apiserver"),
            &args,
        );
        cp.wait_ready(Duration::from_secs(120));
        let admin = cp.admin_kubeconfig();
        let d = |f: &str| cp.dir.join(f).display().to_string();
        let mut kcm_args = vec![
            format!("--kubeconfig={}", admin.display()),
            "--controllers=*".into(),
            "--allocate-node-cidrs=true".into(),
            format!("--cluster-cidr={}", family.cluster_cidrs()),
        ];
        kcm_args.extend(family.node_cidr_mask_flags());
        kcm_args.extend([
            format!("--service-cluster-ip-range={}", family.service_cidrs()),
            format!("--root-ca-file={}", d("certs/apiserver.crt")),
            format!("--service-account-private-key-file={}", d("sa.key")),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            // Pods of a dead node go after 30 s, not 5 min (node-life tests).
            "--node-monitor-grace-period=20s".into(),
        ]);
        cp.spawn(
            "kube-controller-manager",
            &bins.node.join("kube-controller-manager"),
            &kcm_args,
        );
        cp.spawn(
            "kube-scheduler",
            &bins.node.join("kube-scheduler"),
            &[
                format!("--kubeconfig={}", admin.display()),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
            ],
        );
        cp
    }

    fn wait_ready(&mut self, limit: Duration) {
        let t0 = Instant::now();
        loop {
            if self.dir.join("certs/apiserver.crt").exists() {
                let out = self.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok" {
                    return;
                }
            }
            let exited = self
                .procs
                .iter_mut()
                .find_map(|(name, c)| c.try_wait().ok().flatten().map(|st| (name.clone(), st)));
            if let Some((name, st)) = exited {
                panic!("{name} exited ({st}):\n{}", self.log(&name));
            }
            assert!(
                t0.elapsed() < limit,
                "kube-apiserver not ready within {limit:?}:\n{}",
                self.log("kube-apiserver")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn log(&self, name: &str) -> String {
        let t = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let start = t.len().saturating_sub(20_000);
        let start = (start..t.len())
            .find(|&i| t.is_char_boundary(i))
            .unwrap_or(0);
        t[start..].to_string()
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("certs/apiserver.crt")
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        let p = self.dir.join("admin.kubeconfig");
        if !p.exists() {
            std::fs::write(
                &p,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: nlp\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: nlp\n  context: {{cluster: nlp, user: admin}}\ncurrent-context: nlp\nusers:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\n",
                    self.family.apiserver_url(),
                    self.ca().display()
                ),
            )
            .unwrap();
        }
        p
    }

    /// kubectl with the admin's credentials, run in the control plane's namespace, bounded
    /// to 120 s.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        let kc = self.admin_kubeconfig();
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns.name))
            .arg("--")
            .arg(binaries().node.join("kubectl"))
            .arg(format!("--kubeconfig={}", kc.display()))
            .args(args)
            .output_within(Duration::from_secs(120))
            .expect("run kubectl")
    }

    /// Stops kube-apiserver (SIGKILL); [`start_apiserver`](Self::start_apiserver) brings it
    /// back over the same etcd, keys and tokens.
    pub fn stop_apiserver(&mut self) {
        if let Some(i) = self.procs.iter().position(|(n, _)| n == "kube-apiserver") {
            let (_, mut c) = self.procs.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn start_apiserver(&mut self, node_tokens: &[(String, String)]) {
        let args = self.apiserver_args(node_tokens);
        let bin = binaries().upstream.join("kube-apiserver");
        self.spawn("kube-apiserver", &bin, &args);
        self.wait_ready(Duration::from_secs(120));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, c) in self.procs.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running cluster. Dropping it tears everything down.
pub struct Cluster {
    pub nodes: Vec<Node>,
    pub cp: ControlPlane,
    pub fabric: NetNs,
    pub dir: PathBuf,
    pub images: Vec<PathBuf>,
    /// The IP families of nodes, pods and Services.
    pub family: Family,
    /// The pod network.
    pub cni: Cni,
    node_tokens: Vec<(String, String)>,
    /// Whether this run made /lib/modules (kubeadm's DaemonSet mounts it; this machine has
    /// none), so that teardown removes it again.
    made_lib_modules: bool,
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// The zones the nodes are labelled with, in order.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// What [`Cluster::start_with`] brings up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How many nodes (1 to 9), zones assigned in turn.
    pub nodes: usize,
    /// The IP families of nodes, pods and Services; IPv4 only by default.
    pub family: Family,
    /// The pod network: the bridge plugin by default, or Flannel.
    pub cni: Cni,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 3,
            family: Family::Ipv4,
            cni: Cni::Bridge,
        }
    }
}

impl Cluster {
    /// Brings up the control plane and `n` IPv4-only nodes: [`start_with`](Self::start_with)
    /// with the default family.
    pub fn start(n: usize, extra_images: &[PathBuf]) -> Cluster {
        Cluster::start_with(
            ClusterConfig {
                nodes: n,
                ..ClusterConfig::default()
            },
            extra_images,
        )
    }

    /// Brings up the control plane and `config.nodes` nodes in `config.family`, imports the
    /// test images (and `extra` tarballs) into every node's runtime, and waits until every
    /// node is registered with its pod CIDRs and its CNI configured. Nodes are not Ready for
    /// pods that need Services until a proxy runs on them: that is the test's to deploy,
    /// then [`install_coredns`].
    pub fn start_with(config: ClusterConfig, extra_images: &[PathBuf]) -> Cluster {
        let ClusterConfig {
            nodes: n,
            family,
            cni,
        } = config;
        let flannel_bins = matches!(cni, Cni::Flannel(_)).then(flannel::binaries);
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        sweep();
        let dir = std::env::temp_dir().join(format!("{TAG}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bins = binaries();
        let images = images::build_all(&bins, &workspace_root().join("target/real-node/images"));
        let fabric = NetNs::new("rnfab");
        fabric.ip("link add br0 type bridge");
        for s in family.stacks() {
            fabric.ip(&format!("addr add {} dev br0", fabric_addr(s.fabric_ip())));
        }
        fabric.ip("link set br0 up");
        let made_lib_modules = !Path::new("/lib/modules").exists();
        if made_lib_modules {
            std::fs::create_dir_all("/lib/modules").unwrap();
        }
        let node_tokens: Vec<(String, String)> = (1..=n)
            .map(|i| (format!("node-{i}"), format!("nlp-real-node-{i}-token")))
            .collect();
        let cp = ControlPlane::start(&fabric, &dir, &node_tokens, family);
        let mut cluster = Cluster {
            nodes: Vec::new(),
            cp,
            fabric,
            dir: dir.clone(),
            images,
            family,
            cni,
            node_tokens,
            made_lib_modules,
            _one_at_a_time: guard,
        };
        let all_images: Vec<PathBuf> = cluster
            .images
            .iter()
            .chain(extra_images.iter())
            .cloned()
            .collect();
        for i in 1..=n {
            let ips = family.node_ips(i);
            let cni_bin = flannel_bins.as_ref().map(|b| b.cni_dir.as_path());
            let node = Node::create(
                &cluster.fabric,
                i,
                &ips,
                ZONES[(i - 1) % 3],
                &dir,
                TAG,
                cni_bin,
            );
            for img in &all_images {
                node.import_image(img);
            }
            cluster.nodes.push(node);
        }
        let server = family.apiserver_url();
        let ca = cluster.cp.ca();
        for (node, (_, token)) in cluster.nodes.iter_mut().zip(cluster.node_tokens.clone()) {
            node.start_kubelet(&server, &ca, &token);
        }
        cluster.configure_pod_network(flannel_bins.as_ref(), Duration::from_secs(120));
        cluster
    }

    /// Waits for each node's pod CIDRs (one per family), writes its CNI configuration and
    /// routes every pod CIDR to its node (by the node's address in the CIDR's family) from
    /// the other nodes and the control plane.
    ///
    /// With Flannel, a node's flanneld starts once the node has its pod CIDRs, as
    /// kube-flannel's DaemonSet pod is only scheduled to a registered node: flanneld exits
    /// when its node has no `podCIDR` at its first lease (`AcquireLease`, "pod cidr not
    /// assigned"), and a DaemonSet would restart it where this harness does not. Started
    /// beside the kubelet, it lost that race once in CI, when the node range allocator's
    /// first patch failed (`CIDRAssignmentFailed`).
    fn configure_pod_network(&mut self, flannel_bins: Option<&flannel::Binaries>, limit: Duration) {
        let t0 = Instant::now();
        let flannel = match (flannel_bins, self.cni) {
            (Some(bins), Cni::Flannel(masquerade)) => Some((
                bins,
                self.cp.admin_kubeconfig(),
                flannel::net_conf(self.family, masquerade),
            )),
            _ => None,
        };
        let mut cidrs: Vec<Option<Vec<String>>> = vec![None; self.nodes.len()];
        while cidrs.iter().any(Option::is_none) {
            for (i, node) in self.nodes.iter_mut().enumerate() {
                if cidrs[i].is_none() {
                    let out = self.cp.kubectl(&[
                        "get",
                        "node",
                        &node.name,
                        "-o",
                        "jsonpath={.spec.podCIDRs[*]}",
                    ]);
                    let c: Vec<String> = String::from_utf8_lossy(&out.stdout)
                        .split_whitespace()
                        .map(str::to_string)
                        .collect();
                    if out.status.success() && self.family.pod_cidrs_complete(&c) {
                        match self.cni {
                            Cni::Bridge => node.write_cni(&c),
                            // flanneld reads the node's podCIDRs itself and writes its
                            // subnet file; the plugin reads that file at each pod's ADD.
                            Cni::Flannel(_) => node.write_cni_conf(&flannel::cni_conflist()),
                        }
                        if let Some((bins, admin, conf)) = &flannel {
                            node.start_flanneld(&bins.flanneld, admin, conf);
                        }
                        cidrs[i] = Some(c);
                    }
                }
            }
            if t0.elapsed() > limit {
                let which: Vec<&str> = self
                    .nodes
                    .iter()
                    .zip(&cidrs)
                    .filter(|(_, c)| c.is_none())
                    .map(|(n, _)| n.name.as_str())
                    .collect();
                panic!(
                    "nodes {which:?} not registered with a pod CIDR within {limit:?}\n{}\n--- kube-controller-manager\n{}",
                    self.nodes
                        .iter()
                        .map(|n| format!("--- {} kubelet\n{}", n.name, n.read_log("kubelet.log")))
                        .collect::<String>(),
                    self.cp.log("kube-controller-manager")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        if matches!(self.cni, Cni::Flannel(_)) {
            self.wait_for(limit, "flanneld's subnet file on every node", |c| {
                c.nodes.iter().all(Node::flannel_subnet_written)
            });
        }
        // The control plane is no Flannel node: it is routed to the pods as with the bridge
        // plugin. Between nodes, Flannel's host-gw backend adds the routes itself.
        let harness_routes_nodes = self.cni == Cni::Bridge;
        for (i, node) in self.nodes.iter().enumerate() {
            for cidr in cidrs[i].iter().flatten() {
                let via = node.ip_of(IpFamily::of(cidr)).unwrap_or(&node.ip);
                self.cp.ns.ip(&format!("route add {cidr} via {via}"));
                for (j, other) in self.nodes.iter().enumerate() {
                    if i != j && harness_routes_nodes {
                        other.ns.ip(&format!("route add {cidr} via {via}"));
                    }
                }
            }
        }
        self.wait_for(limit, "every node Ready", |c| {
            let out = c.cp.kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]);
            let t = String::from_utf8_lossy(&out.stdout);
            out.status.success()
                && t.lines().filter(|l| l.trim() == "True").count() == c.nodes.len()
        });
    }

    /// Flannel's rules on each node ([`flannel::flannel_rules`] of `nft -a list ruleset`);
    /// empty lists with the bridge plugin.
    pub fn flannel_rules(&self) -> Vec<Vec<String>> {
        self.nodes
            .iter()
            .map(|n| {
                let out = n.ns.output("nft", &["-a", "list", "ruleset"]);
                flannel::flannel_rules(&String::from_utf8_lossy(&out.stdout))
            })
            .collect()
    }

    /// kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.cp.kubectl(args)
    }

    /// kubectl that must succeed; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) {
        self.kubectl_file("apply", yaml);
    }

    /// `kubectl create -f -` of `yaml`: as a client such as kubeadm creates an object,
    /// without the `last-applied-configuration` annotation `apply` adds.
    pub fn create(&self, yaml: &str) {
        self.kubectl_file("create", yaml);
    }

    fn kubectl_file(&self, verb: &str, yaml: &str) {
        let f = self.dir.join(format!(
            "{verb}-{}.yaml",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&f, yaml).unwrap();
        self.kubectl_ok(&[verb, "-f", f.to_str().unwrap()]);
    }

    /// Polls `cond` every 500 ms until it holds, failing after `limit` with `what` and the
    /// cluster's state.
    pub fn wait_for(&self, limit: Duration, what: &str, cond: impl Fn(&Cluster) -> bool) {
        let t0 = Instant::now();
        while !cond(self) {
            if t0.elapsed() > limit {
                panic!("{what}: not within {limit:?}\n{}", self.describe());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Nodes, pods and recent events, and the tail of each kubelet's log: what a failed wait
    /// prints.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["get", "pods", "-A", "-o", "wide"],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"],
        ] {
            let out = self.kubectl(args);
            s.push_str(&format!(
                "$ kubectl {}\n{}{}\n",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // The proxies' own lines: what a wait on the rules needs to be understood (the API
        // server may be the thing that is down, so this is best effort).
        let out = self.our_pod_logs(40);
        s.push_str(&format!(
            "$ kubectl -n kube-system logs -l app.kubernetes.io/name=kube-nlproxy --prefix --tail=40\n{}{}\n",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
        let daemons: &[&str] = match self.cni {
            Cni::Bridge => &["kubelet"],
            Cni::Flannel(_) => &["kubelet", "flanneld"],
        };
        for n in &self.nodes {
            for daemon in daemons {
                let log = n.read_log(&format!("{daemon}.log"));
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                s.push_str(&format!("--- {} {daemon} (last lines)\n", n.name));
                for l in tail.into_iter().rev() {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        s
    }

    /// `kubectl logs --prefix` of deploy/'s pods, their last `tail` lines each (-1: all).
    pub fn our_pod_logs(&self, tail: i64) -> Output {
        self.kubectl(&[
            "-n",
            "kube-system",
            "logs",
            "-l",
            "app.kubernetes.io/name=kube-nlproxy",
            "--prefix",
            &format!("--tail={tail}"),
        ])
    }

    /// Whether every pod matching `selector` in `namespace` is Running and Ready, and there
    /// are `count` of them.
    pub fn pods_ready(&self, namespace: &str, selector: &str, count: usize) -> bool {
        let out = self.kubectl(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.status.phase} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
        ]);
        let t = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
        out.status.success()
            && lines.len() == count
            && lines.iter().all(|l| l.trim() == "Running True")
    }

    /// CoreDNS as kubeadm installs it, behind `kube-system/kube-dns` (10.96.0.10, and
    /// fd00:96::a in a dual-stack cluster), and waits until it is Ready (which needs a
    /// proxy: it reaches the API server through the `kubernetes` Service).
    pub fn install_coredns(&self, limit: Duration) {
        self.apply(&coredns::manifest(self.family));
        self.wait_for(limit, "CoreDNS Ready", |c| {
            c.pods_ready("kube-system", "k8s-app=kube-dns", 1)
        });
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn node_tokens(&self) -> &[(String, String)] {
        &self.node_tokens
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("real-node cluster at failure:\n{}", self.describe());
        }
        let mut left = Vec::new();
        for n in &mut self.nodes {
            left.extend(n.teardown());
        }
        self.nodes.clear();
        if self.made_lib_modules {
            let _ = std::fs::remove_dir("/lib/modules");
        }
        if std::env::var_os("NLP_KEEP_REAL_NODE_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if !left.is_empty() && !std::thread::panicking() {
            panic!("teardown left: {left:?}");
        }
    }
}

/// Removes what an earlier run of this harness left (a run ended by its deadline skips its
/// destructors): processes in cgroups named after [`TAG`], those cgroups, and namespaces of
/// the harness (`nlp-rn*`) that no live test process owns.
pub fn sweep() {
    for h in host::cgroup_hierarchies() {
        let Ok(rd) = std::fs::read_dir(&h) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // TAG-PID-node-N of a process that is gone.
            let owner_gone = name
                .strip_prefix(&format!("{TAG}-"))
                .and_then(|rest| rest.split('-').next())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists());
            if owner_gone {
                host::kill_node(&name, None, None, Duration::from_secs(10));
                host::remove_cgroups(&name);
            }
        }
    }
    let me = std::process::id().to_string();
    if let Ok(rd) = std::fs::read_dir("/run/netns") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // nlp-rn<kind>-<pid>-<n>: another process's (ended) run.
            let mut parts = name.split('-');
            if parts.next() == Some("nlp")
                && parts.next().is_some_and(|k| k.starts_with("rn"))
                && parts
                    .next()
                    .is_some_and(|pid| pid != me && !Path::new(&format!("/proc/{pid}")).exists())
            {
                let netns = e.path();
                let inode = std::thread::spawn(move || {
                    crate::ns::enter(netns.to_str().unwrap());
                    std::fs::read_link("/proc/thread-self/ns/net")
                        .map(|p| p.to_string_lossy().into_owned())
                        .ok()
                })
                .join()
                .ok()
                .flatten();
                if let Some(inode) = inode {
                    host::kill_node(
                        "nonexistent-cgroup",
                        None,
                        Some(&inode),
                        Duration::from_secs(10),
                    );
                }
                let _ = Command::new("ip").args(["netns", "del", &name]).status();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_addresses_carry_their_prefix_and_ipv6_skips_dad() {
        assert_eq!(fabric_addr("10.99.0.11"), "10.99.0.11/24");
        assert_eq!(fabric_addr("fd00:99::11"), "fd00:99::11/64 nodad");
    }
}
