//! Upstream kube-proxy as the oracle for the stale-conntrack cleanup. Two identical namespace
//! clusters share one real kube-apiserver, as in `upstream_differential.rs`: ours in nftables
//! mode on the first node, upstream's own kube-proxy v1.37.2 in nftables mode on the twin,
//! both as `node1`. A dual-stack UDP NodePort Service `ct-udp` and its SCTP twin `ct-sctp` go
//! through a sequence of API changes (endpoint replaced; serving → terminating → not serving
//! → gone; no serving endpoint left; scaled to zero and back; port, targetPort and NodePort
//! changed; Service deleted). Before each change the same conntrack entries are seeded on
//! both nodes with Debian's `conntrack` CLI: to both values of the ClusterIP's port and of
//! the NodePort, answered by the current endpoint, an old one, one that never was, on either
//! targetPort, and by the destination itself (never DNATed); to an unrelated host. Each step
//! compares twice, once both proxies have synced (bounded waits on a marker Service in both
//! rulesets): the whole seeded set judged by the state as it stands, and what is left of it
//! after the change. The entries left must be the same on both nodes, except for the
//! deviations asserted here exactly, so that a change on either side is noticed:
//! docs/features.md's "a deleted UDP Service's conntrack entries" and "SCTP conntrack
//! entries", and [`Expect::Deferred`].
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_nlproxy::source::fixtures::{endpoint_slice, slice_endpoint};
use serde_json::{json, Value};

use netlink_tests::cluster::{Cluster, Daemon};
use netlink_tests::controlplane::ControlPlane;
use netlink_tests::ct_differential::{
    self as ct, keyed, seeds, Entry, Key, Listing, Svc, FAMILIES, PORTS, SCTP, TARGETS, UDP,
};
use netlink_tests::differential::{objects, twins, wait_programmed, Upstream, TWIN_A};
use netlink_tests::ns::{require_root, NetNs};
use netlink_tests::scenario::node_of;

#[derive(Debug, Clone, Copy)]
enum Cond {
    Ready,
    /// `serving: true, ready: false, terminating: true`.
    ServingTerminating,
    /// `serving: false, ready: false, terminating: true`.
    Terminating,
}

/// What the API holds for both Services (the same for each).
#[derive(Debug, Clone)]
struct Spec {
    port: u16,
    target: u16,
    /// Index into [`Svc::node_ports`].
    np: usize,
    /// (index into [`ct::Fam::eps`], condition), in both families.
    eps: Vec<(usize, Cond)>,
}

fn service(svc: &Svc, s: &Spec) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": "default"},
        "spec": {
            "type": "NodePort", "clusterIP": svc.ips[0], "clusterIPs": svc.ips,
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
            "externalTrafficPolicy": "Cluster", "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "p", "protocol": svc.proto, "port": s.port,
                       "targetPort": s.target, "nodePort": svc.node_ports[s.np]}],
        },
    })
}

/// A slice of `service`, managed by the test (no controller runs beside the API server).
fn slice(service: &str, v: u8, port: (&str, u16), eps: &[(&str, Cond)]) -> Value {
    endpoint_slice("default", service, &format!("{service}-v{v}"))
        .label(
            "endpointslice.kubernetes.io/managed-by",
            "kube-nlproxy-tests",
        )
        .address_type(if v == 4 { "IPv4" } else { "IPv6" })
        .port_with_protocol("p", port.0, port.1)
        .endpoints(eps.iter().map(|(a, c)| {
            let e = slice_endpoint(a).node(node_of(a));
            match c {
                Cond::Ready => e,
                Cond::ServingTerminating => e.not_ready().terminating(),
                Cond::Terminating => e.not_ready().not_serving().terminating(),
            }
        }))
        .json()
}

fn slices(svc: &Svc, s: &Spec) -> Vec<Value> {
    FAMILIES
        .iter()
        .map(|f| {
            let eps: Vec<(&str, Cond)> = s.eps.iter().map(|(i, c)| (f.eps[*i], *c)).collect();
            slice(svc.name, f.v, (svc.proto, s.target), &eps)
        })
        .collect()
}

/// The marker: a UDP Service whose port (`40000 + service generation`) and endpoint
/// (`10.244.3.(100 + slice generation)`, its IPv6 twin) the test moves on after each change,
/// through the same watch (Services, EndpointSlices) as the change and after it. Once a
/// proxy has programmed the marker, it has synced the change, and its cleanup of that sync
/// runs right after the commit. A moved endpoint is a UDP endpoint change, which is what
/// makes upstream run its cleanup at all ([`Expect::Deferred`]).
#[derive(Debug, Clone, Copy)]
struct Marker {
    svc_gen: u16,
    slice_gen: u8,
}

