//! One real node: its network namespace on the fabric, its holder, containerd with the CRI
//! settings this machine needs, the bridge CNI, and a kubelet registered under its name with
//! a zone label. The proxy is not started here: it comes as a DaemonSet pod, as in a cluster.
//!
//! I/O: namespaces, files, processes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::host::{self, Holder};
use super::images;
use super::IpFamily;
use crate::bounded::OutputWithin;
use crate::ns::NetNs;

/// Settings this machine needs, each from `../shared/reference/real-node.md`:
/// `restrict_oom_score_adj` (no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj), the
/// sandbox image named exactly as imported (or containerd pulls), cgroupfs (cgroup v1, no
/// systemd).
fn containerd_config(dir: &Path, extra_cni_bin: Option<&Path>) -> String {
    let d = dir.display();
    let bin_dirs = std::iter::once("/usr/lib/cni".to_string())
        .chain(extra_cni_bin.map(|p| p.display().to_string()))
        .map(|b| format!("{b:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"version = 3
root = "{d}/containerd/root"
state = "/run/containerd/state"
[grpc]
  address = "/run/containerd/containerd.sock"
[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{bin_dirs}]
    conf_dir = "{d}/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
"#,
        pause = images::PAUSE
    )
}

/// The kubelet's configuration: cgroup v1 allowed, its cgroups under the node's own root,
/// anonymous and always-allowed on its port (the apiserver's exec and logs reach it without
/// client certificates), eviction thresholds low enough that a busy CI disk never evicts.
fn kubelet_config(dir: &Path, cgroup: &str, dns: &str) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
resolvConf: {d}/resolv.conf
podLogsDir: /var/log/pods
staticPodPath: ""
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
clusterDNS: [{dns}]
clusterDomain: cluster.local
healthzBindAddress: 127.0.0.1
failSwapOn: false
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
"#,
    )
}

