//! Object warnings as Kubernetes Events (reason `ObjectNotFullyUsable`, the object as regarding)
//! and the recorder task that posts them. I/O only in [`run_events`].

use super::*;

/// Converts as the stores need, logging each object's warnings once, when it arrives.
#[cfg(test)]
pub(super) fn logged<T>(f: impl FnOnce(&mut Vec<ObjectWarning>) -> T) -> T {
    reported(&None, f)
}

/// [`logged`], and each warning also an Event on its object when `events` is given: the
/// same problem as one searchable line and one `kubectl describe` entry. An object's
/// warnings come once per change to it (conversions are kept while it is unchanged), and
/// the recorder folds repeats into one Event's series.
pub(super) fn reported<T>(
    events: &Option<mpsc::UnboundedSender<Warning>>,
    f: impl FnOnce(&mut Vec<ObjectWarning>) -> T,
) -> T {
    let mut warnings = Vec::new();
    let out = f(&mut warnings);
    for w in &warnings {
        crate::source::log_object_warning(w);
        if let Some(tx) = events {
            let _ = tx.send(object_event(w));
        }
    }
    out
}

/// The Event an object's warning is published as: on the object itself, reason
/// [`OBJECT_EVENT_REASON`], the problem as its note.
pub fn object_event(w: &ObjectWarning) -> Warning {
    let api_version = match w.kind {
        "EndpointSlice" => "discovery.k8s.io/v1",
        "ServiceCIDR" => "networking.k8s.io/v1",
        _ => "v1",
    };
    let (namespace, name) = match w.object.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name.to_string()),
        None => (None, w.object.clone()),
    };
    Warning {
        reference: ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(w.kind.into()),
            namespace,
            name: Some(name),
            ..Default::default()
        },
        reason: OBJECT_EVENT_REASON.into(),
        action: "ReadObject".into(),
        note: w.problem.clone(),
    }
}

/// The reason of an object's warning Event (the log line says "object not fully usable").
pub const OBJECT_EVENT_REASON: &str = "ObjectNotFullyUsable";

/// A warning event for the API server (upstream emits these on the Node or Service), with
/// upstream's reason and action (`Listen` for health-check ports, `StartKubeProxy` for
/// start-up failures).
#[derive(Debug, Clone)]
pub struct Warning {
    pub reference: ObjectReference,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// Upstream's `reportingController`: dashboards and alerts select kube-proxy's events by it.
pub const REPORTING_CONTROLLER: &str = "kube-proxy";

/// Upstream's `reportingInstance`: the controller and the host's name (client-go's
/// `events.NewRecorder`).
pub fn reporting_instance(hostname: &str) -> String {
    format!("{REPORTING_CONTROLLER}-{hostname}")
}

/// A reference to this node, as events need.
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    }
}

/// A reference to a Service, as upstream's proxier events name it (its UID is the
/// Service's `namespace/name`, not the object's UID: the proxier never sees that).
pub fn service_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(format!("{namespace}/{name}")),
        ..Default::default()
    }
}

/// Publishes the "Starting" event (upstream's `birthCry`), then any warnings sent on
/// `warnings`. Failures are logged.
pub async fn run_events(
    client: Client,
    node: String,
    hostname: String,
    mut warnings: mpsc::UnboundedReceiver<Warning>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(reporting_instance(&hostname)),
        },
    );
    let starting = KubeEvent {
        type_: EventType::Normal,
        reason: "Starting".into(),
        note: None,
        action: "StartKubeProxy".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&starting, &node_ref(&node)).await {
        tracing::warn!(err = %e, "cannot publish the Starting event");
    }
    while let Some(w) = warnings.recv().await {
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: w.reason.clone(),
            note: Some(w.note.clone()),
            action: w.action.clone(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &w.reference).await {
            tracing::warn!(reason = %w.reason, err = %e, "cannot publish an event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_is_referenced_as_upstreams_proxier_references_it() {
        let r = service_ref("default", "web");
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!(r.kind.as_deref(), Some("Service"));
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.name.as_deref(), Some("web"));
        // pkg/proxy/healthcheck: the UID is namespace/name.
        assert_eq!(r.uid.as_deref(), Some("default/web"));
        assert_eq!(node_ref("n1").uid.as_deref(), Some("n1"));
    }
}
