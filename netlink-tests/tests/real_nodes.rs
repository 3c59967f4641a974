//! kube-nlproxy run the way users run it: three real nodes (kubelet, containerd, bridge CNI,
//! each in its own namespaces, `netlink-tests/src/realnode`), `deploy/` applied through the
//! real API server as README says, the image `cargo xtask image` built imported into each
//! node's runtime, and upstream's e2e suite judging the result.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::path::PathBuf;
use std::time::{Duration, Instant};

use netlink_tests::realnode::{self, e2e, proxies, Cluster, ClusterConfig};
use netlink_tests::seccomp::SeccompState;

fn require_root() {
    assert!(
        netlink_tests::ns::is_root(),
        "the real-node tests need root (they create namespaces, cgroups and mounts)"
    );
    // A cluster's namespaces carry the test's deadline: bring-up, deploys and the e2e run
    // (bounded to 20 min itself) under 30 min.
    netlink_tests::deadline::set_limit(Duration::from_secs(1800));
}

/// The image `cargo xtask image` wrote, refusing one older than the sources it was built
/// from (the test would judge yesterday's code).
fn our_image() -> (PathBuf, String) {
    let reference = xtask::image::default_reference().unwrap();
    let tag = reference.rsplit_once(':').unwrap().1.to_string();
    let path = realnode::workspace_root()
        .join("target")
        .join(format!("kube-nlproxy-{tag}.oci.tar"));
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: build it first with `cargo xtask image` (README's test command does)",
                path.display()
            )
        });
    let root = realnode::workspace_root();
    let mut newest = None;
    let mut stack = vec![root.join("src")];
    for f in ["Cargo.toml", "Cargo.lock"] {
        newest = newest.max(
            std::fs::metadata(root.join(f))
                .and_then(|m| m.modified())
                .ok(),
        );
    }
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                newest = newest.max(Some(t));
            }
        }
    }
    // NLP_STALE_IMAGE_OK=1: a developer iterating on the harness with an older image.
    if let Some(n) = newest.filter(|_| std::env::var_os("NLP_STALE_IMAGE_OK").is_none()) {
        assert!(
            built >= n,
            "{} is older than the sources: run `cargo xtask image` again",
            path.display()
        );
    }
    (path, reference)
}

fn wait_proxy_pods_ready(c: &Cluster, selector: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    c.wait_for(limit, &format!("proxy pods ({selector}) Ready"), |c| {
        c.pods_ready("kube-system", selector, c.nodes.len())
    });
    t0.elapsed()
}

/// The SA the DaemonSet of `deploy/` runs as is bound to our ClusterRole and nothing else.
fn assert_rbac_is_ours_only(c: &Cluster) {
    let bindings = c.kubectl_ok(&[
        "get",
        "clusterrolebindings,rolebindings",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.roleRef.name} {.subjects[*].name}{\"\\n\"}{end}",
    ]);
    let ours: Vec<&str> = bindings
        .lines()
        .filter(|l| l.split_whitespace().skip(2).any(|s| s == "kube-nlproxy"))
        .collect();
    assert_eq!(
        ours,
        ["kube-nlproxy kube-nlproxy kube-nlproxy"],
        "{bindings}"
    );
}

