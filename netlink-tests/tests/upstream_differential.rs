//! Upstream kube-proxy as the oracle for the data path. Two identical namespace clusters
//! (same addresses, same backends) share one real kube-apiserver: ours runs on the first
//! node, upstream's own kube-proxy (v1.37.2, built from its Go module; it execs Debian's
//! `nft` or `iptables`) on the twin, both as `node1`. One flow table
//! (`netlink_tests::differential::FLOWS`) goes through both, and for each flow the outcome
//! must be the same: which endpoints answer, which source address they saw, refused or
//! dropped. A mismatch fails the test unless docs/features.md's "Deviations from upstream" explains it
//! and the flow is listed with it here.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams, PostParams};

use netlink_tests::controlplane::ControlPlane;
use netlink_tests::differential::{
    check_flows, objects, twins, Flow, Upstream, LOCALHOST_FLOWS, TWIN_A,
};
use netlink_tests::ns::{require_root, NetNs};

/// The flow table's objects, created through the API as a user would.
fn create_objects(cp: &ControlPlane, ns: &NetNs) {
    cp.with_admin(ns, |client| {
        Box::pin(async move {
            let pp = PostParams::default();
            for mut o in objects() {
                let kind = o["kind"].as_str().unwrap().to_owned();
                let name = o["metadata"]["name"].as_str().unwrap().to_owned();
                let status = o.as_object_mut().unwrap().remove("status");
                match kind.as_str() {
                    "Node" => {
                        let mut n: Node = serde_json::from_value(o).unwrap();
                        n.status = status.map(|s| serde_json::from_value(s).unwrap());
                        Api::<Node>::all(client.clone())
                            .create(&pp, &n)
                            .await
                            .unwrap();
                    }
                    "Service" => {
                        let svcs = Api::<Service>::namespaced(client.clone(), "default");
                        let s: Service = serde_json::from_value(o).unwrap();
                        svcs.create(&pp, &s)
                            .await
                            .unwrap_or_else(|e| panic!("Service {name}: {e}"));
                        if let Some(st) = status {
                            svcs.patch_status(
                                &name,
                                &PatchParams::default(),
                                &Patch::Merge(serde_json::json!({ "status": st })),
                            )
                            .await
                            .unwrap();
                        }
                    }
                    _ => {
                        let s: EndpointSlice = serde_json::from_value(o).unwrap();
                        Api::<EndpointSlice>::namespaced(client.clone(), "default")
                            .create(&pp, &s)
                            .await
                            .unwrap_or_else(|e| panic!("EndpointSlice {name}: {e}"));
                    }
                }
            }
        })
    });
}

/// Sets `node1`'s zone label through the API.
fn relabel_node(cp: &ControlPlane, ns: &NetNs, zone: &str) {
    let patch = serde_json::json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}});
    cp.with_admin(ns, |client| {
        Box::pin(async move {
            Api::<Node>::all(client)
                .patch("node1", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap_or_else(|e| panic!("Node node1 zone label: {e}"));
        })
    });
}

/// Runs the flow table through ours (with `ours_args`) and upstream (in `upstream_mode`),
/// and compares. `deviations`: flows whose outcomes differ by design (README says why).
fn differential(ours_args: &[&str], upstream_mode: &str, deviations: &[&str]) {
    differential_with(ours_args, (upstream_mode, &[]), deviations, &[]);
}

/// [`differential`] with `both` arguments given to ours and upstream alike and `extra` flows.
fn differential_with(
    ours_args: &[&str],
    (upstream_mode, both): (&str, &[&str]),
    deviations: &[&str],
    extra: &[Flow],
) {
    require_root();
    let (ours, theirs, cp) = twins();
    create_objects(&cp, &ours.node);
    let via = cp.admin_kubeconfig_via(&format!("https://{TWIN_A}:6443"));
    let via = format!("--kubeconfig={}", via.display());
    let mut upstream_args = vec![via.as_str()];
    upstream_args.extend_from_slice(both);
    let mut upstream = Upstream::start(&theirs.node, upstream_mode, &upstream_args, &cp.dir);
    let admin = cp.admin_kubeconfig();
    let mut args = vec!["--kubeconfig", admin.to_str().unwrap()];
    args.extend_from_slice(ours_args);
    args.extend_from_slice(both);
    let d = ours.start_daemon_with(&args);
    // Both proxies read the one API server's Node: ours sees the same two label changes.
    let relabel = |zone: &str| relabel_node(&cp, &ours.node, zone);
    check_flows(
        (&ours, "ours", &|| d.log_text()),
        (&theirs, upstream_mode, &mut upstream),
        &relabel,
        &format!("ours ({ours_args:?}) vs upstream {upstream_mode} mode ({both:?})"),
        deviations,
        extra,
    );
}

#[test]
fn flows_match_upstream_nftables_mode() {
    differential(&["--proxy-mode", "nftables"], "nftables", &[]);
}

/// Upstream 1.37's alpha localhost NodePorts in nftables mode, loopback listed: TCP proxied
/// in userspace on 127.0.0.1 and ::1, UDP rejected (the flow table's "via localhost" flows).
#[test]
fn flows_match_upstream_nftables_mode_with_localhost_node_ports() {
    differential_with(
        &["--proxy-mode", "nftables"],
        (
            "nftables",
            &[
                "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
                "--nodeport-addresses=primary,localhost",
            ],
        ),
        &[],
        LOCALHOST_FLOWS,
    );
}

#[test]
fn flows_match_upstream_iptables_mode() {
    // docs/features.md, "Deviations from upstream": a ClusterIP's unused port is rejected, as upstream's
    // nftables mode does; upstream's iptables mode leaves it to routing.
    differential(
        &["--proxy-mode", "iptables"],
        "iptables",
        &["ClusterIP, unused port", "IPv6 ClusterIP, unused port"],
    );
}
