//! The deploy manifests parse into Kubernetes types and say what an operator expects:
//! least-privilege RBAC, hostNetwork, NET_ADMIN only, probes, a config our parser accepts,
//! and an image whose final stage has no shell.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

fn deploy(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn docs(file: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple(&deploy(file)).unwrap()
}

#[test]
fn rbac_is_least_privilege() {
    let d = docs("rbac.yaml");
    let role: ClusterRole = serde_json::from_value(d[0].clone()).unwrap();
    let mut rules: Vec<(String, String, String)> = Vec::new();
    for r in role.rules.unwrap() {
        for g in r.api_groups.clone().unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                rules.push((g.clone(), res, r.verbs.join(",")));
            }
        }
    }
    rules.sort();
    assert_eq!(
        rules,
        vec![
            ("".into(), "nodes".into(), "get,list,watch".into()),
            ("".into(), "services".into(), "list,watch".into()),
            (
                "discovery.k8s.io".into(),
                "endpointslices".into(),
                "list,watch".into()
            ),
            (
                "events.k8s.io".into(),
                "events".into(),
                "create,patch".into()
            ),
            (
                "networking.k8s.io".into(),
                "servicecidrs".into(),
                "list,watch".into()
            ),
        ]
    );
    let binding: ClusterRoleBinding = serde_json::from_value(d[1].clone()).unwrap();
    assert_eq!(binding.role_ref.name, "kube-nlproxy");
    let sa: ServiceAccount = serde_saphyr::from_str(&deploy("serviceaccount.yaml")).unwrap();
    assert_eq!(binding.subjects.unwrap()[0].name, sa.metadata.name.unwrap());
}

#[test]
fn daemonset_is_a_drop_in_for_kubeadms_kube_proxy() {
    let ds: DaemonSet = serde_saphyr::from_str(&deploy("daemonset.yaml")).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    // kubeadm's selector, and no architecture guard: the release's image index holds amd64
    // and arm64 (issue #53), and the uninstaller goes wherever the DaemonSet went.
    let selector = pod.node_selector.unwrap();
    assert_eq!(
        selector,
        [("kubernetes.io/os".to_string(), "linux".to_string())].into()
    );
    let uninstall: DaemonSet =
        serde_saphyr::from_str(&deploy("uninstall/kube-nlproxy-uninstall.yaml")).unwrap();
    assert_eq!(
        uninstall.spec.template.spec.unwrap().node_selector,
        Some(selector)
    );
    assert!(pod
        .tolerations
        .unwrap()
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));
    let c = &pod.containers[0];
    // kubeadm's command line, unchanged, at kubeadm's path
    assert_eq!(c.command.clone().unwrap(), ["/usr/local/bin/kube-proxy"]);
    assert_eq!(
        c.args.clone().unwrap(),
        [
            "--config=/var/lib/kube-proxy/config.conf",
            "--hostname-override=$(NODE_NAME)"
        ]
    );
    let env = c.env.clone().unwrap();
    let node = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
    assert_eq!(
        node.value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "spec.nodeName"
    );
    assert!(
        env.iter()
            .all(|e| !e.value.clone().unwrap_or_default().contains("example")),
        "no placeholder API host"
    );
    let sc = c.security_context.clone().unwrap();
    assert_eq!(
        sc.privileged,
        Some(true),
        "every mode, as kubeadm's kube-proxy"
    );
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let live = c.liveness_probe.clone().unwrap().http_get.unwrap();
    assert_eq!(live.path.as_deref(), Some("/livez"));
    let ready = c.readiness_probe.clone().unwrap().http_get.unwrap();
    // Not /healthz, which turns 503 on a Node being deleted (installers.rs proves it).
    assert_eq!(ready.path.as_deref(), Some("/livez"));
    // kubeadm's ConfigMap at kubeadm's mount point, and iptables' lock
    let vols = pod.volumes.unwrap();
    let cm = vols.iter().find(|v| v.name == "kube-proxy").unwrap();
    assert_eq!(cm.config_map.as_ref().unwrap().name, "kube-proxy");
    let mounts = c.volume_mounts.clone().unwrap();
    assert!(mounts
        .iter()
        .any(|m| m.name == "kube-proxy" && m.mount_path == "/var/lib/kube-proxy"));
    assert!(mounts.iter().any(|m| m.mount_path == "/run/xtables.lock"));
}

/// Issue #53.2: monitoring finds deploy/'s pods as it found kubeadm's (their
/// `k8s-app: kube-proxy`, which kube-prometheus-stack's kube-proxy Service and
/// kube-prometheus's PodMonitor select), while the DaemonSet selects by a key kubeadm's pods
/// lack, so neither DaemonSet's selector matches the other's pods' labels only by
/// `k8s-app`; deploy/monitoring/'s PodMonitor selects our pods on a port they declare.
#[test]
fn monitoring_finds_our_pods_and_the_selectors_never_overlap_kubeadms() {
    use std::collections::BTreeMap;
    let ds: DaemonSet = serde_saphyr::from_str(&deploy("daemonset.yaml")).unwrap();
    let spec = ds.spec;
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    let selector = spec.selector.match_labels.unwrap();
    let matches = |sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>| {
        sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(
        matches(&selector, &pod_labels),
        "our selector selects our pods"
    );
    // kubeadm's kube-proxy pod template carries k8s-app: kube-proxy and nothing else.
    let kubeadm_pods = BTreeMap::from([("k8s-app".to_string(), "kube-proxy".to_string())]);
    assert!(
        !matches(&selector, &kubeadm_pods),
        "our DaemonSet must never select kubeadm's pods"
    );
    // kube-prometheus-stack's default kube-proxy Service selector.
    assert!(matches(&kubeadm_pods, &pod_labels), "{pod_labels:?}");
    let monitor: serde_json::Value =
        serde_saphyr::from_str(&deploy("monitoring/podmonitor.yaml")).unwrap();
    assert_eq!(monitor["kind"], "PodMonitor");
    assert_eq!(monitor["metadata"]["namespace"], "kube-system");
    let monitor_selector: BTreeMap<String, String> =
        serde_json::from_value(monitor["spec"]["selector"]["matchLabels"].clone()).unwrap();
    assert!(matches(&monitor_selector, &pod_labels));
    assert_eq!(monitor["spec"]["jobLabel"], "k8s-app", "job=\"kube-proxy\"");
    let port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .unwrap();
    let container = &spec.template.spec.unwrap().containers[0];
    let declared = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(port))
        .unwrap_or_else(|| panic!("no container port named {port}"));
    assert_eq!(declared.container_port, 10249, "upstream's metrics port");
}