const MARK: &str = "ct-mark";

impl Marker {
    fn port(&self) -> u16 {
        40000 + self.svc_gen
    }
    fn endpoint(&self, v: u8) -> String {
        let n = 100 + u16::from(self.slice_gen);
        if v == 4 {
            format!("10.244.3.{n}")
        } else {
            format!("fd00:10:244:3::{n}")
        }
    }
    fn service(&self) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": MARK, "namespace": "default"},
            "spec": {
                "type": "ClusterIP", "clusterIP": "10.96.0.69",
                "clusterIPs": ["10.96.0.69", "fd00:96::69"],
                "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                "ports": [{"name": "p", "protocol": "UDP", "port": self.port(), "targetPort": 7}],
            },
        })
    }
    fn slices(&self) -> Vec<Value> {
        [4, 6]
            .map(|v| {
                slice(
                    MARK,
                    v,
                    ("UDP", 7),
                    &[(self.endpoint(v).as_str(), Cond::Ready)],
                )
            })
            .into()
    }
    /// Whether a ruleset dump of family `v` shows this generation of the marker.
    fn shown_in(&self, ruleset: &str, v: u8) -> bool {
        has_token(ruleset, &self.port().to_string()) && has_token(ruleset, &self.endpoint(v))
    }
}

/// Whether `token` occurs in `text` with no letter or digit right before or after it.
fn has_token(text: &str, token: &str) -> bool {
    let edge = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.match_indices(token).any(|(i, _)| {
        edge(text[..i].chars().next_back()) && edge(text[i + token.len()..].chars().next())
    })
}

/// One API write.
enum Op {
    CreateNode(Value),
    Apply(Value),
    Delete(&'static str, String),
}

/// Runs `ops` in order through the API, as the admin.
fn api(cp: &ControlPlane, ns: &NetNs, ops: Vec<Op>) {
    cp.with_admin(ns, |client| {
        Box::pin(async move {
            let svcs = Api::<Service>::namespaced(client.clone(), "default");
            let eps = Api::<EndpointSlice>::namespaced(client.clone(), "default");
            let ssa = PatchParams::apply("conntrack-differential").force();
            for op in ops {
                match op {
                    Op::CreateNode(mut o) => {
                        let status = o.as_object_mut().unwrap().remove("status");
                        let mut n: Node = serde_json::from_value(o).unwrap();
                        n.status = status.map(|s| serde_json::from_value(s).unwrap());
                        Api::<Node>::all(client.clone())
                            .create(&PostParams::default(), &n)
                            .await
                            .unwrap_or_else(|e| panic!("Node: {e}"));
                    }
                    Op::Apply(o) => {
                        let name = o["metadata"]["name"].as_str().unwrap().to_owned();
                        let res = if o["kind"] == "Service" {
                            svcs.patch(&name, &ssa, &Patch::Apply(&o)).await.map(drop)
                        } else {
                            eps.patch(&name, &ssa, &Patch::Apply(&o)).await.map(drop)
                        };
                        res.unwrap_or_else(|e| panic!("apply {} {name}: {e}", o["kind"]));
                    }
                    Op::Delete(kind, name) => {
                        let dp = DeleteParams::default();
                        let res = if kind == "Service" {
                            svcs.delete(&name, &dp).await.map(drop)
                        } else {
                            eps.delete(&name, &dp).await.map(drop)
                        };
                        res.unwrap_or_else(|e| panic!("delete {kind} {name}: {e}"));
                    }
                }
            }
        })
    });
}

/// A change to both Services.
enum Change {
    Endpoints(Vec<(usize, Cond)>),
    Port(u16),
    TargetPort(u16),
    NodePort(usize),
    Delete,
}

/// What the two sides must show after a step. For SCTP, always: upstream v1.37.2 cleans UDP
/// entries only (its SCTP entries stay as seeded), ours cleans SCTP as UDP (its SCTP entries
/// are its UDP ones) — docs/features.md, "SCTP conntrack entries".
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// The same UDP entries on both sides.
    Same,
    /// A change to the Service alone (no EndpointSlice changes): upstream v1.37.2 runs its
    /// cleanup only in a sync where some UDP Service's endpoints changed
    /// (`endpointUpdateResult.ConntrackCleanupRequired`, pkg/proxy/nftables/proxier.go:1916),
    /// ours after every successful sync. Asserted exactly: after the change upstream still
    /// has every entry it had before it, ours has cleaned some; after the next UDP endpoint
    /// change anywhere (the marker's) upstream has the entries ours had, and ours the same.
    /// Found by this test; docs/features.md's "when stale conntrack entries are cleaned".
    Deferred,
    /// The Service deleted (and its slices, as the garbage collector would): upstream
    /// v1.37.2 judges the Services that exist only, so it keeps every entry; ours deletes
    /// those to the deleted Service's ClusterIPs and port (kubernetes#141371) and leaves the
    /// rest alone — docs/features.md, "a deleted UDP Service's conntrack entries".
    Deleted,
}

