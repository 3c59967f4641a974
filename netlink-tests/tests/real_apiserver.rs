//! Against a real kube-apiserver and etcd (v1.37.2 and v3.6.14, built from their Go modules;
//! `netlink-tests/src/controlplane.rs`): the proxy runs with exactly `deploy/`'s RBAC, through
//! the ServiceAccount token an operator's DaemonSet would get, and real packets follow the
//! objects the test creates through the API (the apiserver validates them; there is no
//! controller manager, so the test writes the EndpointSlices).
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, PostParams};
use kube_nlproxy::source::fixtures::{endpoint_slice, slice_endpoint, SliceEndpoint};

use netlink_tests::backend::{tcp_probe, tcp_probes, Reply};
use netlink_tests::cluster::{sa, NODE_IP};
use netlink_tests::controlplane::ControlPlane;
use netlink_tests::ns::require_root;
use netlink_tests::scenario::{self, names, Backends, LOCAL_EP, REMOTE_EP};

use netlink_tests::controlplane::deploy_file as deploy;

/// The slice of `web` (port `http` 8080), managed by the tests, from the shared builder.
fn slice(eps: &[SliceEndpoint]) -> EndpointSlice {
    endpoint_slice("default", "web", "web-1")
        .label(
            "endpointslice.kubernetes.io/managed-by",
            "kube-nlproxy-tests",
        )
        .port("http", 8080)
        .endpoints(eps.iter().cloned())
        .build()
}

/// Creates `deploy/`'s ServiceAccount and RBAC, this node's Node (with `labels`), the
/// Service `web` from `service_spec` (validated by the apiserver) and its slice; returns a
/// token of the ServiceAccount, as the kubelet would project it.
fn setup(
    c: &netlink_tests::cluster::Cluster,
    cp: &ControlPlane,
    labels: serde_json::Value,
    service_spec: serde_json::Value,
    web_slice: EndpointSlice,
) -> String {
    cp.with_admin(&c.node, move |client| {
        Box::pin(async move {
            let pp = PostParams::default();
            let sa: ServiceAccount =
                serde_saphyr::from_str(&deploy("serviceaccount.yaml")).unwrap();
            Api::<ServiceAccount>::namespaced(client.clone(), "kube-system")
                .create(&pp, &sa)
                .await
                .unwrap();
            let rbac = deploy("rbac.yaml");
            let mut docs = rbac.split("\n---\n");
            let role: ClusterRole = serde_saphyr::from_str(docs.next().unwrap()).unwrap();
            let binding: ClusterRoleBinding = serde_saphyr::from_str(docs.next().unwrap()).unwrap();
            Api::<ClusterRole>::all(client.clone())
                .create(&pp, &role)
                .await
                .unwrap();
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&pp, &binding)
                .await
                .unwrap();
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node1", "labels": labels},
                "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
            }))
            .unwrap();
            Api::<Node>::all(client.clone())
                .create(&pp, &node)
                .await
                .unwrap();
            let svc: Service = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": service_spec,
            }))
            .unwrap();
            Api::<Service>::namespaced(client.clone(), "default")
                .create(&pp, &svc)
                .await
                .unwrap();
            Api::<EndpointSlice>::namespaced(client.clone(), "default")
                .create(&pp, &web_slice)
                .await
                .unwrap();
            let tr = TokenRequest {
                spec: Some(TokenRequestSpec {
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                ..Default::default()
            };
            Api::<ServiceAccount>::namespaced(client, "kube-system")
                .create_token_request("kube-nlproxy", &pp, &tr)
                .await
                .unwrap()
                .status
                .and_then(|s| s.token)
                .expect("the TokenRequest's status holds a token")
        })
    })
}