#[test]
fn deploy_dir_holds_only_objects_kubectl_can_apply() {
    // `kubectl apply -f deploy/` reads every .yaml/.yml/.json file directly in deploy/.
    let dir = format!("{}/../deploy", env!("CARGO_MANIFEST_DIR"));
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
        if !["yaml", "yml", "json"].contains(&ext) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        for v in serde_saphyr::from_multiple::<serde_json::Value>(&text).unwrap() {
            let kind = v["kind"].as_str().unwrap_or("");
            assert!(
                [
                    "ServiceAccount",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "DaemonSet",
                    "ConfigMap"
                ]
                .contains(&kind),
                "{}: {kind}",
                p.display()
            );
        }
    }
    let k = std::fs::read_to_string(format!(
        "{}/../kustomization.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for f in [
        "deploy/serviceaccount.yaml",
        "deploy/rbac.yaml",
        "deploy/daemonset.yaml",
    ] {
        assert!(k.contains(f), "{f} in the kustomization beside deploy/");
    }
}

/// The kustomize tree (the root kustomization, deploy/'s manifests, its components and the
/// uninstaller) copied into a fresh directory, to be changed as an operator's `kustomize
/// edit` would and rendered by kubectl's own kustomize.
struct KustomizeCopy {
    dir: std::path::PathBuf,
    kubectl: std::path::PathBuf,
}

impl KustomizeCopy {
    fn new(name: &str) -> KustomizeCopy {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = std::env::temp_dir().join(format!("nlp-{name}-{}", std::process::id()));
        for f in [
            "kustomization.yaml",
            "deploy/serviceaccount.yaml",
            "deploy/rbac.yaml",
            "deploy/daemonset.yaml",
            "deploy/images/kustomization.yaml",
            "deploy/components/net-admin/kustomization.yaml",
            "deploy/components/beside-kube-proxy/kustomization.yaml",
            "deploy/components/seccomp/kustomization.yaml",
            "deploy/uninstall/kustomization.yaml",
            "deploy/uninstall/kube-nlproxy-uninstall.yaml",
            "deploy/without-kubeadm/kustomization.yaml",
            "deploy/without-kubeadm/kube-proxy-configmap.yaml",
        ] {
            let to = dir.join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(root.join(f), &to).unwrap();
        }
        KustomizeCopy {
            dir,
            // The real-node bundle's kubectl, built by README's test command.
            kubectl: netlink_tests::realnode::binaries().node.join("kubectl"),
        }
    }

    /// The pod specs of the DaemonSets `kubectl kustomize` renders from `sub`.
    fn daemonset_pods(&self, sub: &str) -> Vec<serde_json::Value> {
        self.render(sub)
            .into_iter()
            .filter(|d| d["kind"] == "DaemonSet")
            .map(|d| d["spec"]["template"]["spec"].clone())
            .collect()
    }

    /// The objects `kubectl kustomize` renders from `sub`.
    fn render(&self, sub: &str) -> Vec<serde_json::Value> {
        self.try_render(sub).unwrap_or_else(|e| panic!("{e}"))
    }

    /// What `kubectl kustomize` renders from `sub`, or its error.
    #[allow(clippy::disallowed_methods)] // kubectl as the oracle
    fn try_render(&self, sub: &str) -> Result<Vec<serde_json::Value>, String> {
        let out = std::process::Command::new(&self.kubectl)
            .arg("kustomize")
            .arg(self.dir.join(sub))
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (netlink-tests/upstream/build.sh --node)",
                    self.kubectl.display()
                )
            });
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap())
    }

    /// Appends `component` to the root's components, as `kustomize edit add component` does.
    fn add_component(&self, component: &str) {
        let path = self.dir.join("kustomization.yaml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&format!("- {component}\n"));
        std::fs::write(&path, text).unwrap();
    }
}

