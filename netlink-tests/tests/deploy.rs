//! The deploy manifests parse into Kubernetes types and say what an operator expects:
//! least-privilege RBAC, hostNetwork, NET_ADMIN only, probes, a config our parser accepts,
//! and an image whose final stage has no shell.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

fn deploy(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn docs(file: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(&deploy(file))
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

#[test]
fn rbac_is_least_privilege() {
    let d = docs("rbac.yaml");
    let role: ClusterRole = serde_yaml::from_value(d[0].clone()).unwrap();
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
            ("".into(), "services".into(), "get,list,watch".into()),
            (
                "discovery.k8s.io".into(),
                "endpointslices".into(),
                "get,list,watch".into()
            ),
            (
                "events.k8s.io".into(),
                "events".into(),
                "create,patch".into()
            ),
            (
                "networking.k8s.io".into(),
                "servicecidrs".into(),
                "get,list,watch".into()
            ),
        ]
    );
    let binding: ClusterRoleBinding = serde_yaml::from_value(d[1].clone()).unwrap();
    assert_eq!(binding.role_ref.name, "kube-nlproxy");
    let sa: ServiceAccount = serde_yaml::from_str(&deploy("serviceaccount.yaml")).unwrap();
    assert_eq!(binding.subjects.unwrap()[0].name, sa.metadata.name.unwrap());
}

#[test]
fn daemonset_is_a_drop_in_for_kubeadms_kube_proxy() {
    let ds: DaemonSet = serde_yaml::from_str(&deploy("daemonset.yaml")).unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(
        pod.node_selector
            .unwrap()
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
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
    assert_eq!(ready.path.as_deref(), Some("/healthz"));
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
        for d in serde_yaml::Deserializer::from_str(&std::fs::read_to_string(&p).unwrap()) {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
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

/// The ConfigMap for clusters without kubeadm: kubeadm's two keys, a config we accept with
/// no warning, a kubeconfig with the service-account token file.
#[test]
fn configmap_without_kubeadm_holds_a_config_we_accept() {
    let cm: ConfigMap =
        serde_yaml::from_str(&deploy("without-kubeadm/kube-proxy-configmap.yaml")).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("kube-proxy"));
    let data = cm.data.unwrap();
    let text = data["config.conf"].clone();
    assert!(data["kubeconfig.conf"]
        .contains("tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"));
    let p = std::env::temp_dir().join(format!("nlp-deploy-{}.yaml", std::process::id()));
    std::fs::write(&p, text).unwrap();
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
    std::fs::remove_file(p).unwrap();
}

#[test]
fn image_final_stage_has_no_shell_and_answers_to_kube_proxy() {
    let df = deploy("Dockerfile");
    let stages: Vec<&str> = df.split("\nFROM ").collect();
    let last = stages.last().unwrap();
    assert!(last.starts_with("gcr.io/distroless/"), "{last}");
    assert!(!last.contains("\nRUN "), "no RUN in the final stage");
    assert!(last.contains("ENTRYPOINT [\"/kube-nlproxy\"]"));
    assert!(df.contains("ln -s /kube-nlproxy /out/usr/local/bin/kube-proxy"));
    assert!(df.contains("--profile image"));
    let ignore =
        std::fs::read_to_string(format!("{}/../.dockerignore", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    assert!(ignore.lines().any(|l| l == "target"));
}
