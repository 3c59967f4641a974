//! kube-nlproxy run the way users run it: three real nodes (kubelet, containerd, bridge CNI,
//! each in its own namespaces, `netlink-tests/src/realnode`), `deploy/` applied through the
//! real API server as README says, the image `cargo xtask image` built imported into each
//! node's runtime, and upstream's e2e suite judging the result.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use netlink_tests::realnode::{self, e2e, Cluster};

fn require_root() {
    assert!(
        netlink_tests::ns::is_root(),
        "the real-node tests need root (they create namespaces, cgroups and mounts)"
    );
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
        newest = newest.max(std::fs::metadata(root.join(f)).and_then(|m| m.modified()).ok());
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

/// `kubectl apply -k` of the repository's kustomization: `deploy/` exactly as shipped.
fn apply_deploy_as_shipped(c: &Cluster) {
    let root = realnode::workspace_root();
    c.kubectl_ok(&["apply", "-k", root.to_str().unwrap()]);
}

fn wait_proxy_pods_ready(c: &Cluster, selector: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    c.wait_for(limit, &format!("proxy pods ({selector}) Ready"), |c| {
        c.pods_ready("kube-system", selector, c.nodes.len())
    });
    t0.elapsed()
}

#[test]
fn deploy_as_shipped_runs_on_real_nodes() {
    require_root();
    let (image, reference) = our_image();
    let c = Cluster::start(3, &[image]);
    c.apply(&c.kubeadm_proxy_configmap(""));
    apply_deploy_as_shipped(&c);
    let took = wait_proxy_pods_ready(&c, "k8s-app=kube-nlproxy", Duration::from_secs(120));
    eprintln!("kube-nlproxy pods Running and Ready on 3 nodes {took:?} after apply");
    let images = c.kubectl_ok(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "k8s-app=kube-nlproxy",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].image} {.spec.containers[0].imagePullPolicy}{\"\\n\"}{end}",
    ]);
    for l in images.lines() {
        assert_eq!(l, format!("{reference} IfNotPresent"));
    }
    c.install_coredns(Duration::from_secs(180));
    let log = c.dir.join("e2e-conformance.log");
    let report = e2e::run(
        &c,
        r"\[sig-network\] Services .*\[Conformance\]",
        r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]",
        Duration::from_secs(1200),
        &log,
    );
    eprintln!("{}", report.render());
    let failed: Vec<_> = report.failed().collect();
    assert!(failed.is_empty(), "e2e failures: {failed:#?}\n{}", e2e::tail(&log, 80));
    assert!(report.passed().count() >= 15, "{}", report.render());
}