impl Drop for KustomizeCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue #53.3: an image set once in deploy/images/ (as `kustomize edit set image` writes
/// it there) reaches both the DaemonSet (`kubectl apply -k .`) and the uninstaller
/// (`kubectl apply -k deploy/uninstall/`), its pause image included.
#[test]
fn one_image_setting_reaches_the_daemonset_and_the_uninstaller() {
    let k = KustomizeCopy::new("images");
    // What `kustomize edit set image localhost/kube-nlproxy=registry.example/kube-nlproxy:v9
    // registry.k8s.io/pause=mirror.example/pause:3.10.2` writes.
    std::fs::write(
        k.dir.join("deploy/images/kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nimages:\n\
         - name: localhost/kube-nlproxy\n  newName: registry.example/kube-nlproxy\n  newTag: v9\n\
         - name: registry.k8s.io/pause\n  newName: mirror.example/pause\n  newTag: 3.10.2\n",
    )
    .unwrap();
    let ds = k.daemonset_pods(".");
    assert_eq!(ds.len(), 1);
    assert_eq!(
        ds[0]["containers"][0]["image"],
        "registry.example/kube-nlproxy:v9"
    );
    let un = k.daemonset_pods("deploy/uninstall");
    assert_eq!(un.len(), 1);
    assert_eq!(
        un[0]["initContainers"][0]["image"],
        "registry.example/kube-nlproxy:v9"
    );
    assert_eq!(
        un[0]["containers"][0]["image"],
        "mirror.example/pause:3.10.2"
    );
}

/// Issue #53.2: `kustomize edit add component deploy/components/net-admin` turns the
/// privileged container into one with CAP_NET_ADMIN alone, and changes nothing else.
#[test]
fn the_net_admin_component_leaves_cap_net_admin_alone() {
    let k = KustomizeCopy::new("net-admin");
    let privileged = k.daemonset_pods(".");
    assert_eq!(
        privileged[0]["containers"][0]["securityContext"]["privileged"],
        true
    );
    // What `kustomize edit add component deploy/components/net-admin` writes.
    let path = k.dir.join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("- deploy/components/net-admin\n");
    std::fs::write(&path, text).unwrap();
    let pods = k.daemonset_pods(".");
    let sc = &pods[0]["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(
        sc["capabilities"],
        serde_json::json!({"drop": ["ALL"], "add": ["NET_ADMIN"]})
    );
    assert_eq!(
        (
            sc["runAsUser"].clone(),
            sc["readOnlyRootFilesystem"].clone()
        ),
        (0.into(), true.into())
    );
    let mut rest = pods[0].clone();
    let mut before = privileged[0].clone();
    rest["containers"][0]["securityContext"] = serde_json::Value::Null;
    before["containers"][0]["securityContext"] = serde_json::Value::Null;
    assert_eq!(rest, before, "only the securityContext changes");
}

/// Issue #55.4: `deploy/components/seccomp`, after the NET_ADMIN component, runs the proxy's
/// container under the binary's own profile (`localhostProfile` in the kubelet's seccomp
/// directory), which an init container of the same image writes there first, with no
/// capability; on its own (a privileged container, to which runtimes apply no profile) the
/// build fails instead of shipping a profile nothing enforces.
#[test]
fn the_seccomp_component_needs_net_admin_and_writes_the_binarys_profile() {
    let k = KustomizeCopy::new("seccomp");
    let before = k.daemonset_pods(".");
    k.add_component("deploy/components/seccomp");
    let e = k
        .try_render(".")
        .expect_err("a privileged container under a profile");
    assert!(e.contains("privileged"), "{e}");
    // Components apply in their order: net-admin first.
    let path = k.dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "- deploy/components/seccomp\n",
        "- deploy/components/net-admin\n- deploy/components/seccomp\n",
    );
    std::fs::write(&path, text).unwrap();
    let pod = &k.daemonset_pods(".")[0];
    let sc = &pod["containers"][0]["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(
        sc["seccompProfile"],
        serde_json::json!({"type": "Localhost", "localhostProfile": "kube-nlproxy.json"})
    );
    let init = &pod["initContainers"][0];
    assert_eq!(
        init["image"], pod["containers"][0]["image"],
        "one image to set"
    );
    assert_eq!(init["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(init["securityContext"]["capabilities"].get("add").is_none());
    let command: Vec<&str> = init["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mount = &init["volumeMounts"][0];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], "/var/lib/kubelet/seccomp");
    // The init container's command, run as the binary: it writes the profile the
    // container is given, at the path the kubelet resolves `localhostProfile` to.
    let dir = k.dir.join("host-seccomp");
    std::fs::create_dir_all(&dir).unwrap();
    let flag = command[1].replace(mount["mountPath"].as_str().unwrap(), dir.to_str().unwrap());
    #[allow(clippy::disallowed_methods)] // the binary under test
    let out = std::process::Command::new(netlink_tests::cluster::proxy_bin_bare())
        .arg(&flag)
        .output()
        .unwrap();
    assert!(out.status.success(), "{flag}: {out:?}");
    let written =
        std::fs::read(dir.join(sc["seccompProfile"]["localhostProfile"].as_str().unwrap()))
            .unwrap();
    let shipped = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/components/seccomp/kube-nlproxy.json"),
    )
    .unwrap();
    assert_eq!(written, shipped);
    assert_eq!(command[0], "/usr/local/bin/kube-proxy");
    // Nothing else changes but the securityContext, the init container and its volume.
    let mut rest = pod.clone();
    let mut base = before[0].clone();
    for p in [&mut rest, &mut base] {
        p["containers"][0]["securityContext"] = serde_json::Value::Null;
        p["volumes"]
            .as_array_mut()
            .unwrap()
            .retain(|v| v["name"] != mount["name"]);
        p.as_object_mut().unwrap().remove("initContainers");
    }
    assert_eq!(rest, base);
}

/// Issue #55.1: `kustomize edit add component deploy/components/beside-kube-proxy` makes
/// the DaemonSet serve only the Services labelled for it, on ports of its own beside
/// kube-proxy's 10256 and 10249, without kube-proxy's pod label, leaving node-wide conntrack
/// sysctls to kube-proxy; its command line, with the container's `$(VAR)`s expanded as the
/// kubelet expands them, is one ours accepts without a warning, as shipped and with its
/// settings changed. With the NET_ADMIN component too, both apply.
#[test]
fn the_beside_kube_proxy_component_serves_labelled_services_on_ports_of_its_own() {
    let k = KustomizeCopy::new("beside");
    let base = k.render(".");
    let path = k.dir.join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    // What `kustomize edit add component deploy/components/beside-kube-proxy` writes.
    text.push_str("- deploy/components/beside-kube-proxy\n");
    std::fs::write(&path, &text).unwrap();
    let objects = k.render(".");
    let cfg = beside_config(&objects);
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    assert_eq!(
        cfg.service_selection,
        kube_nlproxy::source::convert::ServiceSelection::Named("kube-nlproxy".into())
    );
    assert_eq!(cfg.requested_mode, "nftables");
    assert_eq!(cfg.upstream.detect_local.cluster_cidrs, ["10.244.0.0/16"]);
    assert_eq!(
        cfg.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf")),
        "kubeadm's kubeconfig, from its ConfigMap the DaemonSet mounts"
    );
    let healthz = cfg.healthz_bind_address.unwrap();
    let metrics = cfg.metrics_bind_address.unwrap();
    for (ours, theirs) in [(healthz.port(), 10256), (metrics.port(), 10249)] {
        assert_ne!(ours, theirs, "kube-proxy's port");
        assert!(
            ![10248, 10250, 10255, 10257, 10259].contains(&ours),
            "{ours}: kubelet's or the control plane's"
        );
    }
    let (max, established, close_wait) = (
        cfg.conntrack.max_per_core,
        cfg.conntrack.tcp_established_timeout,
        cfg.conntrack.tcp_close_wait_timeout,
    );
    assert!(
        max.is_none_or(|m| m == 0)
            && established.is_none_or(|d| d.is_zero())
            && close_wait.is_none_or(|d| d.is_zero()),
        "node-wide conntrack sysctls are kube-proxy's: {:?}",
        cfg.conntrack
    );
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"];
    let c = &pod["spec"]["containers"][0];
    assert_eq!(
        c["ports"],
        serde_json::json!([
            {"name": "healthz", "containerPort": healthz.port(), "protocol": "TCP"},
            {"name": "metrics", "containerPort": metrics.port(), "protocol": "TCP"},
        ])
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], healthz.port(), "{probe}");
    }
    assert!(
        pod["metadata"]["labels"].get("k8s-app").is_none(),
        "{pod:#}"
    );
    // Nothing else of the DaemonSet changes.
    let mut rest = ds.clone();
    let mut before = base
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap()
        .clone();
    for d in [&mut rest, &mut before] {
        let t = &mut d["spec"]["template"];
        t["metadata"]["labels"]["k8s-app"] = serde_json::Value::Null;
        for f in ["args", "env", "ports", "livenessProbe", "readinessProbe"] {
            t["spec"]["containers"][0][f] = serde_json::Value::Null;
        }
    }
    assert_eq!(
        rest, before,
        "only the command line, env, ports, probes and label change"
    );

    // Its settings, as `kustomize edit set configmap kube-nlproxy-beside --from-literal=…`
    // writes them.
    let component = k
        .dir
        .join("deploy/components/beside-kube-proxy/kustomization.yaml");
    let mut settings = std::fs::read_to_string(&component).unwrap();
    for (from, to) in [
        ("mode=nftables", "mode=iptables"),
        (
            "clusterCIDR=10.244.0.0/16",
            "clusterCIDR=10.244.0.0/16,fd00:10:244::/56",
        ),
    ] {
        assert!(
            settings.contains(&format!("  - {from}\n")),
            "{from} in {settings}"
        );
        settings = settings.replace(from, to);
    }
    std::fs::write(&component, settings).unwrap();
    let set = beside_config(&k.render("."));
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    assert_eq!(set.requested_mode, "iptables");
    assert_eq!(
        set.upstream.detect_local.cluster_cidrs,
        ["10.244.0.0/16", "fd00:10:244::/56"]
    );

    // With the NET_ADMIN component as well.
    text.push_str("- deploy/components/net-admin\n");
    std::fs::write(&path, &text).unwrap();
    let pods = k.daemonset_pods(".");
    assert_eq!(
        pods[0]["containers"][0]["securityContext"]["privileged"],
        false
    );
    assert_eq!(
        pods[0]["containers"][0]["ports"][0]["containerPort"],
        healthz.port()
    );
}