#[test]
fn a_real_apiserver_drives_the_proxy_with_deploys_rbac() {
    require_root();
    let c = scenario::web_cluster(Backends::default());
    let mut cp = ControlPlane::start(&c.node);
    // The Service's ClusterIP and NodePort are chosen by the test, validated by the server.
    let token = setup(
        &c,
        &cp,
        serde_json::json!({"kubernetes.io/os": "linux"}),
        serde_json::json!({"type": "NodePort", "clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
        slice(&[
            slice_endpoint(LOCAL_EP).node("node1"),
            slice_endpoint(REMOTE_EP).node("node2"),
        ]),
    );
    let kc = cp.kubeconfig(&token, "kube-nlproxy");
    let t0 = Instant::now();
    let d = c.start_daemon_with(&["--kubeconfig", kc.to_str().unwrap()]);
    let first_sync = t0.elapsed();
    let log = d.log_text();
    // (Not "403": klog's microseconds contain it by chance; a denial always says forbidden.)
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "deploy/'s RBAC is enough:\n{log}"
    );
    // Real packets: both endpoints from a pod; the NodePort from outside.
    assert_eq!(
        names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 20)),
        ["local", "remote"].map(String::from).into(),
        "{}",
        d.log_text()
    );
    assert_eq!(
        names(&tcp_probes(&c.ext, sa(NODE_IP, 30080), 20)),
        ["local", "remote"].map(String::from).into()
    );
    // The real server's default ServiceCIDR (10.96.0.0/16, from --service-cluster-ip-range):
    // an unallocated address in it is dropped, an unused port of a ClusterIP refused.
    assert_eq!(
        tcp_probe(&c.pods[1], sa("10.96.0.99", 80)),
        Reply::Timeout,
        "unallocated service IP dropped\n{}",
        c.ruleset("ip")
    );
    assert_eq!(tcp_probe(&c.pods[1], sa("10.96.0.10", 81)), Reply::Refused);
    // An EndpointSlice change through the API reaches the kernel (bounded generously).
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let api = Api::<EndpointSlice>::namespaced(client, "default");
            let mut s = api.get("web-1").await.unwrap();
            s.endpoints = slice(&[slice_endpoint(LOCAL_EP).node("node1")]).endpoints;
            api.replace("web-1", &PostParams::default(), &s)
                .await
                .unwrap();
        })
    });
    let t1 = Instant::now();
    loop {
        let got = names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 6));
        if got == ["local".to_string()].into() {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(10),
            "{got:?}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let change = t1.elapsed();
    // The events the proxy wrote were accepted by the real server, with upstream's fields.
    let events = cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let t0 = Instant::now();
            loop {
                let l = Api::<Event>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .unwrap();
                if l.items
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("Starting"))
                    || t0.elapsed() > Duration::from_secs(10)
                {
                    break l.items;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    let starting = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Starting"))
        .unwrap_or_else(|| panic!("no Starting event: {events:?}\n{}", d.log_text()));
    assert_eq!(starting.reporting_controller.as_deref(), Some("kube-proxy"));
    assert_eq!(starting.action.as_deref(), Some("StartKubeProxy"));
    assert_eq!(
        starting.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("node1")
    );
    // An object the proxy cannot fully use is one warning line and one Event on that object:
    // a slice without its Service's label (the API server accepts it; the proxy skips it).
    let orphan = cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let mut s = slice(&[slice_endpoint(LOCAL_EP).node("node1")]);
            s.metadata.name = Some("orphan".into());
            s.metadata.labels = None;
            Api::<EndpointSlice>::namespaced(client.clone(), "default")
                .create(&PostParams::default(), &s)
                .await
                .unwrap();
            let t0 = Instant::now();
            loop {
                let l = Api::<Event>::namespaced(client.clone(), "default")
                    .list(&ListParams::default())
                    .await
                    .unwrap();
                let found = l.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("ObjectNotFullyUsable")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orphan")
                });
                if found.is_some() || t0.elapsed() > Duration::from_secs(10) {
                    break found;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    });
    let orphan =
        orphan.unwrap_or_else(|| panic!("no event for the orphan slice\n{}", d.log_text()));
    assert_eq!(
        orphan.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("EndpointSlice")
    );
    assert_eq!(orphan.type_.as_deref(), Some("Warning"));
    assert!(
        orphan
            .note
            .as_deref()
            .unwrap_or("")
            .contains("kubernetes.io/service-name"),
        "{orphan:?}"
    );
    assert!(
        d.log_text().contains("endpointSlice=\"default/orphan\""),
        "{}",
        d.log_text()
    );
    eprintln!("real apiserver: first sync {first_sync:?} after start, slice change in {change:?}");
    // The API server goes away: the rules stay. Meanwhile etcd's history is compacted past
    // every resourceVersion the proxy has seen, so that its resumed watches get 410 Gone
    // from the restarted server and relist; nothing is flushed, and a change made then
    // reaches the kernel.
    cp.stop_apiserver();
    let rev = cp.compact_etcd(&c.node, 20);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 4)),
        ["local".to_string()].into(),
        "rules stay during the outage\n{}",
        d.log_text()
    );
    cp.start_apiserver();
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let api = Api::<EndpointSlice>::namespaced(client, "default");
            let mut s = api.get("web-1").await.unwrap();
            s.endpoints = slice(&[
                slice_endpoint(LOCAL_EP).node("node1"),
                slice_endpoint(REMOTE_EP).node("node2"),
            ])
            .endpoints;
            api.replace("web-1", &PostParams::default(), &s)
                .await
                .unwrap();
        })
    });
    let t2 = Instant::now();
    loop {
        let got = names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 10));
        if got == ["local", "remote"].map(String::from).into() {
            break;
        }
        assert!(
            t2.elapsed() < Duration::from_secs(30),
            "{got:?}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The Service deleted through the API: its address is unallocated again, so dropped.
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            Api::<Service>::namespaced(client, "default")
                .delete("web", &Default::default())
                .await
                .unwrap();
        })
    });
    let t3 = Instant::now();
    while c.ruleset("ip").contains("default/web") {
        assert!(
            // generous: after the restart each watcher reconnects on its own backoff
            t3.elapsed() < Duration::from_secs(40),
            "web never removed:\n{}\napiserver:\n{}",
            d.log_text(),
            cp.log("apiserver.log")
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "real apiserver: Service deletion in the kernel after {:?} (etcd compacted at {rev})",
        t3.elapsed()
    );
    let log = d.log_text();
    assert!(
        log.contains("HTTP 410, reason Expired"),
        "the resumed watches were told their resourceVersion is gone:\n{log}"
    );
    check_audit(&cp, &log);
    assert_eq!(tcp_probe(&c.pods[1], sa("10.96.0.10", 80)), Reply::Timeout);
    assert!(!d.log_text().contains("sync failed"), "{}", d.log_text());
    // The apiserver's own `kubernetes` Service is programmed too.
    assert!(
        c.ruleset("ip").contains("10.96.0.1 "),
        "{}",
        c.ruleset("ip")
    );
}