#[test]
fn deploy_as_shipped_passes_upstreams_e2e() {
    require_root();
    let (image, reference) = our_image();
    // Dual-stack nodes (proxies::CI_FAMILY): every IPv4 path, and the IPv6 ones beside it;
    // Flannel as the CNI (proxies::CI_CNI), the other real-node tests run the bridge plugin.
    let family = proxies::CI_FAMILY;
    let c = Cluster::start_with(
        ClusterConfig {
            nodes: 3,
            family,
            cni: proxies::CI_CNI,
        },
        &[image],
    );
    // A kubeadm cluster: kubeadm's ConfigMap (clusterCIDR in both families, as kubeadm
    // writes a dual-stack podSubnet) and its kube-proxy DaemonSet serving; then README's
    // install, word for word, and at the end its way back.
    proxies::deploy(&c, proxies::Proxy::Upstream, "", Duration::from_secs(180));
    let kubeadms = KubeadmObjects::read(&c);
    let flannel_before = c.flannel_rules();
    assert!(
        flannel_before.iter().all(|rules| !rules.is_empty()),
        "Flannel's rules on every node: {flannel_before:#?}"
    );
    let t0 = Instant::now();
    c.run_readme_block("release");
    c.run_readme_block("install");
    assert_kube_proxy_addon_disabled(&c, &kubeadms, "README's install");
    let took = wait_proxy_pods_ready(
        &c,
        "app.kubernetes.io/name=kube-nlproxy",
        Duration::from_secs(60),
    );
    eprintln!(
        "kube-nlproxy pods Running and Ready on 3 nodes {:?} after README's install",
        t0.elapsed().max(took)
    );
    let pods = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=kube-nlproxy",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].image} {.spec.containers[0].imagePullPolicy} {.spec.serviceAccountName} {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
    ]);
    for l in pods.lines() {
        assert_eq!(
            l,
            format!("{reference} IfNotPresent kube-nlproxy 0"),
            "{pods}"
        );
    }
    assert_rbac_is_ours_only(&c);
    assert_monitoring_finds_our_pods(&c);
    c.install_coredns(Duration::from_secs(180));
    let report = e2e::run(
        &c,
        &proxies::ci_focus_for(family),
        &proxies::skip_regex_for(family),
        Duration::from_secs(1200),
        &c.dir.join("e2e-ci.log"),
    );
    eprintln!("{}", report.render());
    let failed: Vec<_> = report.failed().collect();
    assert!(
        failed.is_empty(),
        "e2e failures: {failed:#?}\n{}",
        e2e::tail(&c.dir.join("e2e-ci.log"), 80)
    );
    let passed: Vec<&str> = report.passed().collect();
    let dual_stack_musts = if family.is_dual() {
        proxies::CI_MUST_PASS_DUAL_STACK
    } else {
        &[]
    };
    for must in proxies::CI_MUST_PASS.iter().chain(dual_stack_musts) {
        assert!(
            passed.iter().any(|p| p.contains(must)),
            "{must} did not pass:\n{}",
            report.render()
        );
    }
    // Our start-up cleanup and every sync since left Flannel's chains and tables alone (a
    // rule deleted and re-added by Flannel's resync would show a new handle).
    assert_eq!(
        c.flannel_rules(),
        flannel_before,
        "Flannel's rules changed while kube-nlproxy ran"
    );
    // Skips: only those the suite makes for reasons README lists.
    for (name, why) in report.skipped() {
        assert!(
            proxies::EXPECTED_SELF_SKIPS
                .iter()
                .any(|(n, _)| name.contains(n)),
            "{name} skipped itself: {why}"
        );
    }
    under_the_seccomp_profile(&c);
    go_back_from_deploy(&c, &kubeadms);
}

/// The `Seccomp:`, `Seccomp_filters:` and `NoNewPrivs:` lines of every kube-nlproxy daemon
/// on this host (the nodes' containers are its processes), found by the command line
/// deploy/ gives it.
fn daemons_seccomp() -> Vec<SeccompState> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.first() != Some(&&b"/usr/local/bin/kube-proxy"[..])
            || !args.contains(&&b"--config=/var/lib/kube-proxy/config.conf"[..])
        {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(e.path().join("status")) {
            out.push(SeccompState::of(&status));
        }
    }
    out
}

/// Issue #55.4: over the shipped install, deploy/ with `net-admin` and `seccomp` added
/// (docs/deploy.md), with live traffic: the pods roll to the profile their init container
/// writes, every node's daemon runs in seccomp's filter mode under two filters (the
/// runtime's profile and its own exec filter) with no_new_privs, the flows carry on, and a
/// shell exec into the container is refused. Then the shipped manifests again.
fn under_the_seccomp_profile(c: &Cluster) {
    let privileged = daemons_seccomp();
    assert_eq!(privileged.len(), c.nodes.len(), "{privileged:?}");
    // A privileged container gets no profile: the exec filter alone.
    for d in &privileged {
        assert_eq!(d.mode_and_filters(), ("2", "1"), "{privileged:?}");
    }
    let dir = proxies::kustomization_with(
        &c.dir.join("seccomp-kustomization"),
        &["deploy/components/net-admin", "deploy/components/seccomp"],
    );
    let before = c.start_traffic(Duration::from_secs(120));
    let rollout = |dir: &std::path::Path| {
        c.kubectl_ok(&["apply", "-k", dir.to_str().unwrap()]);
        rollout_status(c, "kube-nlproxy");
    };
    rollout(&dir);
    let confined = daemons_seccomp();
    assert_eq!(confined.len(), c.nodes.len(), "{confined:?}");
    for d in &confined {
        assert_eq!(d.mode_and_filters(), ("2", "2"), "{confined:?}");
        assert_eq!(d.no_new_privs, "1", "{confined:?}");
    }
    let pod = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=kube-nlproxy",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let exec = c.kubectl(&["-n", "kube-system", "exec", &pod, "--", "sh", "-c", "true"]);
    assert!(
        !exec.status.success(),
        "a shell ran in the container: {exec:?}"
    );
    assert_flows_continue(c, &before, "deploy/ -> deploy/ under the seccomp profile");
    // deploy/ as shipped (the release's files are the repository's: deploy.rs).
    rollout(&realnode::workspace_root());
}