/// The configuration the rendered DaemonSet's container runs with: its args with each
/// `$(NAME)` replaced by its env's value or ConfigMap key (NODE_NAME, from the pod's node,
/// by `n1`), read by ours' own flag parser.
fn beside_config(objects: &[serde_json::Value]) -> kube_nlproxy::config::Config {
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let mut vars = std::collections::BTreeMap::new();
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap().to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(r) = e["valueFrom"].get("configMapKeyRef") {
            let cm = objects
                .iter()
                .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == r["name"])
                .unwrap_or_else(|| panic!("no ConfigMap {} rendered", r["name"]));
            cm["data"][r["key"].as_str().unwrap()]
                .as_str()
                .unwrap()
                .to_string()
        } else {
            assert_eq!(
                e["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName",
                "{e}"
            );
            "n1".to_string()
        };
        vars.insert(name, value);
    }
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let mut a = a.as_str().unwrap().to_string();
            for (k, v) in &vars {
                a = a.replace(&format!("$({k})"), v);
            }
            assert!(
                !a.contains("$("),
                "{a}: a variable the container does not define"
            );
            a
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kube_nlproxy::config::Config::from_flag_list(&args).unwrap()
}

/// The ConfigMap for clusters without kubeadm (issue #53.2): kubeadm's two keys, rendered
/// by `kubectl kustomize` from the four settings of its kustomization, as shipped and as
/// an operator sets them; each rendering is a config we accept with no warning and a
/// kubeconfig with the service-account token file, and the settings' own ConfigMap is not
/// among the objects applied.
#[test]
fn configmap_without_kubeadm_takes_its_settings_from_kustomize() {
    let k = KustomizeCopy::new("without-kubeadm");
    let shipped = without_kubeadm_config(&k);
    assert_eq!(shipped.server, "https://api.example.internal:6443");
    assert_eq!(shipped.mode, "nftables");
    assert_eq!(shipped.cluster_cidrs, ["10.244.0.0/16"]);
    assert_eq!(shipped.metrics, Some("127.0.0.1:10249".parse().unwrap()));
    // What `kustomize edit set configmap kube-nlproxy-settings --from-literal=…` writes:
    // each literal replaced where it stands.
    let path = k.dir.join("deploy/without-kubeadm/kustomization.yaml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (from, to) in [
        (
            "server=https://api.example.internal:6443",
            "server=https://10.99.0.1:6443",
        ),
        ("mode=nftables", "mode=ipvs"),
        (
            "clusterCIDR=10.244.0.0/16",
            "clusterCIDR=10.244.0.0/16,fd00:10:244::/56",
        ),
        (
            "metricsBindAddress=127.0.0.1:10249",
            "metricsBindAddress=0.0.0.0:10249",
        ),
    ] {
        assert!(text.contains(&format!("  - {from}\n")), "{from} in {text}");
        text = text.replace(from, to);
    }
    std::fs::write(&path, text).unwrap();
    let set = without_kubeadm_config(&k);
    assert_eq!(set.server, "https://10.99.0.1:6443");
    assert_eq!(set.mode, "ipvs");
    assert_eq!(set.cluster_cidrs, ["10.244.0.0/16", "fd00:10:244::/56"]);
    assert_eq!(set.metrics, Some("0.0.0.0:10249".parse().unwrap()));
}

