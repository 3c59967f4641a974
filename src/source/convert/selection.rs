//! Which Services, and which of their EndpointSlices, this proxy serves. Upstream kube-proxy
//! serves every Service without the `service.kubernetes.io/service-proxy-name` label (its
//! informers select `!service.kubernetes.io/service-proxy-name`): a labelled Service belongs
//! to another proxy. With `--service-proxy-name NAME` ours serves only the Services labelled
//! NAME, so that it can run beside an upstream kube-proxy that keeps serving all the others,
//! and an operator moves one Service across by labelling it (issue #55). The EndpointSlice
//! controller copies a Service's labels onto its slices, but a moment after the Service
//! changes: a proxy that selected slices by the label too would see a Service labelled over
//! without endpoints until then, reject its new connections and clear its UDP flows (the
//! real nodes' beside test lost its UDP flow so). With a name, ours therefore takes every
//! slice but headless Services' and serves only those of the Services it selects, so a
//! Service labelled over has its endpoints at once; that is the slices upstream's selection
//! takes too, plus those of Services labelled for some proxy. Slices of headless Services are
//! never served, whatever the selection. Pure.

use std::collections::BTreeMap;

use super::{LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME};

/// The most characters a label value may have (Kubernetes' `IsValidLabelValue`).
const LABEL_VALUE_MAX: usize = 63;

/// The Services (and slices) ours serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ServiceSelection {
    /// Upstream's: those that name no other proxy.
    #[default]
    Unlabelled,
    /// `--service-proxy-name`: only those labelled with this name.
    Named(String),
}

impl ServiceSelection {
    /// The selection `--service-proxy-name` asks for: empty is upstream's. The name must be
    /// a label value (at most 63 characters of `[A-Za-z0-9._-]`, starting and ending with an
    /// alphanumeric), or no Service could ever carry it.
    /// The error says why, after the value.
    pub fn from_flag(value: &str) -> Result<ServiceSelection, String> {
        if value.is_empty() {
            return Ok(ServiceSelection::Unlabelled);
        }
        let err = |why: &str| format!("{value:?}: {why}");
        if value.len() > LABEL_VALUE_MAX {
            return Err(err("a label value has at most 63 characters"));
        }
        let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !edge_ok(value.chars().next()) || !edge_ok(value.chars().last()) {
            return Err(err("a label value starts and ends with a letter or digit"));
        }
        if !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(
                "a label value has only letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(ServiceSelection::Named(value.to_string()))
    }

    /// The label selector the watch of Services sends the API server.
    pub fn service_label_selector(&self) -> String {
        match self {
            ServiceSelection::Unlabelled => {
                format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}")
            }
            ServiceSelection::Named(name) => {
                format!("{LABEL_SERVICE_PROXY_NAME}={name},!{LABEL_HEADLESS}")
            }
        }
    }

    /// The label selector the watch of EndpointSlices sends the API server: the Services'
    /// own, or with a name every slice but headless Services' (see the module's header).
    pub fn slice_label_selector(&self) -> String {
        match self {
            ServiceSelection::Unlabelled => self.service_label_selector(),
            ServiceSelection::Named(_) => format!("!{LABEL_HEADLESS}"),
        }
    }

    /// Whether a Service with these labels is ours to serve (the API server applies the same
    /// test through [`Self::service_label_selector`]; manifests are filtered here).
    pub fn selects_service(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let name = labels.and_then(|l| l.get(LABEL_SERVICE_PROXY_NAME));
        match self {
            ServiceSelection::Unlabelled => name.is_none(),
            ServiceSelection::Named(want) => name == Some(want),
        }
    }

    /// Whether a slice with these labels is taken: never a headless Service's; without a
    /// name, its Service's selection; with one, any other (the proxier serves only those of
    /// the Services selected).
    pub fn selects_slice(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let headless = labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS));
        match self {
            ServiceSelection::Unlabelled => self.selects_service(labels) && !headless,
            ServiceSelection::Named(_) => !headless,
        }
    }

    /// The name, with `--service-proxy-name`.
    pub fn proxy_name(&self) -> Option<&str> {
        match self {
            ServiceSelection::Unlabelled => None,
            ServiceSelection::Named(n) => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn upstreams_selection_takes_what_names_no_proxy() {
        let s = ServiceSelection::default();
        assert_eq!(
            s.service_label_selector(),
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
        );
        assert_eq!(s.slice_label_selector(), s.service_label_selector());
        assert!(!s.selects_slice(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "other")]))));
        assert!(s.selects_service(None));
        assert!(s.selects_service(Some(&labels(&[("app", "web")]))));
        assert!(!s.selects_service(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "other")]))));
        // An empty value still names a proxy: upstream's `!key` selector excludes it.
        assert!(!s.selects_service(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "")]))));
        assert!(!s.selects_slice(Some(&labels(&[(LABEL_HEADLESS, "")]))));
        assert!(s.selects_slice(Some(&labels(&[("kubernetes.io/service-name", "web")]))));
    }

    #[test]
    fn a_named_selection_takes_only_its_label() {
        let s = ServiceSelection::from_flag("kube-nlproxy").unwrap();
        assert_eq!(s.proxy_name(), Some("kube-nlproxy"));
        assert_eq!(
            s.service_label_selector(),
            "service.kubernetes.io/service-proxy-name=kube-nlproxy,!service.kubernetes.io/headless"
        );
        // Every slice but headless Services': a Service labelled over has its endpoints at
        // once, before the EndpointSlice controller relabels its slices.
        assert_eq!(s.slice_label_selector(), "!service.kubernetes.io/headless");
        assert!(s.selects_slice(None));
        assert!(s.selects_slice(Some(&labels(&[("kubernetes.io/service-name", "web")]))));
        assert!(s.selects_slice(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "other")]))));
        assert!(s.selects_service(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "kube-nlproxy")]))));
        assert!(!s.selects_service(None));
        assert!(!s.selects_service(Some(&labels(&[(LABEL_SERVICE_PROXY_NAME, "other")]))));
        let headless = labels(&[
            (LABEL_SERVICE_PROXY_NAME, "kube-nlproxy"),
            (LABEL_HEADLESS, ""),
        ]);
        assert!(!s.selects_slice(Some(&headless)));
    }

    #[test]
    fn the_flag_takes_label_values_only_and_says_why_not() {
        assert_eq!(
            ServiceSelection::from_flag("").unwrap(),
            ServiceSelection::Unlabelled
        );
        for ok in ["a", "kube-nlproxy", "a.b_c-9", &"x".repeat(63)] {
            assert!(ServiceSelection::from_flag(ok).is_ok(), "{ok}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "é", &"x".repeat(64)] {
            let e = ServiceSelection::from_flag(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad:?}: a label value")), "{e}");
        }
    }
}