/// kubeadm's kube-proxy DaemonSet and ConfigMap as the way back must restore them: what
/// an operator wrote (spec, labels, annotations, data), not what the API server keeps
/// about them (status, resourceVersion, uid, generation and the template generation the
/// DaemonSet controller counts).
#[derive(Debug, PartialEq)]
struct KubeadmObjects {
    daemonset: serde_json::Value,
    configmap: serde_json::Value,
    /// `kubeadm-config`, whose `ClusterConfiguration` README's install edits and its way
    /// back edits again.
    kubeadm_config: serde_json::Value,
}

impl KubeadmObjects {
    fn read(c: &Cluster) -> KubeadmObjects {
        let get = |kind: &str, name: &str| -> serde_json::Value {
            let json = c.kubectl_ok(&["-n", "kube-system", "get", kind, name, "-o", "json"]);
            serde_json::from_str(&json).unwrap()
        };
        let ds = get("daemonset", "kube-proxy");
        let mut annotations = ds["metadata"]["annotations"].clone();
        if let Some(a) = annotations.as_object_mut() {
            a.remove("deprecated.daemonset.template.generation");
        }
        let cm = get("configmap", "kube-proxy");
        let kubeadm_config = get("configmap", "kubeadm-config");
        KubeadmObjects {
            kubeadm_config: serde_json::json!({
                "labels": kubeadm_config["metadata"]["labels"],
                "annotations": kubeadm_config["metadata"]["annotations"],
                "data": kubeadm_config["data"],
            }),
            daemonset: serde_json::json!({
                "labels": ds["metadata"]["labels"],
                "annotations": annotations,
                "spec": ds["spec"],
            }),
            configmap: serde_json::json!({
                "labels": cm["metadata"]["labels"],
                "annotations": cm["metadata"]["annotations"],
                "data": cm["data"],
            }),
        }
    }
}

/// Asserts that `kubeadm-config`'s `ClusterConfiguration` says `proxy: {disabled: true}`, as
/// README's install leaves it (`after` names the step), and that nothing else in it changed
/// from `before` (a [`KubeadmObjects`] read before the install).
fn assert_kube_proxy_addon_disabled(c: &Cluster, before: &KubeadmObjects, after: &str) {
    let parse = |objects: &KubeadmObjects| -> serde_json::Value {
        let text = objects.kubeadm_config["data"]["ClusterConfiguration"]
            .as_str()
            .expect("kubeadm-config holds a ClusterConfiguration");
        serde_saphyr::from_str(text).unwrap()
    };
    let mut now = parse(&KubeadmObjects::read(c));
    assert_eq!(
        now["proxy"],
        serde_json::json!({"disabled": true}),
        "kubeadm's kube-proxy addon disabled after {after}"
    );
    now["proxy"] = serde_json::json!({});
    assert_eq!(
        now,
        parse(before),
        "nothing else in ClusterConfiguration changed by {after}"
    );
}