/// What the apiserver's audit log says the proxy's ServiceAccount did: only what
/// `deploy/rbac.yaml` grants, nothing denied for good, its lists streamed (`sendInitialEvents`, as
/// client-go does by default since 1.35) and streamed again after the 410.
fn check_audit(cp: &ControlPlane, log: &str) {
    let events = cp.audit_events("system:serviceaccount:kube-system:kube-nlproxy");
    assert!(!events.is_empty(), "no audit events of the proxy");
    let role: ClusterRole =
        serde_saphyr::from_str(deploy("rbac.yaml").split("\n---\n").next().unwrap()).unwrap();
    let granted = |group: &str, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    let mut used = std::collections::BTreeSet::new();
    for (i, e) in events.iter().enumerate() {
        let (group, resource, verb) = (
            e["objectRef"]["apiGroup"].as_str().unwrap_or(""),
            e["objectRef"]["resource"].as_str().unwrap_or(""),
            e["verb"].as_str().unwrap_or(""),
        );
        // A freshly restarted apiserver can answer 403 for a moment while its RBAC caches
        // fill (seen once in CI, right after the restart): the proxy retries, and the
        // same request must then succeed. A lasting denial is a missing rule.
        if e["responseStatus"]["code"] == 403 {
            let later_ok = events[i + 1..].iter().any(|l| {
                l["objectRef"]["resource"] == resource
                    && l["verb"] == verb
                    && l["responseStatus"]["code"] == 200
            });
            assert!(later_ok, "denied and never allowed after: {e}\n{log}");
        }
        assert!(
            granted(group, resource, verb),
            "{verb} {group}/{resource} is not in deploy/rbac.yaml: {e}"
        );
        used.insert(format!("{verb} {resource}"));
    }
    for want in [
        "watch services",
        "watch endpointslices",
        "watch nodes",
        "watch servicecidrs",
        "create events",
    ] {
        assert!(used.contains(want), "{want} missing from {used:?}");
    }
    assert!(
        !used.iter().any(|u| u.starts_with("list ")),
        "lists are streamed, never LIST requests: {used:?}"
    );
    let streamed = |resource: &str| {
        events
            .iter()
            .filter(|e| {
                e["objectRef"]["resource"] == resource
                    && e["stage"] == "ResponseStarted"
                    && e["requestURI"]
                        .as_str()
                        .is_some_and(|u| u.contains("sendInitialEvents=true"))
            })
            .count()
    };
    eprintln!(
        "real apiserver: the proxy's requests {used:?}; streaming lists of services {}, endpointslices {}",
        streamed("services"),
        streamed("endpointslices")
    );
    assert!(
        streamed("services") >= 2 && streamed("endpointslices") >= 2,
        "the first lists and the relists after the 410 are streaming lists: services {}, endpointslices {}",
        streamed("services"),
        streamed("endpointslices")
    );
}

