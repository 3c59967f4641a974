//! [`Hooks`]: what the sync loop feeds after each change and sync: health, metrics, the
//! health-check node ports, localhost NodePorts, warning events. I/O (servers, sockets).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::kernel::nft::Family;
use crate::model::{count_changes, ProxyState};
use crate::proxy::runner::SyncHooks;
use crate::proxy::{SyncError, SyncStats};
use crate::serve::admin::Shared;
use crate::serve::metrics::{unix_secs, FamilyLabel, PolicyLabel};
use crate::serve::service_health::{plan_health_checks, ServiceHealthServers};
use crate::source::kube::service_ref;

/// Feeds health, metrics and health-check ports from the sync loop.
pub struct Hooks {
    /// The localhost NodePort forwarder and what it listens on, when enabled.
    pub(crate) localhost: Option<(
        crate::modes::userspace::localhost::LocalhostNodePorts,
        crate::proxy::LoopbackListeners,
    )>,
    /// Where warning events go when the API source is in use.
    pub(crate) warnings: Option<tokio::sync::mpsc::UnboundedSender<crate::source::kube::Warning>>,
    shared: Shared,
    hc: ServiceHealthServers,
    prev: Option<Arc<ProxyState>>,
    first_sync_logged: bool,
    collisions: crate::model::collisions::CollisionTracker,
    /// The state of the last successful sync: what the next one changed is the diff.
    synced_state: Option<ProxyState>,
    no_local: crate::model::topology::NoLocalEndpoints,
    /// The health-check and localhost NodePort plans of the last sync, kept while no
    /// service port they depend on changes (each is a walk of every service port).
    hc_plan: BTreeMap<u16, crate::serve::service_health::HcService>,
    localhost_plan: BTreeMap<
        crate::modes::userspace::localhost::ListenerKey,
        crate::modes::userspace::localhost::Forward,
    >,
    /// The IP families the proxier programs: health and the per-family metrics follow them.
    pub(crate) families: Vec<Family>,
}

impl Hooks {
    pub fn new(shared: Shared) -> Self {
        Hooks {
            localhost: None,
            warnings: None,
            hc: ServiceHealthServers::new(shared.health.clone()),
            shared,
            prev: None,
            first_sync_logged: false,
            collisions: Default::default(),
            synced_state: None,
            no_local: Default::default(),
            hc_plan: BTreeMap::new(),
            localhost_plan: BTreeMap::new(),
            families: Family::all().to_vec(),
        }
    }
}

impl Hooks {
    /// A Warning event on both Services of each new collision (once per collision).
    /// Publishes the state just synced for `/debug/kube-nlproxy/status`: the one
    /// [`SyncHooks::state_changed`] last announced (the runner announces each before syncing
    /// it), shared rather than copied.
    fn publish_synced(&self, state: &ProxyState) {
        let synced = self
            .prev
            .as_ref()
            .filter(|p| std::ptr::eq(&***p, state))
            .cloned()
            .unwrap_or_else(|| Arc::new(state.clone()));
        *self.shared.synced_state.lock().expect("synced state") = Some(synced);
    }

    fn report_collisions(&mut self, state: &ProxyState) {
        // Events only go to the API server: without it (manifests) there is nothing to find.
        if self.warnings.is_none() {
            return;
        }
        let new = self.collisions.new_in(state);
        if let Some(w) = &self.warnings {
            for c in new {
                for spn in [&c.owner, &c.other] {
                    let _ = w.send(crate::source::kube::Warning {
                        reference: service_ref(&spn.namespace, &spn.name),
                        reason: "ConflictingServicePort".into(),
                        action: "Sync".into(),
                        note: c.to_string(),
                    });
                }
            }
        }
    }
}

impl SyncHooks for Hooks {
    fn tampered(&mut self) {
        self.shared.metrics.nftables_restores.inc();
    }

    fn state_changed(&mut self, state: &Arc<ProxyState>) {
        self.report_collisions(state);
        let now = SystemTime::now();
        let m = &self.shared.metrics;
        let (svcs, eps) = match &self.prev {
            Some(p) => count_changes(p, state),
            None => (state.services.len(), state.endpoints.len()),
        };
        m.service_changes_total.inc_by(svcs as u64);
        m.endpoint_changes_total.inc_by(eps as u64);
        m.service_changes_pending.inc_by(svcs as i64);
        m.endpoint_changes_pending.inc_by(eps as i64);
        for f in FamilyLabel::of_each(&self.families) {
            m.last_queued_timestamp
                .get_or_create(&f)
                .set(unix_secs(now));
        }
        let mut h = self.shared.health.lock().expect("proxy health");
        for &f in &self.families {
            h.queued_update(f, now);
        }
        h.set_node_eligible(!state.node.being_deleted);
        drop(h);
        self.prev = Some(state.clone());
    }