/// README's way back from deploy/, with live traffic: kubeadm's objects as they were, its
/// pods serving with upstream's rules, ours gone with our tables, and no flow broken.
fn go_back_from_deploy(c: &Cluster, kubeadms: &KubeadmObjects) {
    let before = c.start_traffic(Duration::from_secs(120));
    c.run_readme_block("go-back-deploy");
    assert_flows_continue(c, &before, "ours (deploy/) -> upstream");
    assert_eq!(
        &KubeadmObjects::read(c),
        kubeadms,
        "kubeadm's objects restored"
    );
    assert!(c.pods_ready("kube-system", "k8s-app=kube-proxy", c.nodes.len()));
    let ours = c.kubectl_ok(&["-n", "kube-system", "get", "daemonsets", "-o", "name"]);
    assert_eq!(ours.trim(), "daemonset.apps/kube-proxy", "{ours}");
    for n in 0..c.nodes.len() {
        for family in ["ip", "ip6"] {
            assert!(
                !has_table(c, n, family, "kube-nlproxy"),
                "our {family} table removed from node {n} by the uninstall DaemonSet"
            );
        }
        assert!(
            upstream_rules_present(c, n, ""),
            "upstream's rules back on node {n}"
        );
    }
}

/// kube-prometheus-stack's kube-proxy Service as its chart renders it with default values
/// (charts/kube-prometheus-stack/templates/exporters/kube-proxy/service.yaml: headless, in
/// kube-system, port 10249, selector `k8s-app: kube-proxy`): its ServiceMonitor scrapes
/// what this Service's endpoints list, and KubeProxyDown fires when there are none.
const KUBE_PROMETHEUS_STACK_KUBE_PROXY_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: kube-prometheus-stack-kube-proxy
  namespace: kube-system
  labels: {app: kube-prometheus-stack-kube-proxy, jobLabel: kube-proxy, release: kube-prometheus-stack}
spec:
  clusterIP: None
  ports:
  - {name: http-metrics, port: 10249, protocol: TCP, targetPort: 10249}
  selector: {k8s-app: kube-proxy}
  type: ClusterIP
"#;

/// Issue #53.2: monitoring that found kubeadm's kube-proxy finds deploy/'s pods: the
/// kube-prometheus-stack Service lists one ready endpoint per node, each a node's address.
fn assert_monitoring_finds_our_pods(c: &Cluster) {
    c.apply(KUBE_PROMETHEUS_STACK_KUBE_PROXY_SERVICE);
    let ready_endpoints = |c: &Cluster| {
        let out = c.kubectl_ok(&[
            "-n",
            "kube-system",
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=kube-prometheus-stack-kube-proxy",
            "-o",
            "jsonpath={range .items[*].endpoints[*]}{.addresses[0]} {.conditions.ready}{\"\\n\"}{end}",
        ]);
        out.lines()
            .filter_map(|l| l.strip_suffix(" true").map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    c.wait_for(
        Duration::from_secs(60),
        "kube-prometheus-stack's kube-proxy Service listing a ready endpoint per node",
        |c| ready_endpoints(c).len() == c.nodes.len(),
    );
    let pods = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "k8s-app=kube-proxy",
        "-o",
        "jsonpath={range .items[*]}{.status.podIP} {.metadata.labels.app\\.kubernetes\\.io/name}{\"\\n\"}{end}",
    ]);
    let ours: std::collections::BTreeSet<String> = pods
        .lines()
        .filter_map(|l| l.strip_suffix(" kube-nlproxy").map(str::to_string))
        .collect();
    assert_eq!(
        ready_endpoints(c),
        ours,
        "the Service's endpoints are our pods (host network: the nodes' addresses): {pods}"
    );
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "delete",
        "service",
        "kube-prometheus-stack-kube-proxy",
    ]);
}

/// Whether `family` table `name` exists in the node's network namespace.
fn has_table(c: &Cluster, node: usize, family: &str, name: &str) -> bool {
    let out = c.nodes[node]
        .ns
        .output("nft", &["list", "table", family, name]);
    out.status.success()
}

/// Whether upstream's iptables mode has its service chain in the node (iptables-nft).
fn has_upstream_iptables_rules(c: &Cluster, node: usize) -> bool {
    let out = c.nodes[node]
        .ns
        .output("iptables-nft", &["-t", "nat", "-S", "KUBE-SERVICES"]);
    out.status.success()
}

/// Upstream's rules of `mode` ("" is iptables) are what the node has.
fn upstream_rules_present(c: &Cluster, node: usize, mode: &str) -> bool {
    match mode {
        "nftables" => has_table(c, node, "ip", "kube-proxy"),
        _ => has_upstream_iptables_rules(c, node),
    }
}

