//! The binary started exactly as real installers start kube-proxy (kubeadm's ConfigMap and
//! command line, k3s's and kops's flag lines, kubespray's IPVS file;
//! ../shared/reference/installers.md), proven with real packets in the namespace cluster,
//! and `--write-config-to` showing upstream's defaults applied.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::io::{Read, Write};
use std::time::Duration;

use netlink_tests::backend::{tcp_probe, tcp_probes, Reply};
use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use netlink_tests::cluster::{proxy_bin, sa, Cluster, EXT_IP, NODE_IP};
use netlink_tests::scenario::{self, names, peer, Backends, LOCAL_EP, REMOTE_EP};

const KUBEADM_CONFIG: &str = include_str!("../../src/config/file/testdata/kubeadm_config.conf");

fn cluster() -> Cluster {
    scenario::web_cluster(Backends::default())
}

fn web_yaml() -> String {
    scenario::web_yaml_with("", &[LOCAL_EP, REMOTE_EP], false)
}

/// `GET path` on `addr` from inside the cluster's node namespace: (status line, body).
fn http_get(c: &Cluster, addr: &str, path: &str) -> Option<(String, String)> {
    let (addr, path) = (addr.to_string(), path.to_string());
    c.node.run(move || {
        let mut s =
            std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2))
                .ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        Some((head.lines().next()?.to_string(), body.to_string()))
    })
}

fn assert_serves_the_cluster(c: &Cluster) {
    let replies = tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 30);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "{replies:?}"
    );
    assert!(
        replies.iter().all(|r| peer(r) == "10.244.1.3"),
        "pod source kept"
    );
    let replies = tcp_probes(&c.ext, sa(NODE_IP, 30080), 30);
    assert_eq!(
        names(&replies),
        ["local", "remote"].map(String::from).into(),
        "{replies:?}"
    );
    assert!(
        replies.iter().all(|r| peer(r) != EXT_IP),
        "NodePort masqueraded"
    );
}

/// kubeadm: its undefaulted ConfigMap (`config.conf`), its command line
/// (`--config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)`), mode ""
/// served by the nftables engine with iptables mode's defaults: NodePorts on every address
/// and on 127.0.0.1, health on 0.0.0.0:10256, metrics on 127.0.0.1:10249.
#[test]
fn kubeadm_configmap_as_shipped() {
    let c = cluster();
    let cfg = c.dir.join("config.conf");
    std::fs::write(&cfg, KUBEADM_CONFIG).unwrap();
    let cfg_arg = format!("--config={}", cfg.display());
    let d = c.start_daemon(&web_yaml(), &[&cfg_arg, "--hostname-override=node1"]);
    let log = d.log_text();
    assert!(log.contains("no proxy mode specified"), "{log}");
    // Upstream logs one error on kubeadm's configuration as it ships (iptables mode, no
    // nodePortAddresses): checkBadConfig's; nothing else is an error.
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with('E') && l[1..].starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("nodePortAddresses is unset"), "{log}");
    assert_serves_the_cluster(&c);
    let t0 = std::time::Instant::now();
    let r = loop {
        let r = tcp_probe(&c.node, sa("127.0.0.1", 30080));
        if r.name().is_some() || t0.elapsed() > Duration::from_secs(5) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        matches!(r, Reply::Answered { .. }),
        "localhost NodePort (iptables mode's default): {r:?}"
    );
    let (status, body) = http_get(&c, "127.0.0.1:10256", "/healthz").expect("healthz on :10256");
    assert!(status.contains("200"), "{status} {body}");
    let (status, body) =
        http_get(&c, "127.0.0.1:10249", "/metrics").expect("metrics on 127.0.0.1:10249");
    assert!(
        status.contains("200") && body.contains("kubeproxy_sync_proxy_rules"),
        "{status}"
    );
    assert!(
        http_get(&c, &format!("{NODE_IP}:10249"), "/metrics").is_none(),
        "metrics only on loopback"
    );
    // --write-config-to shows upstream's defaults applied (no --config: upstream ignores the
    // deprecated ports then, and the file here).
    let out_path = c.dir.join("written.yaml");
    let out = std::process::Command::new(proxy_bin())
        .args([&cfg_arg, "--hostname-override=node1"])
        .arg(format!("--write-config-to={}", out_path.display()))
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(&out_path).unwrap();
    for line in [
        "oomScoreAdj: -999\n",
        "configSyncPeriod: 15m0s\n",
        "healthzBindAddress: 0.0.0.0:10256\n",
        "metricsBindAddress: 127.0.0.1:10249\n",
        "  maxPerCore: 32768\n",
        "  min: 131072\n",
        "  tcpEstablishedTimeout: 24h0m0s\n",
        "  tcpCloseWaitTimeout: 1h0m0s\n",
        "  localhostNodePorts: true\n",
        "  masqueradeBit: 14\n",
        "  syncPeriod: 30s\n",
        "  minSyncPeriod: 1s\n",
        "mode: iptables\n",
        "clusterCIDR: 10.244.0.0/16\n",
        "  contentType: application/vnd.kubernetes.protobuf\n",
        "  qps: 5\n",
        "  burst: 10\n",
        "hostnameOverride: node1\n",
    ] {
        assert!(written.contains(line), "{line:?} in\n{written}");
    }
}