    fn synced(&mut self, state: &ProxyState, res: &Result<SyncStats, SyncError>, took: Duration) {
        let stats = match res {
            Ok(s) => s,
            Err(_) => {
                self.shared
                    .metrics
                    .observe_sync(&self.families, true, took, false);
                return;
            }
        };
        self.publish_synced(state);
        let now = SystemTime::now();
        self.record_sync(stats, took);
        self.mark_healthy(stats, now);
        let prev = self.synced_state.take();
        self.observe_programming_latency(prev.as_ref(), state, now);
        self.publish_no_local_endpoints(state);
        // What changed, worked out once for both plans below.
        let changed = since(prev.as_ref(), state);
        self.sync_localhost_node_ports(changed.as_ref(), state);
        self.sync_health_check_ports(changed.as_ref(), state);
        drop(changed);
        self.synced_state = Some(state.clone());
    }
}

/// The steps of [`SyncHooks::synced`] after a successful sync, in order.
impl Hooks {
    /// Sync metrics, logs and the conntrack and restore counters of one sync.
    fn record_sync(&mut self, s: &SyncStats, took: Duration) {
        let m = &self.shared.metrics;
        m.observe_sync(&self.families, s.full, took, true);
        // Per-sync summaries at V(2), as upstream; the first one also at V(0) so that a
        // default log shows the proxy came up.
        if !self.first_sync_logged {
            self.first_sync_logged = true;
            tracing::info!(rules = s.rules, elements = s.elements, took = ?took, "initial sync done");
        }
        tracing::debug!(
            full = s.full,
            rules = s.rules,
            elements = s.elements,
            ipv4_ops = s.ops_of(Family::Ip),
            ipv6_ops = s.ops_of(Family::Ip6),
            took = ?took,
            "synced"
        );
        m.service_changes_pending.set(0);
        m.endpoint_changes_pending.set(0);
        if let Some(d) = s.conntrack_duration {
            for f in FamilyLabel::of_each(&self.families) {
                m.conntrack_duration
                    .get_or_create(&f)
                    .observe(d.as_secs_f64());
            }
        }
        for &f in &self.families {
            let n = s.conntrack_deleted_by_family.get(&f).copied().unwrap_or(0);
            m.conntrack_deleted
                .get_or_create(&FamilyLabel::of(f))
                .inc_by(n as u64);
        }
        if s.restored > 0 {
            m.nftables_restores.inc();
        }
    }

    /// The listeners the sync opened, and each family's last successful update.
    fn mark_healthy(&mut self, s: &SyncStats, now: SystemTime) {
        if let Some(l) = &s.listeners {
            *self.shared.listeners.lock().expect("listeners") = l.clone();
        }
        let mut h = self.shared.health.lock().expect("proxy health");
        for &f in &self.families {
            h.updated(f, now);
        }
    }