/// What a rendering of deploy/without-kubeadm/ configures.
struct WithoutKubeadm {
    server: String,
    mode: String,
    cluster_cidrs: Vec<String>,
    metrics: Option<std::net::SocketAddr>,
}

/// Renders deploy/without-kubeadm/ in `k` and reads its one object, the `kube-proxy`
/// ConfigMap, as the daemon reads it.
fn without_kubeadm_config(k: &KustomizeCopy) -> WithoutKubeadm {
    let objects = k.render("deploy/without-kubeadm");
    assert_eq!(
        objects.len(),
        1,
        "the kube-proxy ConfigMap alone: {objects:#?}"
    );
    let cm: ConfigMap = serde_json::from_value(objects[0].clone()).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("kube-proxy"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("kube-system"));
    let data = cm.data.unwrap();
    let kubeconfig: serde_json::Value = serde_saphyr::from_str(&data["kubeconfig.conf"]).unwrap();
    assert_eq!(
        kubeconfig["users"][0]["user"]["tokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    let p = k.dir.join("config.conf");
    std::fs::write(&p, &data["config.conf"]).unwrap();
    let cfg = kube_nlproxy::config::Config::from_flag_list(&[
        "--config",
        p.to_str().unwrap(),
        "--hostname-override",
        "n1",
    ])
    .unwrap();
    assert!(cfg.warnings.is_empty(), "{:?}", cfg.warnings);
    assert_eq!(
        cfg.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    WithoutKubeadm {
        server: kubeconfig["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_string(),
        mode: cfg.upstream.mode.clone(),
        cluster_cidrs: cfg.upstream.detect_local.cluster_cidrs.clone(),
        metrics: cfg.metrics_bind_address,
    }
}

#[test]
fn dockerfile_builds_the_same_tree_as_xtask() {
    let df = deploy("Dockerfile");
    let stages: Vec<&str> = df.split("\nFROM ").collect();
    assert!(
        stages.len() >= 3
            && stages[1].starts_with("docker.io/library/rust:1.95.0-bookworm AS build"),
        "a pinned build stage first: {df}"
    );
    assert!(df.contains("RUN cargo xtask image --rootfs /rootfs"));
    let last = stages.last().unwrap();
    assert!(last.starts_with("scratch\n"), "{last}");
    assert!(!last.contains("\nRUN "), "no RUN in the final stage");
    assert!(last.contains("COPY --from=build /rootfs/ /"));
    assert!(last.contains("USER 0:0"));
    assert!(last.contains("ENTRYPOINT [\"/kube-nlproxy\"]"));
    let ignore =
        std::fs::read_to_string(format!("{}/../.dockerignore", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    assert!(ignore.lines().any(|l| l == "target"));
}

/// deploy/ names the image `cargo xtask image` builds, by the workspace's version, and never
/// pulls it when it was imported.
#[test]
fn deploy_names_the_image_xtask_builds() {
    let reference = xtask::image::default_reference().unwrap();
    let ds: DaemonSet = serde_saphyr::from_str(&deploy("daemonset.yaml")).unwrap();
    let spec = ds.spec.template.spec.unwrap();
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some(reference.as_str()));
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    let sc = c.security_context.clone().unwrap();
    assert_eq!((sc.run_as_user, sc.run_as_group), (Some(0), Some(0)));
    // kubeadm leaves dnsPolicy unset; ClusterFirstWithHostNet would need the DNS Service
    // this proxy has yet to program.
    assert_eq!(spec.dns_policy, None);
    let (name, tag) = reference.rsplit_once(':').unwrap();
    let k: serde_json::Value =
        serde_saphyr::from_str(&deploy("images/kustomization.yaml")).unwrap();
    assert_eq!(k["kind"], "Component");
    assert_eq!(k["images"][0]["name"], name);
    assert_eq!(k["images"][0]["newTag"], tag);
    let un: DaemonSet =
        serde_saphyr::from_str(&deploy("uninstall/kube-nlproxy-uninstall.yaml")).unwrap();
    let pod = un.spec.template.spec.unwrap();
    let init = &pod.init_containers.unwrap()[0];
    assert_eq!(init.image.as_deref(), Some(reference.as_str()));
    assert_eq!(
        init.command.clone().unwrap(),
        ["/usr/local/bin/kube-proxy", "uninstall"]
    );
    assert_eq!(pod.host_network, Some(true));
}

/// Every member of a tarball, by path.
fn tar_members(bytes: &[u8]) -> std::collections::BTreeMap<String, Vec<u8>> {
    use std::io::Read;
    let mut members = std::collections::BTreeMap::new();
    for e in tar::Archive::new(bytes).entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        members.insert(p, data);
    }
    members
}

/// The image `cargo xtask image` wrote (README's test command builds it first), read back:
/// its archive's bytes and members, config and the files of its one layer.
struct BuiltImage {
    reference: String,
    bytes: Vec<u8>,
    digest: String,
    config: serde_json::Value,
    /// (path, type, link target, content) of each layer entry, in archive order.
    files: Vec<(String, tar::EntryType, Option<String>, Vec<u8>)>,
}

impl BuiltImage {
    fn read() -> BuiltImage {
        use std::io::Read;
        let reference = xtask::image::default_reference().unwrap();
        let tag = reference.rsplit_once(':').unwrap().1;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let path = root.join(format!("target/kube-nlproxy-{tag}.oci.tar"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run `cargo xtask image` (README's test command does)",
                path.display()
            )
        });
        let members = tar_members(&bytes);
        let json = |p: &str| -> serde_json::Value { serde_json::from_slice(&members[p]).unwrap() };
        let index = json("index.json");
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            reference.as_str()
        );
        let digest = index["manifests"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let manifest = json(&format!("blobs/sha256/{}", &digest[7..]));
        let config = json(&format!(
            "blobs/sha256/{}",
            &manifest["config"]["digest"].as_str().unwrap()[7..]
        ));
        let layer = &members[&format!(
            "blobs/sha256/{}",
            &manifest["layers"][0]["digest"].as_str().unwrap()[7..]
        )];
        let mut files = Vec::new();
        let gz = flate2::read::GzDecoder::new(layer.as_slice());
        for e in tar::Archive::new(gz).entries().unwrap() {
            let mut e = e.unwrap();
            let h = e.header().clone();
            let p = e.path().unwrap().to_string_lossy().into_owned();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut content = Vec::new();
            e.read_to_end(&mut content).unwrap();
            assert_eq!(
                h.entry_type() == tar::EntryType::Regular && h.mode().unwrap() & 0o111 != 0,
                p == "kube-nlproxy",
                "only the binary is executable: {p}"
            );
            files.push((p, h.entry_type(), link, content));
        }
        BuiltImage {
            reference,
            bytes,
            digest,
            config,
            files,
        }
    }

    fn file(&self, path: &str) -> &[u8] {
        &self
            .files
            .iter()
            .find(|f| f.0 == path)
            .unwrap_or_else(|| panic!("no {path} in the image"))
            .3
    }
}

/// One static binary, the kube-proxy link and the licence documents, root, named as deploy/
/// names it, and written again from the same binary it is the same bytes.
#[test]
fn the_release_image_holds_one_static_binary_and_is_reproducible() {
    let image = BuiltImage::read();
    assert_eq!(image.config["config"]["User"], "0:0");
    assert_eq!(image.config["config"]["Entrypoint"][0], "/kube-nlproxy");
    use tar::EntryType::*;
    let listing: Vec<(&str, tar::EntryType, Option<&str>)> = image
        .files
        .iter()
        .map(|(p, t, l, _)| (p.as_str(), *t, l.as_deref()))
        .collect();
    assert_eq!(
        listing,
        vec![
            ("kube-nlproxy", Regular, None),
            ("usr/", Directory, None),
            ("usr/local/", Directory, None),
            ("usr/local/bin/", Directory, None),
            ("usr/local/bin/kube-proxy", Symlink, Some("/kube-nlproxy")),
            ("usr/share/", Directory, None),
            ("usr/share/doc/", Directory, None),
            ("usr/share/doc/kube-nlproxy/", Directory, None),
            ("usr/share/doc/kube-nlproxy/LICENSE", Regular, None),
            (
                "usr/share/doc/kube-nlproxy/THIRD_PARTY_NOTICES",
                Regular,
                None
            ),
            ("usr/share/doc/kube-nlproxy/sbom.spdx.json", Regular, None),
        ]
    );
    let binary = image.file("kube-nlproxy").to_vec();
    assert_eq!(
        xtask::image::elf_needs_interpreter(&binary),
        Ok(false),
        "static"
    );
    // The same binary and documents written again: the same digest.
    let dir = std::env::temp_dir().join(format!("nlp-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kube-nlproxy"), &binary).unwrap();
    let created = image.config["created"].as_str().unwrap().to_string();
    let epoch = if created == "1970-01-01T00:00:00Z" {
        0
    } else {
        panic!("built with SOURCE_DATE_EPOCH set ({created}): rebuild without it to compare")
    };
    let docs = ["LICENSE", "THIRD_PARTY_NOTICES", "sbom.spdx.json"]
        .iter()
        .map(|n| {
            let content = image.file(&format!("usr/share/doc/kube-nlproxy/{n}"));
            (n.to_string(), content.to_vec())
        })
        .collect();
    // The provenance the image was built with, from its labels.
    let label = |k: &str| {
        image.config["config"]["Labels"][format!("org.opencontainers.image.{k}")]
            .as_str()
            .map(str::to_string)
    };
    let provenance = xtask::image::Provenance {
        source: label("source"),
        revision: label("revision").unwrap_or_default(),
    };
    let img = xtask::image::release_image(
        &dir.join("kube-nlproxy"),
        xtask::image::Arch::Amd64,
        &image.reference,
        epoch,
        &provenance,
        docs,
    )
    .unwrap();
    let again = xtask::oci::write_archive(&img, &dir.join("again.tar")).unwrap();
    assert_eq!(again.digest, image.digest);
    assert_eq!(std::fs::read(dir.join("again.tar")).unwrap(), image.bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #53: the image says where it came from (OCI labels: version, revision, created,
/// licences) and carries the project's LICENSE, an SPDX SBOM of exactly what the binary
/// links (checked against `cargo tree`'s normal, non-proc-macro dependencies and dpkg's
/// glibc and libgcc) and the third-party notices with every component's licence texts.
#[test]
#[allow(clippy::disallowed_methods)] // oracles: git, cargo tree, dpkg-query
fn the_image_names_its_revision_and_carries_licences_and_an_sbom() {
    use std::process::Command;
    let run = |cmd: &mut Command| -> String {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let image = BuiltImage::read();
    let labels = &image.config["config"]["Labels"];
    let head = run(Command::new("git")
        .current_dir(&root)
        .args(["rev-parse", "HEAD"]));
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        head.trim(),
        "the image names another commit than the checkout's: run `cargo xtask image` again"
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        image.reference.rsplit_once(':').unwrap().1
    );
    assert_eq!(
        labels["org.opencontainers.image.created"],
        image.config["created"]
    );
    let licence = std::fs::read(root.join("LICENSE")).unwrap();
    assert_eq!(image.file("usr/share/doc/kube-nlproxy/LICENSE"), licence);

    let sbom: serde_json::Value =
        serde_json::from_slice(image.file("usr/share/doc/kube-nlproxy/sbom.spdx.json")).unwrap();
    assert_eq!(sbom["spdxVersion"], "SPDX-2.3");
    let packages = sbom["packages"].as_array().unwrap();
    let purls: std::collections::BTreeSet<String> = packages
        .iter()
        .map(|p| {
            p["externalRefs"][0]["referenceLocator"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let tree = run(Command::new(env!("CARGO"))
        .current_dir(&root)
        .args([
            "tree",
            "--locked",
            "-p",
            "kube-nlproxy",
            "-e",
            "normal,no-proc-macro",
        ])
        .args(["--target", "x86_64-unknown-linux-gnu", "--prefix", "none"])
        .args(["--format", "pkg:cargo/{p}"]));
    let linked: std::collections::BTreeSet<String> = tree
        .lines()
        .map(|l| {
            // "pkg:cargo/name vX.Y.Z (*)" or "... (/path)": name and version only.
            let mut words = l.split_whitespace();
            let name = words.next().unwrap();
            let version = words.next().unwrap().trim_start_matches('v');
            format!("{name}@{version}")
        })
        .collect();
    let cargo_purls: std::collections::BTreeSet<String> = purls
        .iter()
        .filter(|p| p.starts_with("pkg:cargo/"))
        .cloned()
        .collect();
    assert_eq!(
        cargo_purls, linked,
        "the SBOM's crates are what the binary links"
    );
    // The C runtime: glibc and libgcc, each at the version dpkg has installed.
    for name in ["glibc", "libgcc"] {
        let p = packages
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in the SBOM"));
        let purl = p["externalRefs"][0]["referenceLocator"].as_str().unwrap();
        let package = purl
            .strip_prefix("pkg:deb/debian/")
            .and_then(|r| r.split_once('@'))
            .unwrap_or_else(|| panic!("{purl}"))
            .0;
        let version = run(Command::new("dpkg-query").args(["-W", "-f", "${Version}", package]));
        assert_eq!(p["versionInfo"], version.as_str(), "{name}");
    }
    // Every crate checksum is Cargo.lock's (spot-check: each has one, 64 hex digits).
    for p in packages.iter().filter(|p| {
        p["downloadLocation"]
            .as_str()
            .is_some_and(|d| d.starts_with("https://crates.io/"))
    }) {
        let sum = p["checksums"][0]["checksumValue"]
            .as_str()
            .unwrap_or_default();
        assert!(
            sum.len() == 64 && sum.bytes().all(|b| b.is_ascii_hexdigit()),
            "{p}"
        );
    }

    let notices = String::from_utf8(
        image
            .file("usr/share/doc/kube-nlproxy/THIRD_PARTY_NOTICES")
            .to_vec(),
    )
    .unwrap();
    for p in &packages[1..] {
        let line = format!(
            "- {} {}: {}\n",
            p["name"].as_str().unwrap(),
            p["versionInfo"].as_str().unwrap(),
            p["licenseDeclared"].as_str().unwrap()
        );
        assert!(notices.contains(&line), "notices lack {line:?}");
    }
    // Texts, not only names: tokio's MIT licence, glibc's LGPL and Debian's copyright file.
    assert!(notices.contains("Permission is hereby granted, free of charge"));
    assert!(
        notices.contains("GNU LESSER GENERAL PUBLIC LICENSE\n                       Version 2.1")
    );
    assert!(notices.contains("--- /usr/share/common-licenses/LGPL-2.1\n"));
}

/// Issue #53: Cargo.toml declares Apache-2.0 for every crate; the licence's text is at the
/// root, whole (the terms and the appendix an adopter's legal review looks for).
#[test]
fn the_licence_cargo_declares_is_at_the_root() {
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    for manifest in ["Cargo.toml", "netlink-tests/Cargo.toml", "xtask/Cargo.toml"] {
        let toml = std::fs::read_to_string(format!("{root}/{manifest}")).unwrap();
        assert!(
            toml.lines().any(|l| l == r#"license = "Apache-2.0""#),
            "{manifest}"
        );
    }
    let text = std::fs::read_to_string(format!("{root}/LICENSE")).unwrap();
    assert!(text.contains("Apache License\n                           Version 2.0, January 2004"));
    assert!(text.contains("END OF TERMS AND CONDITIONS"));
    assert!(text.contains("APPENDIX: How to apply the Apache License to your work."));
}

/// Issue #53.1: the amd64 release README's test command writes (`cargo xtask release --arch
/// amd64`, after `cargo xtask image`):
/// every file it writes is in SHA256SUMS and `sha256sum -c` accepts them; the platform's
/// archive is the very image `cargo xtask image` wrote (same bytes); the index names that
/// manifest for linux/amd64; the binary, SBOM and deploy/ are the image's and the checkout's;
/// the notes carry CHANGELOG.md's section and every digest. (arm64 needs a cross toolchain CI
/// does not install: docs/release.md records that run.)
#[test]
#[allow(clippy::disallowed_methods)] // runs xtask and the sha256sum oracle
fn the_release_directory_holds_the_image_its_index_and_sums() {
    use std::io::Read;
    use std::process::Command;
    let image = BuiltImage::read();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap();
    let version =
        xtask::image::package_version(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap())
            .unwrap();
    // `cargo build --workspace` (README's test command) builds xtask beside this test.
    let xtask_bin = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(std::path::Path::parent)
        .unwrap()
        .join("xtask");
    let binary = root.join("target/x86_64-unknown-linux-gnu/image/kube-nlproxy");
    // README's test command wrote it (`cargo xtask release --arch amd64`).
    let dir = root.join(format!("target/kube-nlproxy-v{version}-release"));
    assert!(
        dir.join("SHA256SUMS").exists(),
        "{}: run `cargo xtask release --arch amd64` (README's test command does)",
        dir.display()
    );

    // SHA256SUMS names every other file, and they match.
    let mut written: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    written.sort();
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let summed: Vec<&str> = sums.lines().map(|l| &l[66..]).collect();
    assert_eq!(summed, written);
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "SHA256SUMS"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");

    // The platform's archive is `cargo xtask image`'s, byte for byte.
    let platform =
        std::fs::read(dir.join(format!("kube-nlproxy-v{version}-linux-amd64.oci.tar"))).unwrap();
    assert!(
        platform == image.bytes,
        "the amd64 archive differs from cargo xtask image's"
    );
    let bin = dir.join(format!("kube-nlproxy-v{version}-linux-amd64"));
    assert_eq!(std::fs::read(&bin).unwrap(), image.file("kube-nlproxy"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(bin.metadata().unwrap().permissions().mode() & 0o777, 0o755);
    assert_eq!(
        std::fs::read(dir.join("sbom-linux-amd64.spdx.json")).unwrap(),
        image.file("usr/share/doc/kube-nlproxy/sbom.spdx.json")
    );

    // The index: one entry tagged vVERSION, naming an index whose linux/amd64 manifest is
    // the image's.
    let index_tar = std::fs::read(dir.join(format!("kube-nlproxy-v{version}.oci.tar"))).unwrap();
    let members = tar_members(&index_tar);
    let json = |p: &str| -> serde_json::Value { serde_json::from_slice(&members[p]).unwrap() };
    let top = json("index.json");
    assert_eq!(
        top["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("v{version}")
    );
    assert_eq!(
        top["manifests"][0]["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let index_digest = top["manifests"][0]["digest"].as_str().unwrap();
    let index = json(&format!("blobs/sha256/{}", &index_digest[7..]));
    let listed = &index["manifests"][0];
    assert_eq!(listed["digest"], image.digest.as_str());
    assert_eq!(listed["platform"]["architecture"], "amd64");
    assert_eq!(listed["platform"]["os"], "linux");
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    // skopeo, the oracle: it reads the same index and copies every platform, checking each
    // blob against its digest.
    let archive = format!(
        "oci-archive:{}",
        dir.join(format!("kube-nlproxy-v{version}.oci.tar"))
            .display()
    );
    let skopeo = |args: &[&str]| {
        let out = Command::new("skopeo")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("skopeo: {e} (apt-get install skopeo)"));
        assert!(out.status.success(), "skopeo {args:?}: {out:?}");
        out.stdout
    };
    let raw: serde_json::Value =
        serde_json::from_slice(&skopeo(&["inspect", "--raw", &archive])).unwrap();
    assert_eq!(raw, index);
    let copy = std::env::temp_dir().join(format!("knp-release-copy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    skopeo(&[
        "copy",
        "--all",
        &archive,
        &format!("oci:{}:v{version}", copy.display()),
    ]);
    std::fs::remove_dir_all(&copy).unwrap();

    // deploy/ and the kustomization beside it, as in the checkout.
    let gz = std::fs::read(dir.join(format!("kube-nlproxy-v{version}-deploy.tar.gz"))).unwrap();
    let mut shipped = std::collections::BTreeMap::new();
    for e in tar::Archive::new(flate2::read::GzDecoder::new(gz.as_slice()))
        .entries()
        .unwrap()
    {
        let mut e = e.unwrap();
        if e.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let p = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        shipped.insert(p, data);
    }
    for f in [
        "kustomization.yaml",
        "deploy/daemonset.yaml",
        "deploy/images/kustomization.yaml",
        "deploy/uninstall/kustomization.yaml",
        "deploy/components/net-admin/kustomization.yaml",
        "deploy/components/beside-kube-proxy/kustomization.yaml",
        "deploy/components/seccomp/kustomization.yaml",
        "deploy/components/seccomp/kube-nlproxy.json",
    ] {
        assert_eq!(
            shipped.get(f),
            Some(&std::fs::read(root.join(f)).unwrap()),
            "{f}"
        );
    }

    // The notes: the changelog's section and the digests.
    let notes = std::fs::read_to_string(dir.join("RELEASE_NOTES.md")).unwrap();
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap();
    let section = xtask::release::changelog_section(&changelog, &version).unwrap();
    assert!(notes.contains(&section), "{notes}");
    assert!(notes.contains(index_digest), "{notes}");
    assert!(notes.contains(&image.digest), "{notes}");

    // A second release into the same directory is refused rather than mixed.
    let again = Command::new(&xtask_bin)
        .current_dir(&root)
        .args(["release", "--arch", "amd64", "--out"])
        .arg(&dir)
        .arg("--binary")
        .arg(format!("amd64={}", binary.display()))
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("is not empty"),
        "{again:?}"
    );
    // An unknown platform is one line naming it.
    let bad = Command::new(&xtask_bin)
        .args(["release", "--arch", "sparc"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--arch: unknown architecture \"sparc\""),
        "{bad:?}"
    );
}