fn assert_flows_continue(c: &Cluster, before: &realnode::traffic::Flows, what: &str) {
    assert_flows_continue_with(c, before, what, realnode::traffic::Flows::continues);
}

/// [`assert_flows_continue`] with `continues` judging the flows.
fn assert_flows_continue_with(
    c: &Cluster,
    before: &realnode::traffic::Flows,
    what: &str,
    continues: fn(
        &realnode::traffic::Flows,
        &realnode::traffic::Flows,
        usize,
        u64,
    ) -> Result<(), String>,
) {
    // Let a few more round trips happen after the change.
    std::thread::sleep(Duration::from_secs(5));
    let now = c.flows();
    if let Err(e) = continues(&now, before, 3, 5) {
        panic!("{what}: the established flows broke: {e}\n{now:?}");
    }
    let answer = c
        .new_connection_works(Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{what}: a new connection: {e}"));
    eprintln!("{what}: established flows kept going; a new connection reached {answer}");
}

/// From upstream kube-proxy in `mode` (kubeadm's DaemonSet) to ours in place and back, as
/// README says, with a long-lived TCP connection and a UDP flow through a Service.
fn migrate_in_place_and_back(c: &Cluster, mode: &str, before: realnode::traffic::Flows) {
    for n in 0..c.nodes.len() {
        assert!(
            upstream_rules_present(c, n, mode),
            "upstream's {mode:?} rules on node {n} before the swap"
        );
    }
    let kubeadms = KubeadmObjects::read(c);
    c.run_readme_block("release");
    c.run_readme_block("migrate");
    assert_kube_proxy_addon_disabled(c, &kubeadms, "README's in-place swap");
    // `rollout status` returns once the new pods are ready; the last old one may still be
    // terminating.
    c.wait_for(
        Duration::from_secs(60),
        "every kube-proxy pod running our image",
        |c| {
            let images = c.kubectl_ok(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=kube-proxy",
                "-o",
                "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
            ]);
            images.lines().count() == c.nodes.len()
                && images.lines().all(|l| l == "localhost/kube-nlproxy:v0.1.0")
                && c.pods_ready("kube-system", "k8s-app=kube-proxy", c.nodes.len())
        },
    );
    assert_flows_continue(c, &before, "upstream -> ours");
    for n in 0..c.nodes.len() {
        assert!(
            has_table(c, n, "ip", "kube-nlproxy"),
            "our table on node {n}"
        );
        assert!(
            !upstream_rules_present(c, n, mode),
            "upstream's {mode:?} rules removed from node {n} by ours"
        );
    }
    let mid = c.flows();
    c.run_readme_block("go-back");
    assert_flows_continue(c, &mid, "ours -> upstream");
    for n in 0..c.nodes.len() {
        assert!(
            !has_table(c, n, "ip", "kube-nlproxy"),
            "our table removed from node {n} by the uninstall DaemonSet"
        );
        assert!(
            upstream_rules_present(c, n, mode),
            "upstream's {mode:?} rules back on node {n}"
        );
    }
    assert_eq!(
        KubeadmObjects::read(c),
        kubeadms,
        "kubeadm's objects as they were after README's way back"
    );
}

#[test]
fn migrate_from_upstream_in_place_and_back_with_live_traffic() {
    require_root();
    let (image, _) = our_image();
    let c = Cluster::start(3, &[image]);
    // Upstream's iptables mode through docs/deploy.md's canary (one node, then all) and
    // README's way back; then upstream's nftables mode through README's in-place swap.
    proxies::deploy(&c, proxies::Proxy::Upstream, "", Duration::from_secs(180));
    let before = c.start_traffic(Duration::from_secs(120));
    canary_one_node_then_all_and_back(&c, &before);
    c.apply(&proxies::kubeadm_configmap("nftables"));
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        "daemonset/kube-proxy",
    ]);
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "daemonset/kube-proxy",
        "--timeout=100s",
    ]);
    let before = c.flows();
    assert_flows_continue(&c, &before, "upstream iptables -> upstream nftables");
    migrate_in_place_and_back(&c, "nftables", c.flows());
    beside_kube_proxy_one_service_at_a_time(&c);
}