/// Node objects through the real API: the Node's zone label decides which endpoints
/// topology hints select, and a label change made through the API re-routes at once; the
/// Node deleted, the proxy keeps serving with what it has.
#[test]
fn node_updates_through_the_real_api_reach_the_kernel() {
    require_root();
    let c = scenario::web_cluster(Backends::default());
    let cp = ControlPlane::start(&c.node);
    // Topology hints: the local endpoint for zone-a, the remote one for zone-b.
    let hinted = slice(&[
        slice_endpoint(LOCAL_EP).node("node1").zone_hint("zone-a"),
        slice_endpoint(REMOTE_EP).node("node2").zone_hint("zone-b"),
    ]);
    let token = setup(
        &c,
        &cp,
        serde_json::json!({"topology.kubernetes.io/zone": "zone-a"}),
        serde_json::json!({"clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
        hinted,
    );
    let kc = cp.kubeconfig(&token, "kube-nlproxy");
    let d = c.start_daemon_with(&["--kubeconfig", kc.to_str().unwrap()]);
    let answered = |want: &[&str]| {
        let want: std::collections::BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        let t0 = Instant::now();
        loop {
            let got = names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 8));
            if got == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{got:?} != {want:?}\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    answered(&["local"]);
    // The Node moves to zone-b through the API: the remote endpoint takes over.
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let api = Api::<Node>::all(client);
            let mut n = api.get("node1").await.unwrap();
            n.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("topology.kubernetes.io/zone".into(), "zone-b".into());
            api.replace("node1", &PostParams::default(), &n)
                .await
                .unwrap();
        })
    });
    answered(&["remote"]);
    // The Node deleted: the proxy exits with code 1 as upstream's NodeManager does (the
    // DaemonSet restarts it), leaving its rules in place.
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            Api::<Node>::all(client)
                .delete("node1", &Default::default())
                .await
                .unwrap();
        })
    });
    let mut d = d;
    let st = netlink_tests::bounded::wait_within(
        &mut d.child,
        Duration::from_secs(15),
        "the proxy after its Node was deleted",
    );
    assert_eq!(st.code(), Some(1), "{}", d.log_text());
    assert!(
        d.log_text().contains("Node is being deleted"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        names(&tcp_probes(&c.pods[1], sa("10.96.0.10", 80), 6)),
        ["remote".to_string()].into(),
        "the rules stay after the exit"
    );
}

