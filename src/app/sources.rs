//! [`Sources`]: where the states come from, the manifests (polled) or the API server (watched,
//! with warning events), and how their end is reported. Every entry point that needs a state
//! starts them the same way. I/O (files, the API server, tasks).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::config::{gates, Config, ProxyMode};
use crate::model::ProxyState;
use crate::source::convert::build_state;
use crate::source::kube as kube_source;
use crate::source::manifest::{self, ManifestCache};
use crate::source::SourceEnd;

use super::process::Shutdown;
use super::AppError;

/// A server that could not bind its address, as (event reason, message).
pub(super) type BindFailure = (&'static str, String);

/// The running source and what it delivers.
pub(super) struct Sources {
    /// Complete states; `None` until the source delivered its first.
    pub(super) states: watch::Receiver<Option<Arc<ProxyState>>>,
    /// Where warning events go (the API source, when events are posted).
    pub(super) warnings: Option<mpsc::UnboundedSender<kube_source::Warning>>,
    /// The task that feeds `states`; it says why it ended.
    task: JoinHandle<SourceEnd>,
}

impl Sources {
    /// Starts the source the configuration names: the manifests (read once now, so that an
    /// unreadable file fails the start) or the API server. `events`: with the API source,
    /// post warning events, first upstream's start-up ones with these bind failures (`None`
    /// in a dry run, which changes nothing, the API server's events included).
    pub(super) async fn start(
        cfg: &Config,
        events: Option<&[BindFailure]>,
    ) -> Result<Sources, AppError> {
        let (tx, states) = watch::channel(None);
        // AllowServiceExternalIPs off: every mode, the conntrack cleanup and the health checks
        // see the states without externalIPs (upstream's `ServicePort.ExternalIPs()`).
        let tx = if cfg.gates.enabled(gates::ALLOW_SERVICE_EXTERNAL_IPS) {
            tx
        } else {
            relay_without_external_ips(tx)
        };
        let mut warnings = None;
        let task = match cfg.manifests.clone() {
            Some(path) => {
                let mut cache = ManifestCache::new();
                let scope = kube_source::Scope {
                    node: cfg.node_name.clone(),
                    selection: cfg.service_selection.clone(),
                };
                let state = load_state(&mut cache, &path, &scope)?;
                tx.send_replace(Some(Arc::new(state)));
                tokio::spawn(async move {
                    watch_manifests(cache, path, scope, tx).await;
                    SourceEnd::Closed
                })
            }
            None => {
                let client = kube_client(cfg).await?;
                if let Some(bind_failures) = events {
                    let (wtx, wrx) = mpsc::unbounded_channel();
                    tokio::spawn(kube_source::run_events(
                        client.clone(),
                        cfg.node_name.clone(),
                        crate::config::host_name(),
                        wrx,
                    ));
                    for w in startup_events(cfg, bind_failures) {
                        let _ = wtx.send(w);
                    }
                    warnings = Some(wtx);
                }
                let accept = kube_source::protobuf::Accept::new(
                    &cfg.content_type,
                    &cfg.accept_content_types,
                );
                tokio::spawn(kube_source::run(
                    kube_source::ApiClient { client, accept },
                    kube_source::Scope {
                        node: cfg.node_name.clone(),
                        selection: cfg.service_selection.clone(),
                    },
                    tx,
                    cfg.config_sync_period,
                    cfg.min_sync_period,
                    cfg.detect_local == crate::proxy::DetectLocal::NodeCidr,
                    warnings.clone(),
                ))
            }
        };
        Ok(Sources {
            states,
            warnings,
            task,
        })
    }

    /// The first complete state: the first sync waits until the source delivered it.
    /// `None` when a signal came first.
    pub(super) async fn first_state(
        &mut self,
        shutdown: &Shutdown,
    ) -> Result<Option<Arc<ProxyState>>, AppError> {
        loop {
            if let Some(s) = self.states.borrow_and_update().clone() {
                return Ok(Some(s));
            }
            tokio::select! {
                r = self.states.changed() => if r.is_err() {
                    return Err(AppError::SourceEnded);
                },
                _ = shutdown.clone().signalled() => return Ok(None),
            }
        }
    }

    /// Stops the source.
    pub(super) fn stop(self) {
        self.task.abort();
    }

    /// Stops the source after a run that ended with `res`. A run also ends when the source
    /// does (its sender gone): then the source's reason is the run's, when it had one. The
    /// task is finishing; the bound only guards against a stuck one.
    pub(super) async fn finish(mut self, res: Result<(), AppError>) -> Result<(), AppError> {
        if res.is_ok() && self.states.has_changed().is_err() {
            let end = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
            if let Ok(Ok(SourceEnd::NodeDeleted(node))) = end {
                return Err(AppError::NodeDeleted(node));
            }
        }
        self.task.abort();
        res
    }
}

async fn kube_client(cfg: &Config) -> Result<kube::Client, AppError> {
    kube_source::client(cfg.kubeconfig.as_deref(), cfg.master.as_deref())
        .await
        .map_err(AppError::Kube)
}

fn load_state(
    cache: &mut ManifestCache,
    path: &Path,
    scope: &kube_source::Scope,
) -> Result<ProxyState, AppError> {
    let (snap, warnings) = cache.load(path, &scope.node)?;
    let (state, objects) = build_state(&snap, &scope.node, &scope.selection);
    for w in warnings {
        tracing::warn!(problem = %w, "manifest content skipped");
    }
    for w in &objects {
        crate::source::log_object_warning(w);
    }
    Ok(state)
}

/// A sender whose states reach `out` without externalIPs; `out` closes when it does.
fn relay_without_external_ips(
    out: watch::Sender<Option<Arc<ProxyState>>>,
) -> watch::Sender<Option<Arc<ProxyState>>> {
    let (tx, mut rx) = watch::channel::<Option<Arc<ProxyState>>>(None);
    tokio::spawn(async move {
        // In proportion to each change: a walk of every port was milliseconds per change
        // at 100k service ports.
        let mut off = crate::model::ExternalIpsOff::default();
        while rx.changed().await.is_ok() {
            let st = rx.borrow_and_update().clone();
            out.send_replace(st.map(|s| Arc::new(off.apply(&s))));
        }
    });
    tx
}

/// Polls the manifests and publishes a new state whenever they change. Polling (250 ms)
/// catches in-place edits and replacement by rename alike, with no inotify dependency.
async fn watch_manifests(
    mut cache: ManifestCache,
    path: PathBuf,
    scope: kube_source::Scope,
    tx: watch::Sender<Option<Arc<ProxyState>>>,
) {
    let mut fp = manifest::fingerprint(&path);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = manifest::fingerprint(&path);
        if now == fp {
            continue;
        }
        fp = now;
        match load_state(&mut cache, &path, &scope) {
            Ok(s) => {
                tracing::info!(path = %path.display(), "manifests changed");
                let _ = tx.send(Some(Arc::new(s)));
            }
            Err(e) => tracing::warn!(err = %e, "keeping the last good state"),
        }
    }
}