/// `nft list table ip NAME` on node `n` (empty when there is none).
fn table_text(c: &Cluster, n: usize, name: &str) -> String {
    let out = c.nodes[n].ns.output("nft", &["list", "table", "ip", name]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until every node's tables say the echo Service's ClusterIP is `ours`' (in ours'
/// table, not in upstream kube-proxy's nftables one) or upstream's.
fn wait_echo_served_by(c: &Cluster, ours: bool, what: &str) {
    let ip = service_ip(c, "default", "echo");
    c.wait_for(Duration::from_secs(60), what, |c| {
        (0..c.nodes.len()).all(|n| {
            let (mine, theirs) = (
                table_text(c, n, "kube-nlproxy").contains(&ip),
                table_text(c, n, "kube-proxy").contains(&ip),
            );
            (mine, theirs) == (ours, !ours)
        })
    });
}

/// `kubectl rollout restart` of `daemonset` in kube-system, then its `rollout status`.
fn restart_daemonset(c: &Cluster, daemonset: &str) {
    let ds = format!("daemonset/{daemonset}");
    c.kubectl_ok(&["-n", "kube-system", "rollout", "restart", &ds]);
    rollout_status(c, daemonset);
}

/// `kubectl rollout status` of `daemonset` in kube-system, 180 s at most.
fn rollout_status(c: &Cluster, daemonset: &str) {
    let ds = format!("daemonset/{daemonset}");
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        &ds,
        "--timeout=180s",
    ]);
}