/// An operator's ClusterRole without the EndpointSlice rule: the proxy names the denied verb
/// and resource in one line and programs nothing (it never has a complete state, as
/// upstream's informers never sync), instead of programming Services without endpoints.
#[test]
fn a_missing_rbac_rule_is_named_and_nothing_is_programmed() {
    require_root();
    let c = scenario::web_cluster(Backends::default());
    let cp = ControlPlane::start(&c.node);
    let token = setup(
        &c,
        &cp,
        serde_json::json!({}),
        serde_json::json!({"clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
        slice(&[slice_endpoint(LOCAL_EP).node("node1")]),
    );
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            let api = Api::<ClusterRole>::all(client);
            let mut role = api.get("kube-nlproxy").await.unwrap();
            if let Some(rules) = role.rules.as_mut() {
                rules.retain(|r| !r.resources.iter().flatten().any(|x| x == "endpointslices"));
            }
            api.replace("kube-nlproxy", &PostParams::default(), &role)
                .await
                .unwrap();
        })
    });
    let kc = cp.kubeconfig(&token, "kube-nlproxy");
    let d = c.spawn_daemon_with(&["--kubeconfig", kc.to_str().unwrap()]);
    // The message is quoted as klog's InfoS quotes it: inner quotes escaped.
    d.wait_for_log(r#"cannot watch resource \"endpointslices\""#, 1);
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("\"watch failed; retrying") && l.contains("endpointslices"))
        .unwrap_or_else(|| panic!("no line of ours names endpointslices:\n{log}"));
    assert!(
        line.contains("HTTP 403, reason Forbidden")
            && line.contains("system:serviceaccount:kube-system:kube-nlproxy"),
        "{line}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let log = d.log_text();
    assert!(!log.contains("synced"), "{log}");
    assert!(
        !c.node.sh("nft list tables").contains("kube-nlproxy"),
        "nothing programmed"
    );
}

/// `explain --from NAMESPACE/POD` finds the pod's address in the EndpointSlices, with the
/// proxy's own ServiceAccount token (its RBAC lists EndpointSlices; it has no Pod access).
#[test]
fn explain_finds_a_pod_by_name_with_the_proxys_own_token() {
    require_root();
    let c = scenario::web_cluster(Backends::default());
    let cp = ControlPlane::start(&c.node);
    let mut web = slice(&[
        slice_endpoint(LOCAL_EP).node("node1"),
        slice_endpoint(REMOTE_EP).node("node2"),
    ]);
    web.endpoints.as_mut().expect("two endpoints")[0].target_ref =
        Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some("web-local".into()),
            ..Default::default()
        });
    let token = setup(
        &c,
        &cp,
        serde_json::json!({}),
        serde_json::json!({"type": "ClusterIP", "clusterIP": "10.96.0.10",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
        web,
    );
    let kc = cp.kubeconfig(&token, "kube-nlproxy");
    let kc = kc.to_str().unwrap();
    let d = c.start_daemon_with(&["--kubeconfig", kc]);
    let r = netlink_tests::differential::explain_json(
        &c.node,
        &[
            "--from",
            "default/web-local",
            "--kubeconfig",
            kc,
            "--to",
            "10.96.0.10:80",
        ],
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log_text()));
    assert_eq!(r["source"], format!("{LOCAL_EP}:40000"), "{r:#}");
    assert!(
        r["notes"]
            .to_string()
            .contains("Pod default/web-local is 10.244.1.2"),
        "{r:#}"
    );
    let e = netlink_tests::differential::explain_json(
        &c.node,
        &[
            "--from",
            "default/nobody",
            "--kubeconfig",
            kc,
            "--to",
            "10.96.0.10:80",
        ],
    )
    .unwrap_err();
    assert!(
        e.contains(
            "--from default/nobody: no IPv4 EndpointSlice in namespace default lists Pod nobody"
        ),
        "{e}"
    );
}

