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

/// The ConfigMap for clusters without kubeadm: kubeadm's two keys, a config we accept with
/// no warning, a kubeconfig with the service-account token file.
#[test]
fn configmap_without_kubeadm_holds_a_config_we_accept() {
    let cm: ConfigMap =
        serde_saphyr::from_str(&deploy("without-kubeadm/kube-proxy-configmap.yaml")).unwrap();
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
    let k: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(format!(
            "{}/../kustomization.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
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

/// The image `cargo xtask image` wrote (README's test command builds it first): one static
/// binary and the kube-proxy link, root, named as deploy/ names it, and written again from
/// the same binary it is the same bytes.
#[test]
fn the_release_image_holds_one_static_binary_and_is_reproducible() {
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
    let mut members = std::collections::BTreeMap::new();
    for e in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).unwrap();
        members.insert(p, data);
    }
    let json = |p: &str| -> serde_json::Value { serde_json::from_slice(&members[p]).unwrap() };
    let index = json("index.json");
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        reference.as_str()
    );
    let digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest = json(&format!("blobs/sha256/{}", &digest[7..]));
    let config = json(&format!(
        "blobs/sha256/{}",
        &manifest["config"]["digest"].as_str().unwrap()[7..]
    ));
    assert_eq!(config["config"]["User"], "0:0");
    assert_eq!(config["config"]["Entrypoint"][0], "/kube-nlproxy");
    let layer = &members[&format!(
        "blobs/sha256/{}",
        &manifest["layers"][0]["digest"].as_str().unwrap()[7..]
    )];
    let mut files = Vec::new();
    let mut binary = Vec::new();
    let gz = flate2::read::GzDecoder::new(layer.as_slice());
    for e in tar::Archive::new(gz).entries().unwrap() {
        let mut e = e.unwrap();
        let h = e.header().clone();
        let p = e.path().unwrap().to_string_lossy().into_owned();
        if h.entry_type() == tar::EntryType::Regular {
            assert_eq!(h.mode().unwrap() & 0o111 != 0, p == "kube-nlproxy", "{p}");
            if p == "kube-nlproxy" {
                e.read_to_end(&mut binary).unwrap();
            }
        }
        let link = e
            .link_name()
            .unwrap()
            .map(|l| l.to_string_lossy().into_owned());
        files.push((p, h.entry_type(), link));
    }
    use tar::EntryType::*;
    assert_eq!(
        files,
        vec![
            ("kube-nlproxy".into(), Regular, None),
            ("usr/".into(), Directory, None),
            ("usr/local/".into(), Directory, None),
            ("usr/local/bin/".into(), Directory, None),
            (
                "usr/local/bin/kube-proxy".into(),
                Symlink,
                Some("/kube-nlproxy".into())
            ),
        ]
    );
    assert_eq!(
        xtask::image::elf_needs_interpreter(&binary),
        Ok(false),
        "static"
    );
    // The same binary written again: the same digest.
    let dir = std::env::temp_dir().join(format!("nlp-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kube-nlproxy"), &binary).unwrap();
    let created = config["created"].as_str().unwrap().to_string();
    let epoch = if created == "1970-01-01T00:00:00Z" {
        0
    } else {
        panic!("built with SOURCE_DATE_EPOCH set ({created}): rebuild without it to compare")
    };
    let img = xtask::image::release_image(&dir.join("kube-nlproxy"), &reference, epoch).unwrap();
    let again = xtask::oci::write_archive(&img, &dir.join("again.tar")).unwrap();
    assert_eq!(again.digest, digest);
    assert_eq!(std::fs::read(dir.join("again.tar")).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).unwrap();
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