struct Run<'a> {
    cp: &'a ControlPlane,
    ours: &'a Cluster,
    theirs: &'a Cluster,
    upstream: &'a mut Upstream,
    daemon: &'a mut Daemon,
    spec: Spec,
    mark: Marker,
    seeded: Listing,
    /// What went wrong, with the tables.
    failures: Vec<String>,
}

impl Run<'_> {
    /// Applies `change` to both Services and moves the marker on after it: its Service
    /// after a Service change, its slices after a slice change or when `trigger` asks for a
    /// UDP endpoint change.
    fn apply(&mut self, change: Option<&Change>, trigger: bool) {
        let mut ops = Vec::new();
        let (mut svc_changed, mut slices_changed) = (false, false);
        match change {
            Some(Change::Endpoints(eps)) => {
                self.spec.eps = eps.clone();
                slices_changed = true;
            }
            Some(Change::Port(p)) => {
                self.spec.port = *p;
                svc_changed = true;
            }
            Some(Change::TargetPort(t)) => {
                self.spec.target = *t;
                (svc_changed, slices_changed) = (true, true);
            }
            Some(Change::NodePort(i)) => {
                self.spec.np = *i;
                svc_changed = true;
            }
            Some(Change::Delete) => {
                for svc in [&UDP, &SCTP] {
                    ops.push(Op::Delete("Service", svc.name.to_string()));
                }
                for svc in [&UDP, &SCTP] {
                    for f in &FAMILIES {
                        ops.push(Op::Delete(
                            "EndpointSlice",
                            format!("{}-v{}", svc.name, f.v),
                        ));
                    }
                }
                (svc_changed, slices_changed) = (true, true);
            }
            None => {}
        }
        if !matches!(change, Some(Change::Delete)) {
            for svc in [&UDP, &SCTP] {
                if svc_changed {
                    ops.push(Op::Apply(service(svc, &self.spec)));
                }
                if slices_changed {
                    ops.extend(slices(svc, &self.spec).into_iter().map(Op::Apply));
                }
            }
        }
        if svc_changed {
            self.mark.svc_gen += 1;
            ops.push(Op::Apply(self.mark.service()));
        }
        if slices_changed || trigger {
            self.mark.slice_gen += 1;
            ops.extend(self.mark.slices().into_iter().map(Op::Apply));
        }
        api(self.cp, &self.ours.node, ops);
    }

    /// Waits (bounded) until both proxies have programmed the marker in both families,
    /// then until both conntrack listings hold still; returns them (ours, upstream).
    fn synced(&mut self) -> (Listing, Listing) {
        let mark = self.mark;
        for v in [4, 6] {
            let fam = if v == 4 { "ip" } else { "ip6" };
            let cmd = format!("nft list table {fam} kube-nlproxy");
            let t0 = Instant::now();
            loop {
                let out = self.ours.node.sh(&format!("{cmd} 2>/dev/null || true"));
                if mark.shown_in(&out, v) {
                    break;
                }
                if let Ok(Some(st)) = self.daemon.child.try_wait() {
                    panic!("ours exited ({st}):\n{}", self.daemon.log_text());
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "ours never programmed the marker {mark:?} ({cmd}):\n{out}\n{}",
                    self.daemon.log_text()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            wait_programmed(
                &self.theirs.node,
                &format!("nft list table {fam} kube-proxy"),
                |r| mark.shown_in(r, v),
                self.upstream,
            );
        }
        let t0 = Instant::now();
        let mut last = None;
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = (ct::list(&self.ours.node), ct::list(&self.theirs.node));
            if last.as_ref() == Some(&now) {
                return (keyed(&now.0), keyed(&now.1));
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "the conntrack listings never held still for 300 ms"
            );
            last = Some(now);
        }
    }

    /// Flushes and seeds both nodes (at once: ~0.35 s each).
    fn seed(&self) {
        let all: Vec<Entry> = seeds(&UDP).into_iter().chain(seeds(&SCTP)).collect();
        std::thread::scope(|s| {
            for ns in [&self.ours.node, &self.theirs.node] {
                let all = &all;
                s.spawn(move || {
                    ct::flush(ns);
                    ct::seed(ns, all);
                });
            }
        });
    }

    /// Checks `expect` on (ours, upstream) after `step` (`up_before`: upstream's listing
    /// before it); records failures with the tables.
    fn check(
        &mut self,
        step: &str,
        expect: Expect,
        up_before: &Listing,
        (ours, up): (&Listing, &Listing),
    ) {
        let udp_rows: BTreeSet<Key> = self
            .seeded
            .udp
            .iter()
            .chain(&ours.udp)
            .chain(&up.udp)
            .cloned()
            .collect();
        let udp_table = ct::table(&udp_rows, &[("ours", &ours.udp), ("upstream", &up.udp)]);
        let mut problems = Vec::new();
        match expect {
            Expect::Same if ours.udp != up.udp => {
                problems.push("UDP entries differ".to_string());
            }
            Expect::Same => {}
            Expect::Deferred => {
                if up.udp != up_before.udp {
                    problems.push(
                        "upstream cleaned UDP entries without an endpoint change (the \
                         Deferred deviation is gone)"
                            .into(),
                    );
                }
                if ours.udp == up_before.udp {
                    problems.push("ours cleaned nothing: the step defers nothing".into());
                }
            }
            Expect::Deleted => {
                let to_deleted = format!("CIP:{}", self.spec.port);
                let gone: BTreeSet<Key> = up
                    .udp
                    .iter()
                    .filter(|k| k.dst == to_deleted)
                    .cloned()
                    .collect();
                let want: BTreeSet<Key> = up.udp.difference(&gone).cloned().collect();
                if gone.is_empty() {
                    problems.push(format!(
                        "upstream kept no entry to the deleted Service's {to_deleted}"
                    ));
                }
                if ours.udp != want {
                    problems.push(format!(
                        "ours should have exactly upstream's entries less those to the \
                         deleted Service's {to_deleted}"
                    ));
                }
            }
        }
        if up.sctp != self.seeded.sctp {
            problems.push("upstream's SCTP entries are not as seeded".into());
        }
        if ours.sctp != ours.udp {
            problems.push("ours cleaned SCTP otherwise than UDP".into());
        }
        let summary = format!(
            "{step}: UDP kept ours {}, upstream {}; SCTP kept ours {}, upstream {} (of {} each)",
            ours.udp.len(),
            up.udp.len(),
            ours.sctp.len(),
            up.sctp.len(),
            self.seeded.udp.len()
        );
        eprintln!("{summary}");
        if ours.udp != up.udp {
            eprintln!("{udp_table}");
        }
        if !problems.is_empty() {
            let sctp_rows: BTreeSet<Key> = self
                .seeded
                .sctp
                .iter()
                .chain(&ours.sctp)
                .chain(&up.sctp)
                .cloned()
                .collect();
            let sctp_table = ct::table(
                &sctp_rows,
                &[
                    ("ours sctp", &ours.sctp),
                    ("ours udp", &ours.udp),
                    ("upstr sctp", &up.sctp),
                ],
            );
            self.failures.push(format!(
                "{summary}\n  {}\nUDP:\n{udp_table}SCTP:\n{sctp_table}",
                problems.join("\n  ")
            ));
        }
    }
}