/// Protobuf, as upstream kube-proxy asks for it (issue #54), against the real API server:
/// the server answers lists and watches in protobuf when asked, and our watcher (streaming
/// list and paged list, protobuf and JSON asked for) yields the same objects, field for
/// field in what it carries over, as kube-rs's JSON list, for every kind the proxy watches: Services of
/// every type with every field a proxy reads (status included), EndpointSlices of both
/// families with conditions, hints and target references, a Node with its pod CIDRs and
/// addresses, the default ServiceCIDR. A change after the list arrives as a protobuf watch
/// event.
#[test]
fn protobuf_and_json_watchers_decode_the_same_objects() {
    use kube_nlproxy::source::kube::protobuf::{self, wire::PROTOBUF, Accept};
    require_root();
    let c = scenario::web_cluster(Backends::default());
    let cp = ControlPlane::start(&c.node);
    cp.with_admin(&c.node, |client| {
        Box::pin(async move {
            create_every_shape(&client).await;
            // The server's own answer, read raw: protobuf for lists and watches.
            for (path, want) in [
                ("/api/v1/services", PROTOBUF.to_string()),
                (
                    "/apis/discovery.k8s.io/v1/endpointslices?watch=true&timeoutSeconds=1",
                    format!("{PROTOBUF};stream=watch"),
                ),
            ] {
                let req = http::Request::get(path)
                    .header(http::header::ACCEPT, PROTOBUF)
                    .body(kube::client::Body::empty())
                    .unwrap();
                let res = client.send(req).await.unwrap();
                let ct = res.headers()[http::header::CONTENT_TYPE].to_str().unwrap();
                assert_eq!(ct, want, "{path}");
            }
            // Protobuf alone (no JSON to fall back on), and JSON as asked for with
            // `--kube-api-content-type application/json`: both through our watcher.
            for (only_protobuf, streaming) in [
                (Accept(PROTOBUF.to_string()), true),
                (Accept(PROTOBUF.to_string()), false),
                (Accept::new("application/json", ""), true),
                (Accept::new("application/json", ""), false),
            ] {
                let pb =
                    |cfg| protobuf::watcher(client.clone(), only_protobuf.clone(), cfg, streaming);
                same(
                    "Services",
                    json_list::<Service>(&client).await,
                    initial(pb(Default::default())).await,
                    normal_service,
                );
                same(
                    "EndpointSlices",
                    json_list::<EndpointSlice>(&client).await,
                    initial(protobuf::watcher(
                        client.clone(),
                        only_protobuf.clone(),
                        Default::default(),
                        streaming,
                    ))
                    .await,
                    |s| s,
                );
                same(
                    "Nodes",
                    json_list::<Node>(&client).await,
                    initial(protobuf::watcher(
                        client.clone(),
                        only_protobuf.clone(),
                        Default::default(),
                        streaming,
                    ))
                    .await,
                    normal_node,
                );
                use k8s_openapi::api::networking::v1::ServiceCIDR;
                let cidrs = json_list::<ServiceCIDR>(&client).await;
                assert!(!cidrs.is_empty(), "the API server's default ServiceCIDR");
                same(
                    "ServiceCIDRs",
                    cidrs,
                    initial(protobuf::watcher(
                        client.clone(),
                        only_protobuf.clone(),
                        Default::default(),
                        streaming,
                    ))
                    .await,
                    |mut c: ServiceCIDR| {
                        c.status = None;
                        c
                    },
                );
            }
            // A change after the list: a protobuf watch event.
            let only_protobuf = Accept(PROTOBUF.to_string());
            let mut watch = protobuf::watcher::<Service>(
                client.clone(),
                only_protobuf.clone(),
                Default::default(),
                false,
            );
            while !matches!(
                tokio::time::timeout(Duration::from_secs(30), watch.next()).await,
                Ok(Some(Ok(kube::runtime::watcher::Event::InitDone)))
            ) {}
            let api = Api::<Service>::namespaced(client.clone(), "default");
            let mut s = api.get("affinity").await.unwrap();
            s.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert("moved".into(), "yes".into());
            api.replace("affinity", &PostParams::default(), &s)
                .await
                .unwrap();
            loop {
                let e = tokio::time::timeout(Duration::from_secs(30), watch.next())
                    .await
                    .expect("the change within 30 s")
                    .expect("the watch goes on")
                    .expect("no error");
                if let kube::runtime::watcher::Event::Apply(o) = e {
                    let o = o.decoded().expect("decodes");
                    if o.metadata.name.as_deref() == Some("affinity") {
                        assert_eq!(o.metadata.labels.unwrap()["moved"], "yes");
                        break;
                    }
                }
            }
        })
    });
}

