//! [`ObjectWarning`]: a problem found in one API object while converting it, typed so that
//! every consumer gets the object apart from the problem: the log line carries the object as
//! a field (`service="ns/name"`, as upstream's `klog.InfoS` lines do), one searchable line per
//! object and problem. Pure.

/// What is wrong with one object and what the proxy does about it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectWarning {
    /// `Service`, `EndpointSlice`, `Node` or `ServiceCIDR`.
    pub kind: &'static str,
    /// `namespace/name`, or `name` for the cluster-scoped kinds.
    pub object: String,
    /// The problem and its consequence, e.g. `no ClusterIP; skipped`.
    pub problem: String,
}

impl ObjectWarning {
    pub fn new(kind: &'static str, object: impl Into<String>, problem: impl Into<String>) -> Self {
        ObjectWarning {
            kind,
            object: object.into(),
            problem: problem.into(),
        }
    }

    /// The log field the object goes in: upstream's key for the kind (`service`,
    /// `endpointSlice`, `node`, `serviceCIDR`).
    pub fn field(&self) -> &'static str {
        match self.kind {
            "Service" => "service",
            "EndpointSlice" => "endpointSlice",
            "Node" => "node",
            "ServiceCIDR" => "serviceCIDR",
            _ => "object",
        }
    }
}

/// `Kind object: problem`, the line the warning reads as in text (tests, `--dry-run`).
impl std::fmt::Display for ObjectWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.kind, self.object, self.problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_kind_object_problem_and_names_upstreams_field() {
        let w = ObjectWarning::new("Service", "default/web", "no ClusterIP; skipped");
        assert_eq!(w.to_string(), "Service default/web: no ClusterIP; skipped");
        assert_eq!(w.field(), "service");
        assert_eq!(
            ObjectWarning::new("EndpointSlice", "a/b", "x").field(),
            "endpointSlice"
        );
        assert_eq!(ObjectWarning::new("Node", "n", "x").field(), "node");
        assert_eq!(
            ObjectWarning::new("ServiceCIDR", "c", "x").field(),
            "serviceCIDR"
        );
    }
}