    /// Network programming latency: from each EndpointSlice change to now, once per
    /// trigger time (those `state` adds or changes against `prev`: a diff of shared maps,
    /// not a walk of every port).
    fn observe_programming_latency(
        &mut self,
        prev: Option<&ProxyState>,
        state: &ProxyState,
        now: SystemTime,
    ) {
        let m = &self.shared.metrics;
        let mut observed = Vec::new();
        let empty = crate::model::OrdMap::new();
        let before = prev.map_or(&empty, |p| &p.trigger_times);
        for d in before.diff(&state.trigger_times) {
            use imbl::ordmap::DiffItem;
            let (spn, t) = match d {
                DiffItem::Add(k, t) | DiffItem::Update { new: (k, t), .. } => (k, t),
                DiffItem::Remove(..) => continue,
            };
            if let Ok(d) = now.duration_since(*t) {
                observed.push(d);
                // Per family of the Service's ClusterIPs, as each upstream proxier observes
                // its own.
                let mut fams: Vec<Family> = state
                    .services
                    .get(spn)
                    .map(|sp| sp.cluster_ips.iter().map(Family::of).collect())
                    .unwrap_or_default();
                fams.sort();
                fams.dedup();
                for f in fams {
                    m.network_programming_duration
                        .get_or_create(&FamilyLabel::of(f))
                        .observe(d.as_secs_f64());
                }
            }
        }
        // Each latency, not only the histogram's buckets (1 s apart around the 1.5 s churn
        // goal of issue #18): `RUST_LOG=info,network_programming=debug`.
        if !observed.is_empty() {
            tracing::debug!(
                target: "network_programming",
                latencies_ms = %observed
                    .iter()
                    .map(|d| d.as_millis().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
                "network programming latencies of this sync"
            );
        }
    }

    /// The no-local-endpoints gauges per traffic policy, in the families programmed.
    fn publish_no_local_endpoints(&mut self, state: &ProxyState) {
        let counts = self.no_local.update(state);
        let m = &self.shared.metrics;
        for (f, (internal, external)) in [Family::Ip, Family::Ip6].into_iter().zip(counts) {
            if !self.families.contains(&f) {
                continue;
            }
            for (policy, n) in [("internal", internal), ("external", external)] {
                m.no_local_endpoints
                    .get_or_create(&PolicyLabel {
                        traffic_policy: policy.into(),
                        ip_family: FamilyLabel::of(f).ip_family,
                    })
                    .set(n as i64);
            }
        }
    }

    /// The localhost NodePort forwarder: its plan again when a NodePort changed, its
    /// listeners synced, their failures and counts as metrics.
    fn sync_localhost_node_ports(&mut self, changed: Option<&SinceSynced>, state: &ProxyState) {
        let Some((forwarder, listen)) = self.localhost.as_mut() else {
            return;
        };
        use crate::modes::userspace::localhost::plan_localhost;
        if touches(changed, state, |sp| sp.node_port.is_some()) {
            self.localhost_plan = plan_localhost(state, listen);
        }
        let failed = forwarder.sync(self.localhost_plan.clone());
        let Some(lm) = &self.shared.localhost_metrics else {
            return;
        };
        for (ip, _, _) in failed {
            lm.creation_failures
                .get_or_create(&FamilyLabel::of(Family::of(&ip)))
                .inc();
        }
        for v4 in [true, false] {
            if !listen.of(v4).is_empty() {
                let f = if v4 { Family::Ip } else { Family::Ip6 };
                lm.listeners
                    .get_or_create(&FamilyLabel::of(f))
                    .set(forwarder.listening(v4) as i64);
            }
        }
    }

    /// The health-check node ports: their plan again when a port they depend on changed,
    /// the servers synced, a Warning event on the Service for each port that failed to
    /// listen (upstream's `FailedToStartServiceHealthcheck`).
    fn sync_health_check_ports(&mut self, changed: Option<&SinceSynced>, state: &ProxyState) {
        if touches(changed, state, |sp| {
            sp.health_check_node_port.is_some() && sp.external_policy_local
        }) {
            self.hc_plan = plan_health_checks(state);
        }
        for (port, svc, err) in self.hc.sync(self.hc_plan.clone()) {
            if let Some(w) = &self.warnings {
                let _ = w.send(crate::source::kube::Warning {
                    reference: service_ref(&svc.namespace, &svc.name),
                    reason: "FailedToStartServiceHealthcheck".into(),
                    action: "Listen".into(),
                    note: format!(
                        "node {} failed to start healthcheck on port {port}: {err}",
                        state.node.name
                    ),
                });
            }
        }
    }
}

/// What changed between the last synced state and the one just synced, worked out once
/// per sync for the plans that depend on it (`None` from [`since`]: no state before, or
/// another node, so anything may have changed).
struct SinceSynced<'a> {
    prev: &'a ProxyState,
    ports: Vec<&'a crate::model::ServicePortName>,
}

fn since<'a>(prev: Option<&'a ProxyState>, state: &'a ProxyState) -> Option<SinceSynced<'a>> {
    let prev = prev.filter(|p| p.node == state.node)?;
    Some(SinceSynced {
        prev,
        ports: crate::model::changed_service_ports(prev, state),
    })
}