use futures::StreamExt as _;
use kube_nlproxy::source::kube::Lenient;

/// Every object of `K` through kube-rs's JSON list.
async fn json_list<K>(client: &kube::Client) -> Vec<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut v = Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    v.sort_by_key(|o| (o.meta().namespace.clone(), o.meta().name.clone()));
    v
}

/// The objects of a watcher's initial list, sorted, each decoded.
async fn initial<K: kube::Resource + std::fmt::Debug>(
    mut s: futures::stream::BoxStream<
        'static,
        kube::runtime::watcher::Result<kube::runtime::watcher::Event<Lenient<K>>>,
    >,
) -> Vec<K> {
    use kube::runtime::watcher::Event;
    let mut out = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), s.next())
            .await
            .expect("the list within 30 s")
            .expect("the watcher goes on")
            .unwrap_or_else(|e| panic!("{e}"));
        match e {
            Event::InitApply(o) => out.push(o.decoded().unwrap_or_else(|e| panic!("{e}"))),
            Event::InitDone => break,
            _ => {}
        }
    }
    out.sort_by_key(|o: &K| (o.meta().namespace.clone(), o.meta().name.clone()));
    out
}

/// kube-rs's JSON objects equal our watcher's, both reduced to what the protobuf path
/// carries.
fn same<K: PartialEq + std::fmt::Debug + kube::Resource>(
    kind: &str,
    json: Vec<K>,
    pb: Vec<K>,
    normal: impl Fn(K) -> K,
) {
    let strip = |mut o: K| {
        o.meta_mut().managed_fields = None;
        normal(o)
    };
    let json: Vec<K> = json.into_iter().map(&strip).collect();
    // Our watcher's objects reduced the same way: JSON answers carry everything.
    let pb: Vec<K> = pb.into_iter().map(&strip).collect();
    assert!(!json.is_empty(), "{kind}: objects to compare");
    assert_eq!(json.len(), pb.len(), "{kind}");
    for (j, p) in json.iter().zip(&pb) {
        assert_eq!(j, p, "{kind}");
    }
}

fn normal_service(mut s: Service) -> Service {
    if let Some(st) = s.status.as_mut() {
        st.conditions = None;
    }
    s
}

fn normal_node(n: Node) -> Node {
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    Node {
        metadata: n.metadata,
        spec: n.spec.map(|s| NodeSpec {
            pod_cidr: s.pod_cidr,
            pod_cidrs: s.pod_cidrs,
            provider_id: s.provider_id,
            unschedulable: s.unschedulable,
            ..Default::default()
        }),
        status: n.status.map(|s| NodeStatus {
            addresses: s.addresses,
            ..Default::default()
        }),
    }
}