/// The CNI configuration of a node whose pod CIDRs are `pod_cidrs` (`spec.podCIDRs`, one per
/// family): a bridge with hairpin mode (the suite tests a pod reaching itself through its
/// Service), host-local addresses with a range set and a default route per family (a pod
/// then gets an address in each, primary first) kept in `ipam_dir`, portmap (hostPort
/// specs).
pub fn cni_conflist(pod_cidrs: &[String], ipam_dir: &Path) -> serde_json::Value {
    let ranges: Vec<serde_json::Value> = pod_cidrs
        .iter()
        .map(|c| serde_json::json!([{ "subnet": c }]))
        .collect();
    let routes: Vec<serde_json::Value> = pod_cidrs
        .iter()
        .map(|c| serde_json::json!({ "dst": IpFamily::of(c).default_dst() }))
        .collect();
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "nlp",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                    "dataDir": ipam_dir.display().to_string(),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// A running node.
pub struct Node {
    pub name: String,
    /// The node's primary address (its IPv4 one).
    pub ip: String,
    /// Every address of the node on the fabric, primary first: one per family.
    pub ips: Vec<String>,
    pub zone: String,
    pub ns: NetNs,
    pub dir: PathBuf,
    /// The node's cgroup root, in every hierarchy.
    pub cgroup: String,
    pub holder: Holder,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kubelet_args: Vec<String>,
    flanneld: Option<Child>,
    /// A second CNI bin dir for containerd (Flannel's plugin), if any.
    extra_cni_bin: Option<PathBuf>,
    /// `net:[…]` of the node's network namespace, for the sweep.
    net_ns: String,
}

impl Node {
    /// Creates the node's namespace (its `eth0` plugged into the fabric's bridge with `ips`,
    /// primary first), holder, cgroups and containerd (with `extra_cni_bin` as a second CNI
    /// bin dir when given). The kubelet starts with [`start_kubelet`](Self::start_kubelet).
    pub fn create(
        fabric: &NetNs,
        index: usize,
        ips: &[String],
        zone: &str,
        cluster_dir: &Path,
        tag: &str,
        extra_cni_bin: Option<&Path>,
    ) -> Node {
        let name = format!("node-{index}");
        let dir = cluster_dir.join(&name);
        std::fs::create_dir_all(dir.join("cni/net.d")).unwrap();
        let ns = NetNs::new(&format!("rn{index}"));
        super::plug(fabric, &ns, &format!("{tag}n{index}"), ips);
        if ips.iter().any(|ip| IpFamily::of(ip) == IpFamily::V6) {
            // The node routes its pods' IPv6 traffic as it routes their IPv4 traffic (the
            // bridge plugin turns both on as a gateway too, but only at the first pod).
            ns.write_sysctl("net/ipv6/conf/all/forwarding", "1");
        }
        let net_ns = ns.run(|| {
            std::fs::read_link("/proc/thread-self/ns/net")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        std::fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {}\n", IpFamily::of(&ips[0]).fabric_ip()),
        )
        .unwrap();
        let cgroup = format!("{tag}-{}-{name}", std::process::id());
        host::create_cgroups(&cgroup);
        let holder = Holder::start(&ns.name, &dir);
        let mut node = Node {
            name,
            ip: ips[0].clone(),
            ips: ips.to_vec(),
            zone: zone.into(),
            ns,
            dir,
            cgroup,
            holder,
            containerd: None,
            kubelet: None,
            kubelet_args: Vec::new(),
            flanneld: None,
            extra_cni_bin: extra_cni_bin.map(Path::to_path_buf),
            net_ns,
        };
        node.start_containerd();
        node
    }

    /// The node's address in `family`, if it has one.
    pub fn ip_of(&self, family: IpFamily) -> Option<&str> {
        self.ips
            .iter()
            .find(|ip| IpFamily::of(ip) == family)
            .map(String::as_str)
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))
            .unwrap()
    }

    fn start_containerd(&mut self) {
        let cfg = self.dir.join("containerd.toml");
        std::fs::write(
            &cfg,
            containerd_config(&self.dir, self.extra_cni_bin.as_deref()),
        )
        .unwrap();
        let bin = super::binaries().node.join("containerd");
        let mut cmd = self.holder.command(bin.to_str().unwrap());
        cmd.args(["--config", cfg.to_str().unwrap()])
            .env(
                "PATH",
                format!(
                    "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    super::binaries().node.display()
                ),
            )
            .stdin(Stdio::null())
            .stdout(self.log("containerd.log"))
            .stderr(self.log("containerd.log"));
        let child = crate::bounded::dies_with_parent(&mut cmd)
            .spawn()
            .expect("start containerd");
        self.containerd = Some(child);
        let t0 = Instant::now();
        while !self.ctr(&["version"]).status.success() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{}: containerd not answering within 30 s:\n{}",
                self.name,
                self.read_log("containerd.log")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn read_log(&self, name: &str) -> String {
        let t = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        let start = t.len().saturating_sub(20_000);
        let start = (start..t.len())
            .find(|&i| t.is_char_boundary(i))
            .unwrap_or(0);
        t[start..].to_string()
    }

    /// `ctr` against this node's containerd, in its `k8s.io` namespace (where CRI looks).
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        let bin = super::binaries().node.join("ctr");
        self.holder
            .command(bin.to_str().unwrap())
            .args([
                "--address",
                "/run/containerd/containerd.sock",
                "-n",
                "k8s.io",
            ])
            .args(args)
            .output_within(Duration::from_secs(180))
            .expect("run ctr")
    }

    /// Imports an OCI image-layout tarball into the node's runtime.
    pub fn import_image(&self, tarball: &Path) {
        let out = self.ctr(&[
            "images",
            "import",
            "--no-unpack=false",
            tarball.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}: ctr images import {}: {}{}",
            self.name,
            tarball.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the kubelet with a token for `system:node:NAME`.
    pub fn start_kubelet(&mut self, server: &str, ca: &Path, token: &str) {
        let kc = self.dir.join("kubelet.kubeconfig");
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: \"{token}\"}}\n",
                ca.display()
            ),
        )
        .unwrap();
        let cfg = self.dir.join("kubelet.yaml");
        // Pods resolve through kube-dns's ClusterIP in the node's primary family.
        let dns = IpFamily::of(&self.ip).dns_ip();
        std::fs::write(&cfg, kubelet_config(&self.dir, &self.cgroup, dns)).unwrap();
        self.kubelet_args = vec![
            format!("--config={}", cfg.display()),
            format!("--kubeconfig={}", kc.display()),
            format!("--hostname-override={}", self.name),
            // Both addresses in a dual-stack cluster: the Node then reports an InternalIP in
            // each family, primary first.
            format!("--node-ip={}", self.ips.join(",")),
            "--root-dir=/var/lib/kubelet".into(),
            format!("--cert-dir={}/kubelet-pki", self.dir.display()),
            format!("--node-labels=topology.kubernetes.io/zone={}", self.zone),
            "--v=2".into(),
        ];
        self.spawn_kubelet();
    }

    fn spawn_kubelet(&mut self) {
        let bin = super::binaries().node.join("kubelet");
        let mut cmd = self.holder.command(bin.to_str().unwrap());
        cmd.args(&self.kubelet_args);
        self.kubelet = Some(self.spawn_daemon(cmd, "kubelet"));
    }

    /// Starts `cmd` (a node daemon called `name`) in the node's namespaces with the system
    /// PATH, its output in `NAME.log`, killed if the test process dies.
    fn spawn_daemon(&self, mut cmd: Command, name: &str) -> Child {
        let log = format!("{name}.log");
        cmd.env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(self.log(&log))
        .stderr(self.log(&log));
        crate::bounded::dies_with_parent(&mut cmd)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: start {name}: {e}", self.name))
    }

    /// Stops the kubelet (SIGTERM, then SIGKILL after 10 s); its pods keep running, as when
    /// a kubelet restarts on a real node.
    pub fn stop_kubelet(&mut self) {
        if let Some(mut k) = self.kubelet.take() {
            #[allow(unsafe_code)]
            // SAFETY: kill(2) on our own child.
            unsafe {
                libc::kill(k.id() as i32, libc::SIGTERM);
            }
            let t0 = Instant::now();
            while k.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    let _ = k.kill();
                    let _ = k.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts the kubelet again with the same arguments.
    pub fn restart_kubelet(&mut self) {
        self.stop_kubelet();
        self.spawn_kubelet();
    }

    /// Writes the CNI configuration for the node's pod CIDRs ([`cni_conflist`]). containerd
    /// picks it up and the node becomes Ready.
    pub fn write_cni(&self, pod_cidrs: &[String]) {
        self.write_cni_conf(&cni_conflist(pod_cidrs, &self.dir.join("cni/ipam")));
    }

    /// Starts flanneld (`bin`) in the node's namespaces with `net_conf` as its
    /// net-conf.json: the Kubernetes subnet manager with the admin's `kubeconfig`, the
    /// node's `eth0`, masquerade on, its subnet file at the default `/run/flannel/subnet.env`
    /// (the node's own `/run`, [`Holder`]), where the flannel CNI plugin looks.
    pub fn start_flanneld(&mut self, bin: &Path, kubeconfig: &Path, net_conf: &serde_json::Value) {
        let conf = self.dir.join("net-conf.json");
        std::fs::write(&conf, serde_json::to_vec_pretty(net_conf).unwrap()).unwrap();
        let mut cmd = self.holder.command(bin.to_str().unwrap());
        cmd.args([
            "--kube-subnet-mgr",
            &format!("--kubeconfig-file={}", kubeconfig.display()),
            "--iface=eth0",
            "--ip-masq",
            &format!("--net-config-path={}", conf.display()),
        ])
        .env("NODE_NAME", &self.name);
        self.flanneld = Some(self.spawn_daemon(cmd, "flanneld"));
    }

    /// Whether flanneld has written the node's subnet file.
    pub fn flannel_subnet_written(&self) -> bool {
        self.dir.join("run/flannel/subnet.env").exists()
    }

    /// Writes `conf` as the node's one CNI configuration.
    pub fn write_cni_conf(&self, conf: &serde_json::Value) {
        // Written in place, not renamed in: containerd's watcher ignores a file's creation
        // and reloads on its write (internal/cri/server/cni_conf_syncer.go).
        std::fs::write(
            self.dir.join("cni/net.d/10-nlp.conflist"),
            serde_json::to_vec_pretty(conf).unwrap(),
        )
        .unwrap();
    }

    /// Kills every process of the node (pods first through their cgroups, then the daemons
    /// and the holder) and removes its cgroups. Returns what could not be removed.
    pub fn teardown(&mut self) -> Vec<String> {
        self.stop_kubelet();
        let mut left = Vec::new();
        let pids = host::kill_node(
            &self.cgroup,
            Some(&self.holder.mnt_ns),
            Some(&self.net_ns),
            Duration::from_secs(15),
        );
        if !pids.is_empty() {
            left.push(format!("{}: processes {pids:?} would not die", self.name));
        }
        for c in [&mut self.containerd, &mut self.kubelet, &mut self.flanneld]
            .into_iter()
            .flatten()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in host::remove_cgroups(&self.cgroup) {
            left.push(format!("{}: cgroup {} left", self.name, d.display()));
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_node_has_one_range_and_one_default_route() {
        let conf = cni_conflist(&["10.244.1.0/24".into()], Path::new("/x/ipam"));
        let ipam = &conf["plugins"][0]["ipam"];
        assert_eq!(
            ipam["ranges"],
            serde_json::json!([[{"subnet": "10.244.1.0/24"}]])
        );
        assert_eq!(ipam["routes"], serde_json::json!([{"dst": "0.0.0.0/0"}]));
        assert_eq!(ipam["dataDir"], "/x/ipam");
        assert_eq!(conf["plugins"][0]["hairpinMode"], true);
    }

    #[test]
    fn a_dual_stack_node_has_a_range_set_and_a_default_route_per_family() {
        let conf = cni_conflist(
            &["10.244.1.0/24".into(), "fd00:10:244:1::/64".into()],
            Path::new("/x/ipam"),
        );
        let ipam = &conf["plugins"][0]["ipam"];
        assert_eq!(
            ipam["ranges"],
            serde_json::json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]])
        );
        assert_eq!(
            ipam["routes"],
            serde_json::json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        );
    }
}