#[test]
fn conntrack_cleanup_matches_upstream_nftables_mode() {
    require_root();
    let t0 = Instant::now();
    let (ours, theirs, cp) = twins();
    let spec = Spec {
        port: PORTS[0],
        target: TARGETS[0],
        np: 0,
        eps: vec![(0, Cond::Ready), (1, Cond::Ready)],
    };
    let mark = Marker {
        svc_gen: 0,
        slice_gen: 0,
    };
    let mut ops = vec![Op::CreateNode(objects().swap_remove(0))];
    for svc in [&UDP, &SCTP] {
        ops.push(Op::Apply(service(svc, &spec)));
        ops.extend(slices(svc, &spec).into_iter().map(Op::Apply));
    }
    ops.push(Op::Apply(mark.service()));
    ops.extend(mark.slices().into_iter().map(Op::Apply));
    api(&cp, &ours.node, ops);
    // No periodic sync in the run: ours cleans after every sync, and one between the
    // seeding and a change would judge the seeded entries by the state before it.
    let no_resync = "--iptables-sync-period=1h";
    let via = cp.admin_kubeconfig_via(&format!("https://{TWIN_A}:6443"));
    let via = format!("--kubeconfig={}", via.display());
    let mut upstream = Upstream::start(&theirs.node, "nftables", &[&via, no_resync], &cp.dir);
    let admin = cp.admin_kubeconfig();
    let mut daemon = ours.start_daemon_with(&[
        "--kubeconfig",
        admin.to_str().unwrap(),
        "--proxy-mode",
        "nftables",
        no_resync,
    ]);
    let all: Vec<Entry> = seeds(&UDP).into_iter().chain(seeds(&SCTP)).collect();
    let mut run = Run {
        cp: &cp,
        ours: &ours,
        theirs: &theirs,
        upstream: &mut upstream,
        daemon: &mut daemon,
        spec,
        mark,
        seeded: keyed(&all.into_iter().collect()),
        failures: Vec::new(),
    };
    run.synced();
    eprintln!("both proxies up after {:?}", t0.elapsed());

    use Cond::{Ready, ServingTerminating, Terminating};
    use Expect::{Deferred, Deleted, Same};
    let steps = [
        (
            "endpoint E2 replaced by E3",
            Change::Endpoints(vec![(0, Ready), (2, Ready)]),
            Same,
        ),
        (
            "E3 terminating, still serving",
            Change::Endpoints(vec![(0, Ready), (2, ServingTerminating)]),
            Same,
        ),
        (
            "E3 terminating, not serving",
            Change::Endpoints(vec![(0, Ready), (2, Terminating)]),
            Same,
        ),
        ("E3 gone", Change::Endpoints(vec![(0, Ready)]), Same),
        (
            "E1 terminating, not serving: no serving endpoint",
            Change::Endpoints(vec![(0, Terminating)]),
            Same,
        ),
        ("scaled to zero", Change::Endpoints(vec![]), Same),
        (
            "scaled back to E1",
            Change::Endpoints(vec![(0, Ready)]),
            Same,
        ),
        ("port 53 -> 54", Change::Port(PORTS[1]), Deferred),
        (
            "targetPort 5353 -> 5354",
            Change::TargetPort(TARGETS[1]),
            Same,
        ),
        ("NodePort np -> np'", Change::NodePort(1), Deferred),
        ("Service deleted", Change::Delete, Deleted),
    ];
    let mut prev = "the initial state";
    for (name, change, expect) in &steps {
        // Every entry judged by both against the state as it stands, settled: the marker's
        // endpoint change makes upstream's proxier of each family run its cleanup.
        run.seed();
        run.apply(None, true);
        let settled = run.synced();
        run.check(
            &format!("seeded, judged by {prev}"),
            Same,
            &settled.1,
            (&settled.0, &settled.1),
        );
        // What is left (all valid under that state) through the change.
        run.apply(Some(change), false);
        let now = run.synced();
        run.check(name, *expect, &settled.1, (&now.0, &now.1));
        if *expect == Deferred {
            // The next UDP endpoint change (the marker's) makes upstream clean.
            run.apply(None, true);
            let then = run.synced();
            let step = format!("{name}, then a UDP endpoint change elsewhere");
            run.check(&step, Same, &now.1, (&then.0, &then.1));
            if then.0.udp != now.0.udp {
                let rows = now.0.udp.union(&then.0.udp).cloned().collect();
                let t = ct::table(&rows, &[("at once", &now.0.udp), ("later", &then.0.udp)]);
                run.failures
                    .push(format!("{step}: ours cleaned more a sync later:\n{t}"));
            }
        }
        prev = name;
    }
    eprintln!("took {:?}", t0.elapsed());
    assert!(
        run.failures.is_empty(),
        "conntrack cleanup differs from upstream v1.37.2 beyond the asserted deviations:\n\n{}\n\nours:\n{}\nupstream:\n{}",
        run.failures.join("\n\n"),
        run.daemon.log_text(),
        run.upstream
            .log_text()
            .lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
