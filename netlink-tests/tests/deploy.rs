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
fn daemonset_runs_with_net_admin_only() {
    let ds: DaemonSet = serde_yaml::from_str(&deploy("daemonset.yaml")).unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert!(pod
        .tolerations
        .unwrap()
        .iter()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));
    let c = &pod.containers[0];
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.add.unwrap(), vec!["NET_ADMIN".to_string()]);
    assert_eq!(caps.drop.unwrap(), vec!["ALL".to_string()]);
    let live = c.liveness_probe.clone().unwrap().http_get.unwrap();
    assert_eq!(live.path.as_deref(), Some("/livez"));
    let ready = c.readiness_probe.clone().unwrap().http_get.unwrap();
    assert_eq!(ready.path.as_deref(), Some("/healthz"));
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
    let args = c.args.clone().unwrap();
    assert!(args.contains(&"--hostname-override=$(NODE_NAME)".to_string()));
    assert!(
        args.iter().any(|a| a.starts_with("--master=")),
        "an explicit API server address"
    );
}

#[test]
fn configmap_holds_a_config_we_accept() {
    let cm: ConfigMap = serde_yaml::from_str(&deploy("configmap.yaml")).unwrap();
    let text = cm.data.unwrap()["config.yaml"].clone();
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
    std::fs::remove_file(p).unwrap();
}

#[test]
fn image_final_stage_has_no_shell() {
    let df = deploy("Dockerfile");
    let stages: Vec<&str> = df.split("\nFROM ").collect();
    let last = stages.last().unwrap();
    assert!(last.starts_with("gcr.io/distroless/"), "{last}");
    assert!(!last.contains("\nRUN "), "no RUN in the final stage");
    assert!(last.contains("ENTRYPOINT [\"/kube-nlproxy\"]"));
}