/// The warning events upstream emits at start-up: the defaulted mode, IPVS mode, and each
/// server that could not bind its address.
fn startup_events(cfg: &Config, bind_failures: &[BindFailure]) -> Vec<kube_source::Warning> {
    let node = kube_source::node_ref(&cfg.node_name);
    let mut out = Vec::new();
    if cfg.mode_defaulted {
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: "KubeProxyDefaultMode".into(),
            action: "StartKubeProxy".into(),
            note: "No kube-proxy mode specified: defaulting to 'iptables', served by \
                   kube-nlproxy's nftables engine. Set 'mode' in the config file or \
                   --proxy-mode to choose."
                .into(),
        });
    }
    if cfg.mode == ProxyMode::Ipvs {
        // Upstream 1.35+ posts this reason when its deprecated ipvs proxier starts; ours is
        // supported, so the note says what upstream plans and that this binary keeps it.
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: "IPVSDeprecation".into(),
            action: "StartKubeProxy".into(),
            note: IPVS_NOTE.into(),
        });
    }
    for (reason, note) in bind_failures {
        out.push(kube_source::Warning {
            reference: node.clone(),
            reason: (*reason).into(),
            action: "StartKubeProxy".into(),
            note: note.clone(),
        });
    }
    out
}

/// The upstream IPVS deprecation, as this binary's IPVS mode sees it.
const IPVS_NOTE: &str = "Upstream kube-proxy deprecates its ipvs proxier (disabled by default in \
Kubernetes 1.40, removed in 1.43) and recommends nftables; kube-nlproxy's IPVS mode stays supported, \
and --proxy-mode=nftables is the way forward.";