/// Whether a plan worked out from the last synced state may differ for `state`: anything
/// may have changed, or a changed service port for which `matters` holds, before or after.
fn touches(
    since: Option<&SinceSynced>,
    state: &ProxyState,
    matters: impl Fn(&crate::model::ServicePort) -> bool,
) -> bool {
    let Some(since) = since else { return true };
    since.ports.iter().any(|k| {
        since.prev.services.get(*k).is_some_and(|sp| matters(sp))
            || state.services.get(*k).is_some_and(|sp| matters(sp))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The health-check and localhost plans are worked out again only for a change of a
    /// service port they depend on, before or after it, or of the node.
    #[test]
    fn a_plan_is_worked_out_again_only_when_a_port_it_depends_on_changes() {
        let prev = crate::model::fixtures::synthetic_state(3, 2);
        let has_node_port = |sp: &crate::model::ServicePort| sp.node_port.is_some();
        assert!(
            touches(since(None, &prev).as_ref(), &prev, has_node_port),
            "nothing before"
        );
        assert!(!touches(
            since(Some(&prev), &prev.clone()).as_ref(),
            &prev.clone(),
            has_node_port
        ));
        // Endpoints of a port without a NodePort: no.
        let mut next = prev.clone();
        crate::model::fixtures::first_endpoints_mut(&mut next).pop();
        assert!(!touches(
            since(Some(&prev), &next).as_ref(),
            &next,
            has_node_port
        ));
        assert!(touches(since(Some(&prev), &next).as_ref(), &next, |_| true));
        // A NodePort added, or taken away: yes, either way round.
        let mut with_np = prev.clone();
        crate::model::fixtures::first_service_mut(&mut with_np).node_port = Some(30080);
        assert!(touches(
            since(Some(&prev), &with_np).as_ref(),
            &with_np,
            has_node_port
        ));
        assert!(touches(
            since(Some(&with_np), &prev).as_ref(),
            &prev,
            has_node_port
        ));
        // Another node: yes.
        let mut moved = prev.clone();
        moved.node.name = "elsewhere".into();
        assert!(touches(
            since(Some(&prev), &moved).as_ref(),
            &moved,
            has_node_port
        ));
    }
    /// A health-check plan kept from the last sync is replaced when a port it depends on
    /// changes (its health-check port, its local endpoints) and kept otherwise: after every
    /// sync it is what a fresh plan of the synced state would be.
    #[tokio::test]
    async fn a_kept_health_check_plan_is_replaced_when_its_port_changes() {
        use crate::serve::service_health::plan_health_checks;
        let mut hooks = Hooks::new(Shared::detached());
        let ok = Ok(SyncStats::default());
        // Ports above the NodePort range, unlikely to be taken on a test machine; a port
        // that is taken only fails its server, the plan is the same.
        let mut state = crate::model::fixtures::web_state(Some(30080));
        let web = crate::model::fixtures::first_service_mut(&mut state);
        web.health_check_node_port = Some(32_901);
        web.external_policy_local = true;
        let ports = |h: &Hooks| h.hc_plan.keys().copied().collect::<Vec<_>>();
        hooks.synced(&state, &ok, Duration::ZERO);
        assert_eq!(ports(&hooks), [32_901]);
        assert_eq!(hooks.hc_plan[&32_901].local_endpoints_v4, 1);
        // The health-check port moves.
        let mut moved = state.clone();
        crate::model::fixtures::first_service_mut(&mut moved).health_check_node_port = Some(32_902);
        hooks.synced(&moved, &ok, Duration::ZERO);
        assert_eq!(ports(&hooks), [32_902]);
        // Its local endpoint goes away: the count follows.
        let mut no_local = moved.clone();
        crate::model::fixtures::first_endpoints_mut(&mut no_local).retain(|e| !e.is_local);
        hooks.synced(&no_local, &ok, Duration::ZERO);
        assert_eq!(hooks.hc_plan[&32_902].local_endpoints_v4, 0);
        assert_eq!(hooks.hc_plan, plan_health_checks(&no_local));
        // A change elsewhere keeps the plan, which is still the fresh one.
        let mut other = no_local.clone();
        let mut api = (**other.services.values().next().unwrap()).clone();
        api.name.name = "api".into();
        api.health_check_node_port = None;
        other.services.insert(api.name.clone(), Arc::new(api));
        hooks.synced(&other, &ok, Duration::ZERO);
        assert_eq!(hooks.hc_plan, plan_health_checks(&other));
        // Policy Cluster: no health check at all.
        let mut cluster = other.clone();
        let web = state.services.keys().next().unwrap();
        Arc::make_mut(cluster.services.get_mut(web).unwrap()).external_policy_local = false;
        hooks.synced(&cluster, &ok, Duration::ZERO);
        assert!(hooks.hc_plan.is_empty());
    }

    use std::sync::Mutex;

    /// Log output, captured.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log buffer").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// The `network_programming` debug line (what the churn benchmark reads): each slice
    /// trigger time once, as the milliseconds from it to the end of the sync that programmed
    /// it; a later sync of the same trigger time logs nothing.
    #[tokio::test]
    async fn each_trigger_time_is_logged_once_with_its_latency() {
        let shared = Shared::detached();
        let mut hooks = Hooks::new(shared);
        let mut state = crate::model::fixtures::synthetic_state(3, 1);
        let spn = state
            .services
            .keys()
            .next()
            .expect("a service port")
            .clone();
        let ago = Duration::from_millis(1500);
        state.trigger_times.insert(spn, SystemTime::now() - ago);
        let log = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(log.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let ok = Ok(SyncStats::default());
        hooks.synced(&state, &ok, Duration::from_millis(5));
        hooks.synced(&state, &ok, Duration::from_millis(5));
        let text = String::from_utf8(log.0.lock().expect("log buffer").clone()).expect("UTF-8");
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("network programming latencies of this sync"))
            .collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(
            lines[0].contains("network_programming"),
            "its target: {text}"
        );
        let ms: u64 = lines[0]
            .split("latencies_ms=")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no latencies_ms in {text}"));
        assert!((1500..60_000).contains(&ms), "{ms} ms: {text}");
    }
}