/// Issue #55.1: README's "Beside kube-proxy, one Service at a time", word for word, beside
/// upstream kube-proxy in nftables mode on every node, with the echo Service's long-lived
/// TCP connection and UDP flow running: ours starts without touching kube-proxy's rules;
/// the Service moves to ours by its label; each proxy's DaemonSet restarts while ours
/// serves it; README's way back takes the label off and ours away. The flows never break
/// (but the UDP one on the way back: [`realnode::traffic::Flows::tcp_continues`]), a new
/// connection works from a pod and from every node, and each proxy's table holds the
/// Service only while it is its own.
fn beside_kube_proxy_one_service_at_a_time(c: &Cluster) {
    let ip = service_ip(c, "default", "echo");
    let before = c.flows();
    c.run_readme_block("beside");
    for n in 0..c.nodes.len() {
        assert!(
            has_table(c, n, "ip", "kube-nlproxy"),
            "our table on node {n}"
        );
    }
    wait_echo_served_by(c, false, "echo still upstream's beside ours");
    assert_flows_continue(c, &before, "ours started beside upstream");
    let unlabelled = c.flows();
    // README's move: `kubectl -n NS label service NAME service.kubernetes.io/service-proxy-name=kube-nlproxy`.
    let label = format!("{}=kube-nlproxy", proxies::SERVICE_PROXY_NAME);
    c.kubectl_ok(&["-n", "default", "label", "service", "echo", &label]);
    wait_echo_served_by(c, true, "echo moved to ours by its label");
    assert_flows_continue(c, &unlabelled, "echo labelled over to ours");
    for n in 0..c.nodes.len() {
        let answer = connect_from_node(c, n, &ip).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("beside, from node {n} through ours: {answer}");
    }
    let moved = c.flows();
    restart_daemonset(c, "kube-nlproxy");
    assert_flows_continue(c, &moved, "ours restarted while serving echo");
    let restarted = c.flows();
    restart_daemonset(c, "kube-proxy");
    wait_echo_served_by(c, true, "echo still ours after kube-proxy's restart");
    assert_flows_continue(c, &restarted, "kube-proxy restarted beside ours");
    // README's way back takes the label off: upstream kube-proxy sees the Service a moment
    // before its slices, serves it without endpoints meanwhile (rejecting and clearing UDP
    // flows), so the TCP connection alone is held to its endpoint.
    let labelled = c.flows();
    c.run_readme_block("beside-go-back");
    assert_flows_continue_with(
        c,
        &labelled,
        "README's way back from beside",
        realnode::traffic::Flows::tcp_continues,
    );
    for n in 0..c.nodes.len() {
        assert!(
            !has_table(c, n, "ip", "kube-nlproxy"),
            "our table removed from node {n}"
        );
        assert!(
            table_text(c, n, "kube-proxy").contains(&ip),
            "echo upstream's on node {n}"
        );
        connect_from_node(c, n, &ip).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Samples every node's ruleset every 250 ms until stopped: each sample must hold our table
/// with `needle` (a Service's ClusterIP) in it. Returns the samples that did not.
struct RulesWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl RulesWatch {
    fn start(c: &Cluster, needle: &str) -> RulesWatch {
        let names: Vec<String> = c.nodes.iter().map(|n| n.ns.name.clone()).collect();
        let needle = needle.to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut bad = Vec::new();
            let mut samples = 0;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                for ns in &names {
                    let out = std::process::Command::new("ip")
                        .args([
                            "netns",
                            "exec",
                            ns,
                            "nft",
                            "list",
                            "table",
                            "ip",
                            "kube-nlproxy",
                        ])
                        .output();
                    samples += 1;
                    let ok = out.as_ref().is_ok_and(|o| {
                        o.status.success() && String::from_utf8_lossy(&o.stdout).contains(&needle)
                    });
                    if !ok && bad.len() < 20 {
                        bad.push(format!("{ns}: {:?}", out.map(|o| o.status)));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            (samples, bad)
        });
        RulesWatch { stop, handle }
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

fn service_ip(c: &Cluster, ns: &str, name: &str) -> String {
    c.kubectl_ok(&[
        "-n",
        ns,
        "get",
        "service",
        name,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])
}

#[test]
fn node_life_keeps_connections_and_rules() {
    require_root();
    let (image, _) = our_image();
    let mut c = Cluster::start(3, &[image]);
    // A kubeadm cluster, its kube-proxy serving, as README's install expects.
    proxies::deploy(&c, proxies::Proxy::Upstream, "", Duration::from_secs(180));
    c.run_readme_block("release");
    c.run_readme_block("install");
    let before = c.start_traffic(Duration::from_secs(120));
    let ip = service_ip(&c, "default", "echo");
    let watch = RulesWatch::start(&c, &ip);

    // The kubelet restarts (upgrades, config changes): pods keep running, rules stay.
    let kc_limit = Duration::from_secs(90);
    for i in [0, 1] {
        c.nodes[i].restart_kubelet();
    }
    c.wait_for(kc_limit, "nodes Ready after the kubelet restarts", |c| {
        c.pods_ready(
            "kube-system",
            "app.kubernetes.io/name=kube-nlproxy",
            c.nodes.len(),
        )
    });
    assert_flows_continue(&c, &before, "kubelet restarted on node-1 and node-2");

    // Our pod deleted: the DaemonSet recreates it; the new one takes the table over.
    let mid = c.flows();
    let pod = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=kube-nlproxy",
        "--field-selector",
        "spec.nodeName=node-1",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    c.kubectl_ok(&["-n", "kube-system", "delete", "pod", &pod, "--wait=false"]);
    c.wait_for(
        Duration::from_secs(90),
        "a new kube-nlproxy pod on node-1",
        |c| {
            let names = c.kubectl_ok(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=kube-nlproxy",
                "--field-selector",
                "spec.nodeName=node-1",
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ]);
            !names.contains(&pod)
                && c.pods_ready("kube-system", "app.kubernetes.io/name=kube-nlproxy", 3)
        },
    );
    assert_flows_continue(&c, &mid, "our pod on node-1 deleted and recreated");

    // The API server restarts: the proxies keep their rules, then resume their watches.
    let mid = c.flows();
    c.cp.stop_apiserver();
    std::thread::sleep(Duration::from_secs(15));
    let during = c.flows().continues(&mid, 5, 5);
    let tokens = c.node_tokens().to_vec();
    c.cp.start_apiserver(&tokens);
    if let Err(e) = during {
        panic!("while the API server was down: {e}");
    }
    assert_flows_continue(&c, &mid, "the API server restarted");
    // A change made after the restart reaches the kernel: a new Service.
    c.kubectl_ok(&[
        "-n",
        "default",
        "create",
        "service",
        "clusterip",
        "after-restart",
        "--tcp=9100:9000",
    ]);
    let new_ip = service_ip(&c, "default", "after-restart");
    // The watchers retry as client-go's reflector does (800 ms doubling to 30 s, each wait
    // stretched by up to 2x jitter), so the attempt after the server's return may come up to
    // 60 s after the last refused one, and then the watch resumes or lists again.
    let t0 = std::time::Instant::now();
    c.wait_for(
        Duration::from_secs(120),
        "the new Service in every node's rules",
        |c| {
            c.nodes.iter().all(|n| {
                let out = n.ns.output("nft", &["list", "table", "ip", "kube-nlproxy"]);
                String::from_utf8_lossy(&out.stdout).contains(&new_ip)
            })
        },
    );
    println!(
        "a Service created after the API server's restart reached every node in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let (samples, bad) = watch.finish();
    assert!(
        bad.is_empty(),
        "our table or the Service's rules missing in {} of {samples} samples: {bad:?}",
        bad.len()
    );
}

/// The image each node's kube-proxy pod runs, by node name.
fn proxy_images_by_node(c: &Cluster) -> std::collections::BTreeMap<String, String> {
    c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "k8s-app=kube-proxy",
        "--field-selector",
        "status.phase=Running",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName} {.spec.containers[0].image}{\"\\n\"}{end}",
    ])
    .lines()
    .filter_map(|l| l.split_once(' '))
    .map(|(n, i)| (n.to_string(), i.to_string()))
    .collect()
}

/// A new TCP connection from node `n`'s own network namespace to the echo Service: the
/// answer (`HOST probe`), through whichever proxy serves that node.
fn connect_from_node(c: &Cluster, n: usize, ip: &str) -> Result<String, String> {
    let t0 = Instant::now();
    loop {
        let out = c.nodes[n].ns.output(
            "sh",
            &[
                "-c",
                &format!("echo probe | socat -t 3 - TCP:{ip}:9000,connect-timeout=3"),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && text.ends_with(" probe") {
            return Ok(text);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "node {n}: no answer from {ip}:9000: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Issue #53.4: docs/deploy.md's canary, word for word: node-1 moves to ours while node-2
/// and node-3 keep upstream kube-proxy (iptables mode), with the client's long-lived flows
/// from node-1 to backends on the other two going on; new connections through the Service
/// work from the canary and from an upstream node; then every node; then README's way back
/// leaves kubeadm's DaemonSet and ConfigMap as they were.
fn canary_one_node_then_all_and_back(c: &Cluster, before: &realnode::traffic::Flows) {
    let kubeadms = KubeadmObjects::read(c);
    let ip = service_ip(c, "default", "echo");
    let canary = c.nodes[0].name.clone();
    c.run_readme_block("release");
    c.run_doc_block("docs/deploy.md", "canary", Some(&canary));
    assert_kube_proxy_addon_disabled(c, &kubeadms, "the canary");
    let images = proxy_images_by_node(c);
    let (ours, upstream) = (
        "localhost/kube-nlproxy:v0.1.0",
        realnode::images::KUBE_PROXY,
    );
    let want: std::collections::BTreeMap<String, String> = c
        .nodes
        .iter()
        .map(|n| {
            let image = if n.name == canary { ours } else { upstream };
            (n.name.clone(), image.to_string())
        })
        .collect();
    assert_eq!(images, want, "one node on ours, the others on upstream");
    assert!(
        !upstream_rules_present(c, 0, ""),
        "ours removed upstream's rules on the canary"
    );
    for n in [1, 2] {
        assert!(
            upstream_rules_present(c, n, ""),
            "upstream's rules stay on node {n}"
        );
        assert!(
            !has_table(c, n, "ip", "kube-nlproxy"),
            "no table of ours on node {n}"
        );
    }
    assert_flows_continue(c, before, "canary on node-1, upstream on node-2 and node-3");
    for n in [0, 1] {
        let answer = connect_from_node(c, n, &ip).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("from node {n}: {answer}");
    }
    let mid = c.flows();
    c.run_doc_block("docs/deploy.md", "canary-all", None);
    let images = proxy_images_by_node(c);
    assert!(
        images.len() == c.nodes.len() && images.values().all(|i| i == ours),
        "every node on ours: {images:?}"
    );
    assert_flows_continue(c, &mid, "every node on ours");
    let end = c.flows();
    c.run_readme_block("go-back");
    assert_flows_continue(c, &end, "back to upstream");
    assert_eq!(
        KubeadmObjects::read(c),
        kubeadms,
        "kubeadm's objects as they were, update strategy and image included"
    );
}