/// k3s's kubeProxyArgs: a bare healthz address, conntrack zeros, klog flags.
#[test]
fn k3s_flag_line() {
    let c = cluster();
    let d = c.start_daemon(
        &web_yaml(),
        &[
            "--healthz-bind-address=127.0.0.1",
            "--kubeconfig=/var/lib/rancher/k3s/agent/kubeproxy.kubeconfig",
            "--cluster-cidr=10.244.0.0/16",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=0s",
            "--hostname-override=node1",
            "--v=2",
            "--vmodule=proxier=4",
            "--log_file=/var/log/kube-proxy.log",
            "--alsologtostderr",
        ],
    );
    assert_serves_the_cluster(&c);
    let (status, _) =
        http_get(&c, "127.0.0.1:10256", "/healthz").expect("healthz on 127.0.0.1:10256");
    assert!(status.contains("200"), "{status}");
    assert!(http_get(&c, &format!("{NODE_IP}:10256"), "/healthz").is_none());
    let log = d.log_text();
    assert!(log.contains("--log-file has no effect here"), "{log}");
}

/// kops: booleans written `--flag=true|false`, `--master`, `--proxy-mode=iptables`.
#[test]
fn kops_flag_line() {
    let c = cluster();
    let d = c.start_daemon(
        &web_yaml(),
        &[
            "--cluster-cidr=10.244.0.0/16",
            "--conntrack-max-per-core=131072",
            "--hostname-override=node1",
            "--kubeconfig=/var/lib/kube-proxy/kubeconfig",
            "--master=https://api.internal.example.k8s.local:443",
            "--oom-score-adj=-998",
            "--v=2",
            "--proxy-mode=iptables",
            "--masquerade-all=false",
        ],
    );
    assert!(
        d.log_text().contains("proxy mode iptables"),
        "{}",
        d.log_text()
    );
    assert_serves_the_cluster(&c);
    // Lowering oom_score_adj needs CAP_SYS_RESOURCE, which this sandbox may withhold: then
    // the daemon says so, naming the value.
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", d.child.id())).unwrap();
    assert!(
        adj.trim() == "-998"
            || d.log_text()
                .contains(r#""Failed to apply OOMScore" value=-998 "#),
        "{adj}: {}",
        d.log_text()
    );
}

/// kubespray's IPVS file, read and planned (the kernel here has no IPVS: `--dry-run`; the
/// VM tests run IPVS mode itself).
#[test]
fn kubespray_ipvs_file_plans_ipvs() {
    let dir = std::env::temp_dir().join(format!("nlp-kubespray-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("config.conf");
    std::fs::write(
        &cfg,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 0.0.0.0\nclientConnection:\n  acceptContentTypes: \"\"\n  burst: 10\n  contentType: application/vnd.kubernetes.protobuf\n  kubeconfig: /etc/kubernetes/kube-proxy-kubeconfig.yaml\n  qps: 5\nclusterCIDR: 10.233.64.0/18\nconfigSyncPeriod: 15m0s\nconntrack:\n  maxPerCore: 32768\n  min: 131072\n  tcpCloseWaitTimeout: 1h0m0s\n  tcpEstablishedTimeout: 24h0m0s\nenableProfiling: false\nhealthzBindAddress: 0.0.0.0:10256\nhostnameOverride: node1\niptables:\n  masqueradeAll: true\n  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 30s\nipvs:\n  excludeCIDRs: []\n  minSyncPeriod: 0s\n  scheduler: rr\n  strictARP: true\n  syncPeriod: 30s\nmetricsBindAddress: 127.0.0.1:10249\nmode: ipvs\nnodePortAddresses: []\noomScoreAdj: -999\nportRange: \"\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(proxy_bin())
        .arg(format!("--config={}", cfg.display()))
        .args([
            "--manifests",
            &format!("{}/../examples/cluster.yaml", env!("CARGO_MANIFEST_DIR")),
            "--dry-run",
        ])
        .output_within(TEST_LIMIT)
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("rr"), "scheduler rr:\n{text}");
    assert!(
        text.contains("masquerade"),
        "masqueradeAll from the iptables section:\n{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Probes must not kill a pod that waits for the API server: /healthz and /livez answer
/// from start-up (healthy while starting, as upstream), and /metrics too.
#[test]
fn health_and_metrics_answer_before_the_api_server_does() {
    let c = Cluster::new();
    let log = c.dir.join("daemon.log");
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &c.node.name])
        .arg(proxy_bin())
        .args(["--hostname-override=node1", "--master=http://127.0.0.1:9"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let healthz = loop {
        if let Some(r) = http_get(&c, "127.0.0.1:10256", "/healthz") {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(healthz.0.contains("200"), "{healthz:?}");
    let livez = http_get(&c, "127.0.0.1:10256", "/livez").expect("livez");
    assert!(livez.0.contains("200"), "{livez:?}");
    let metrics = http_get(&c, "127.0.0.1:10249", "/metrics").expect("metrics");
    assert!(metrics.0.contains("200"), "{metrics:?}");
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains("synced"),
        "no API server, no sync: {log_text}"
    );
    // SAFETY: signalling our own child.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM)
    };
    netlink_tests::bounded::wait_within(
        &mut child,
        Duration::from_secs(10),
        "the daemon after SIGTERM",
    );
}

/// `-v` means what it means upstream: per-sync summaries at V(2), none at V(0).
#[test]
fn verbosity_changes_what_is_logged() {
    let c = cluster();
    let manifests = c.write_manifests(&web_yaml());
    let run = |v: &str| {
        let log = c.dir.join(format!("v{v}.log"));
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &c.node.name])
            .arg(proxy_bin())
            .args(["--hostname-override=node1", "--proxy-mode=nftables"])
            .arg(format!("--manifests={}", manifests.display()))
            .arg(format!("-v={v}"))
            .env_remove("RUST_LOG")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let text = loop {
            let t = std::fs::read_to_string(&log).unwrap_or_default();
            if t.contains("initial sync done") {
                // the summary of the same sync follows at once when enabled
                std::thread::sleep(Duration::from_millis(200));
                break std::fs::read_to_string(&log).unwrap_or_default();
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{t}");
            std::thread::sleep(Duration::from_millis(50));
        };
        // SAFETY: signalling our own child.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM)
        };
        netlink_tests::bounded::wait_within(&mut child, Duration::from_secs(10), "the daemon");
        text
    };
    let quiet = run("0");
    let chatty = run("2");
    assert!(!quiet.contains("] \"synced\" full="), "{quiet}");
    assert!(chatty.contains("] \"synced\" full="), "{chatty}");
    assert!(
        quiet.lines().all(|l| l.starts_with(['I', 'W', 'E'])),
        "klog headers: {quiet}"
    );
}

/// The path of deploy/daemonset.yaml's readiness probe.
fn deploy_readiness_path() -> String {
    let text = std::fs::read_to_string(format!(
        "{}/../deploy/daemonset.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_saphyr::from_str(&text).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    let probe = pod.containers[0].readiness_probe.clone().unwrap();
    probe.http_get.unwrap().path.unwrap()
}

/// Issue #56.5: on a Node the cluster autoscaler is removing (tainted
/// `ToBeDeletedByClusterAutoscaler`), `/healthz` answers 503 so that load balancers drain
/// it, while the path deploy/'s readiness probe asks answers 200: the pod stays Ready and a
/// DaemonSet rollout does not stall during a scale-down (upstream's manifests have no
/// readiness probe at all).
#[test]
fn deploys_readiness_probe_stays_ready_on_a_node_being_deleted() {
    let c = cluster();
    let mut y = web_yaml();
    y += "---\napiVersion: v1\nkind: Node\nmetadata: {name: node1}\nspec:\n  taints: [{key: ToBeDeletedByClusterAutoscaler, value: \"1700000000\", effect: NoSchedule}]\n";
    let _d = c.start_daemon(&y, &["--healthz-bind-address", "127.0.0.1:10256"]);
    let (status, body) = http_get(&c, "127.0.0.1:10256", "/healthz").expect("healthz");
    assert!(
        status.contains("503"),
        "/healthz drains the node: {status} {body}"
    );
    let path = deploy_readiness_path();
    let (status, body) = http_get(&c, "127.0.0.1:10256", &path).expect("readiness path");
    assert!(
        status.contains("200"),
        "deploy/'s readiness probe ({path}) stays ready: {status} {body}"
    );
}