/// Services of every type with every field a proxy reads, slices of both families, a
/// Node with pod CIDRs and addresses.
async fn create_every_shape(client: &kube::Client) {
    let pp = PostParams::default();
    let services = Api::<Service>::namespaced(client.clone(), "default");
    for spec in [
        serde_json::json!({"metadata": {"name": "affinity", "labels": {"app": "a"},
            "annotations": {"note": "x"}},
          "spec": {"type": "ClusterIP", "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
            "internalTrafficPolicy": "Local", "trafficDistribution": "PreferClose",
            "ports": [{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP",
                       "appProtocol": "http"},
                      {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}}),
        serde_json::json!({"metadata": {"name": "lb"},
          "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "allocateLoadBalancerNodePorts": true, "loadBalancerSourceRanges": ["10.0.0.0/8"],
            "externalIPs": ["192.0.2.10"], "publishNotReadyAddresses": true,
            "ports": [{"name": "https", "port": 443, "targetPort": 8443, "nodePort": 30443,
                       "protocol": "TCP"}]}}),
        serde_json::json!({"metadata": {"name": "headless"},
          "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}),
        serde_json::json!({"metadata": {"name": "external"},
          "spec": {"type": "ExternalName", "externalName": "example.com"}}),
    ] {
        let s: Service = serde_json::from_value(spec).unwrap();
        services.create(&pp, &s).await.unwrap();
    }
    let mut lb = services.get_status("lb").await.unwrap();
    lb.status = serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": [
        {"ip": "203.0.113.7", "ipMode": "Proxy",
         "ports": [{"port": 443, "protocol": "TCP", "error": "Pending"}]},
        {"hostname": "lb.example.com"}]}}))
    .unwrap();
    services.replace_status("lb", &pp, &lb).await.unwrap();
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), "default");
    for spec in [
        serde_json::json!({"metadata": {"name": "affinity-v4",
            "labels": {"kubernetes.io/service-name": "affinity"}},
          "addressType": "IPv4",
          "endpoints": [
            {"addresses": ["10.244.1.2"], "nodeName": "node1", "zone": "zone-a",
             "hostname": "web-0",
             "conditions": {"ready": true, "serving": true, "terminating": false},
             "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node1"}]},
             "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-0",
                           "uid": "0b6d1d0a-0000-4000-8000-000000000001"}},
            {"addresses": ["10.244.2.2"], "nodeName": "node2",
             "conditions": {"ready": false, "serving": true, "terminating": true}}],
          "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                    {"name": "dns", "port": 5353, "protocol": "UDP"}]}),
        serde_json::json!({"metadata": {"name": "affinity-v6",
            "labels": {"kubernetes.io/service-name": "affinity"}},
          "addressType": "IPv6",
          "endpoints": [{"addresses": ["fd00:10:244::5"]}],
          "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
        serde_json::json!({"metadata": {"name": "empty",
            "labels": {"kubernetes.io/service-name": "lb"}},
          "addressType": "IPv4", "endpoints": []}),
    ] {
        let s: EndpointSlice = serde_json::from_value(spec).unwrap();
        slices.create(&pp, &s).await.unwrap();
    }
    let nodes = Api::<Node>::all(client.clone());
    let n: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "proto-node", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24", "fd00:7::/64"],
                 "providerID": "test://proto-node", "unschedulable": true}}))
    .unwrap();
    nodes.create(&pp, &n).await.unwrap();
    let mut n = nodes.get_status("proto-node").await.unwrap();
    n.status = serde_json::from_value(serde_json::json!({"addresses": [
        {"type": "InternalIP", "address": "192.168.7.7"},
        {"type": "Hostname", "address": "proto-node"}]}))
    .unwrap();
    nodes.replace_status("proto-node", &pp, &n).await.unwrap();
}
