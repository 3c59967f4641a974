//! The proxies a real cluster runs, deployed as an operator deploys them: kube-nlproxy from
//! the repository's `deploy/` (`kubectl apply -k`), or upstream kube-proxy as kubeadm's own
//! addon (its ServiceAccount bound to `system:node-proxier`, its ConfigMap, its DaemonSet),
//! and the e2e focus both are judged on, with every skip and its reason.
//!
//! Pure text, except [`deploy_ours`], [`deploy_kubeadm_addon`], [`deploy_beside`] (kubectl)
//! and [`beside_kustomization`] (files).

use std::time::Duration;

use super::{images, workspace_root, Cluster, Cni, Family, IpFamily};

/// Which proxy a cluster runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    /// kube-nlproxy from `deploy/`, its DaemonSet `kube-nlproxy`.
    Ours,
    /// upstream kube-proxy v1.37.2 as kubeadm's addon, its DaemonSet `kube-proxy`.
    Upstream,
}

impl Proxy {
    /// The label selecting the proxy's pods.
    pub fn selector(self) -> &'static str {
        match self {
            Proxy::Ours => "app.kubernetes.io/name=kube-nlproxy",
            Proxy::Upstream => "k8s-app=kube-proxy",
        }
    }
}

/// The `[sig-network]` specs that exercise a service proxy: every Services spec
/// (conformance and not), Conntrack, KubeProxy, the Networking "Granular Checks" and
/// kube-proxy URL checks, EndpointSlice (and its mirroring), ServiceCIDR, Traffic
/// Distribution and Topology Hints (zones), pod lifecycle connectivity through Services,
/// localhost NodePorts, HostPort and NoSNAT.
pub const PROXY_FOCUS: &str = r"\[sig-network\] (Services |Conntrack |KubeProxy |Networking Granular Checks|Networking should check kube-proxy urls|EndpointSlice|ServiceCIDR|Service CIDRs|Traffic Distribution|Topology Hints|Connectivity Pod Lifecycle|LocalhostNodePorts|HostPort|NoSNAT)";

/// Upstream's `[Feature:IPv6DualStack]` specs (`test/e2e/network/dual_stack.go`), which
/// only run when focused: a node with an InternalIP per family, pods and hostNetwork pods
/// with an address per family, Services created single-stack in either family and
/// dual-stack in either order, and the "Granular Checks: Services Secondary IP Family"
/// (pod-, node- and endpoint-to-Service over HTTP and UDP, endpoint updates, session
/// affinity, large requests, hostNetwork endpoints) on the secondary family's ClusterIP.
/// Every one of them concerns Services or pod networking. `real-node-e2e --family dual`
/// runs them with [`PROXY_FOCUS`] ([`focus_for`]).
pub const DUAL_STACK_FOCUS: &str = r"\[sig-network\] \[Feature:IPv6DualStack\] ";

/// The default focus of a cluster in `family`: [`PROXY_FOCUS`], and in a dual-stack cluster
/// [`DUAL_STACK_FOCUS`] too.
pub fn focus_for(family: Family) -> String {
    if family.is_dual() {
        format!("{PROXY_FOCUS}|{DUAL_STACK_FOCUS}")
    } else {
        PROXY_FOCUS.to_string()
    }
}

/// The skip that only holds for IPv4-only nodes (the [`SKIPS`] entry a dual-stack cluster
/// drops, and an IPv6 cluster narrows to [`DUAL_STACK_SKIP`]).
const IPV6_SKIP: &str = r"IPv6|DualStack";

/// What an IPv6-only cluster skips of [`IPV6_SKIP`]: the `[Feature:IPv6DualStack]` specs,
/// which create `RequireDualStack` Services and want an address per family.
const DUAL_STACK_SKIP: &str = r"DualStack";

/// What is skipped, each with its reason (written down in README's e2e table too).
pub const SKIPS: &[(&str, &str)] = &[
    (
        r"\[Slow\]",
        "upstream's own CI runs [Slow] specs apart; the issue excludes them",
    ),
    (r"\[Serial\]", "they need the whole cluster to themselves"),
    (r"\[Disruptive\]", "they reboot or partition nodes"),
    (r"\[Flaky\]", "upstream marks them unreliable"),
    (
        r"LoadBalancer",
        "no cloud: nothing assigns a load balancer's address",
    ),
    (
        IPV6_SKIP,
        "the nodes are IPv4-only (dual-stack is proven in the namespace suites and in `real-node-e2e --family dual`)",
    ),
    (
        r"SCTPConnectivity",
        "this kernel has no SCTP sockets (CONFIG_IP_SCTP is not set); SCTP is tested in the VM",
    ),
];

/// The `--ginkgo.skip` expression of [`SKIPS`].
pub fn skip_regex() -> String {
    skip_regex_for(Family::Ipv4)
}

/// The `--ginkgo.skip` expression of [`SKIPS`] for a cluster in `family`: a dual-stack
/// cluster runs the IPv6 and DualStack specs its focus selects, an IPv6 cluster the IPv6
/// ones.
pub fn skip_regex_for(family: Family) -> String {
    SKIPS
        .iter()
        .filter_map(|&(r, _)| match family {
            _ if r != IPV6_SKIP => Some(r),
            Family::Ipv4 => Some(r),
            Family::Dual => None,
            Family::Ipv6 => Some(DUAL_STACK_SKIP),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// What CI runs on every change: the Services conformance specs and the kube-proxy-specific
/// ones (conntrack, kube-proxy's own, its URLs, zone-aware routing). The rest of
/// [`PROXY_FOCUS`] runs with `real-node-e2e` (README, "Run the tests").
pub const CI_FOCUS: &str = r"\[sig-network\] (Services .*\[Conformance\]|Conntrack |KubeProxy |Networking should check kube-proxy urls|Traffic Distribution)";

/// The shape of CI's install test: dual-stack nodes, which carry every IPv4 path too, with
/// CI's focus and four of upstream's `[Feature:IPv6DualStack]` specs
/// ([`CI_MUST_PASS_DUAL_STACK`]; all 22 ran in about 2.5 minutes, these four in well under
/// one, and CI's warm run is near its 30-minute budget).
pub const CI_FAMILY: Family = Family::Dual;

/// The pod network of CI's install test: Flannel with its nftables rules (k3s's default CNI;
/// the migration and node-life tests keep the bridge plugin, so CI runs both).
pub const CI_CNI: Cni = Cni::Flannel(super::flannel::Masquerade::Nftables);

/// CI's focus on nodes in `family`: [`CI_FOCUS`], and on dual-stack nodes the specs of
/// [`CI_MUST_PASS_DUAL_STACK`] by their exact names.
pub fn ci_focus_for(family: Family) -> String {
    if family.is_dual() {
        let dual: Vec<String> = CI_MUST_PASS_DUAL_STACK
            .iter()
            .map(|s| regex_escape(s))
            .collect();
        format!("{CI_FOCUS}|{}", dual.join("|"))
    } else {
        CI_FOCUS.to_string()
    }
}

/// `text` as a regular expression (RE2, Ginkgo's) matching itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Dual-stack specs CI runs and requires on dual-stack nodes: the secondary family's
/// ClusterIP from pods (UDP) and nodes (HTTP), its session affinity, and a Service created
/// IPv6 first.
pub const CI_MUST_PASS_DUAL_STACK: &[&str] = &[
    "[Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for pod-Service: udp",
    "[Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for node-Service: http",
    "[Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for client IP based session affinity: http [LinuxOnly]",
    "[Feature:IPv6DualStack] should create service with ipv6,v4 cluster ip",
];

/// Specs that must pass in a CI run (a focus that silently selects nothing fails here).
pub const CI_MUST_PASS: &[&str] = &[
    "Services should serve a basic endpoint from pods [Conformance]",
    "Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]",
    "KubeProxy should set TCP CLOSE_WAIT timeout",
    "Conntrack proxy implementation should not be vulnerable to the invalid conntrack state bug",
    "Conntrack should be able to preserve UDP traffic when server pod cycles for a NodePort service",
    "Traffic Distribution should route traffic to an endpoint in the same zone when using PreferSameZone",
];

/// Specs that skip themselves on these nodes, and why.
pub const EXPECTED_SELF_SKIPS: &[(&str, &str)] = &[
    (
        "Traffic Distribution should route traffic correctly between pods on multiple nodes",
        "needs 3 zones with 2 schedulable nodes each: 6 nodes",
    ),
    (
        "Traffic Distribution should route traffic to an endpoint on the same node or fall back to same zone",
        "needs 3 zones with 2 schedulable nodes each: 6 nodes",
    ),
    (
        "[Feature:KubeProxyNFAcct]",
        "reads route_localnet, which only upstream's iptables mode sets (ours serves localhost NodePorts without it)",
    ),
];

/// kubeadm's `kube-proxy` ConfigMap as kubeadm writes it: its undefaulted
/// KubeProxyConfiguration (`mode` as given) and a kubeconfig naming the control-plane
/// endpoint with the pod's service-account credentials
/// (`cmd/kubeadm/app/phases/addons/proxy/manifests.go`).
pub fn kubeadm_configmap(mode: &str) -> String {
    kubeadm_configmap_for(mode, Family::Ipv4)
}

/// [`kubeadm_configmap`] for a cluster in `family`: `clusterCIDR` names its pod range in
/// every family (`10.244.0.0/16,fd00:10:244::/56` dual-stack), as kubeadm writes it from
/// `networking.podSubnet`, the kubeconfig names the API server at its primary address, and
/// an IPv6 cluster binds `::` (kubeadm's `DefaultProxyBindAddressv6`).
pub fn kubeadm_configmap_for(mode: &str, family: Family) -> String {
    let mut config = include_str!("../../../src/config/file/testdata/kubeadm_config.conf")
        .replace("mode: \"\"", &format!("mode: \"{mode}\""))
        .replace(
            &format!("clusterCIDR: {}\n", super::CLUSTER_CIDR),
            &format!("clusterCIDR: {}\n", family.cluster_cidrs()),
        );
    if family.primary() == IpFamily::V6 {
        config = config.replace("bindAddress: 0.0.0.0\n", "bindAddress: \"::\"\n");
    }
    let server = family.apiserver_url();
    let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "kind: ConfigMap\napiVersion: v1\nmetadata:\n  name: kube-proxy\n  namespace: kube-system\n  labels:\n    app: kube-proxy\ndata:\n  kubeconfig.conf: |-\n{}  config.conf: |-\n{}",
        indent(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n    server: {server}\n  name: default\ncontexts:\n- context:\n    cluster: default\n    namespace: default\n    user: default\n  name: default\ncurrent-context: default\nusers:\n- name: default\n  user:\n    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"
        )),
        indent(config.trim_end()),
    )
}

/// `configmap` (a [`kubeadm_configmap_for`]) with each top-level field of its
/// `config.conf` in `fields` set to its YAML value (`featureGates` to
/// `{KubeProxyNFTablesLocalhostNodePorts: true}`, say), as an operator sets them in
/// kubeadm's `KubeProxyConfiguration`: a field already there is replaced (one-line values,
/// as kubeadm's undefaulted file has), another is added after `mode`.
pub fn with_config_fields(configmap: &str, fields: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut added = false;
    for line in configmap.lines() {
        let field = line
            .strip_prefix("    ")
            .and_then(|l| l.split_once(": "))
            .map(|(k, _)| k);
        match fields.iter().find(|(k, _)| Some(k.as_str()) == field) {
            Some((k, v)) => out.push_str(&format!("    {k}: {v}\n")),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
        if field == Some("mode") && !added {
            added = true;
            for (k, v) in fields {
                if !configmap.contains(&format!("\n    {k}: ")) {
                    out.push_str(&format!("    {k}: {v}\n"));
                }
            }
        }
    }
    out
}

/// kubeadm's `kubeadm-config` ConfigMap for a cluster in `family`: the v1beta4
/// `ClusterConfiguration` its upload-config phase writes (`cmd/kubeadm/app/phases/uploadconfig`),
/// keys sorted as sigs.k8s.io/yaml writes them, with `proxy: {}` as Go encodes kubeadm's
/// empty `Proxy` struct (`json:"proxy,omitempty"` omits no struct). README's install sets
/// `proxy: {disabled: true}` in it and its way back takes that out again.
pub fn kubeadm_config_for(family: Family) -> String {
    let cluster_configuration = format!(
        "apiServer: {{}}\napiVersion: kubeadm.k8s.io/v1beta4\ncaCertificateValidityPeriod: 87600h0m0s\ncertificateValidityPeriod: 8760h0m0s\ncertificatesDir: /etc/kubernetes/pki\nclusterName: kubernetes\ncontrollerManager: {{}}\ndns: {{}}\nencryptionAlgorithm: RSA-2048\netcd:\n  local:\n    dataDir: /var/lib/etcd\nimageRepository: registry.k8s.io\nkind: ClusterConfiguration\nkubernetesVersion: {version}\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: {pods}\n  serviceSubnet: {services}\nproxy: {{}}\nscheduler: {{}}\n",
        version = super::images::KUBE_PROXY
            .rsplit_once(':')
            .expect("kube-proxy's image has a tag")
            .1,
        pods = family.cluster_cidrs(),
        services = family.service_cidrs(),
    );
    let indent = |t: &str| t.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "kind: ConfigMap\napiVersion: v1\nmetadata:\n  name: kubeadm-config\n  namespace: kube-system\ndata:\n  ClusterConfiguration: |\n{}",
        indent(&cluster_configuration)
    )
}

/// kubeadm's kube-proxy addon without its ConfigMap: ServiceAccount `kube-proxy`,
/// ClusterRoleBinding `kubeadm:node-proxier` to `system:node-proxier`, the Role and
/// RoleBinding that let joining nodes read the ConfigMap, and the DaemonSet running `image`
/// (`cmd/kubeadm/app/phases/addons/proxy/`).
pub fn kubeadm_addon(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-proxier
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-proxier
subjects:
- kind: ServiceAccount
  name: kube-proxy
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: kube-proxy
  namespace: kube-system
rules:
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [kube-proxy]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: kube-proxy
  namespace: kube-system
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: kube-proxy
subjects:
- kind: Group
  name: system:bootstrappers:kubeadm:default-node-token
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  labels:
    k8s-app: kube-proxy
  name: kube-proxy
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: kube-proxy
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels:
        k8s-app: kube-proxy
    spec:
      priorityClassName: system-node-critical
      containers:
      - name: kube-proxy
        image: {image}
        imagePullPolicy: IfNotPresent
        command:
        - /usr/local/bin/kube-proxy
        - --config=/var/lib/kube-proxy/config.conf
        - --hostname-override=$(NODE_NAME)
        securityContext:
          privileged: true
        volumeMounts:
        - mountPath: /var/lib/kube-proxy
          name: kube-proxy
        - mountPath: /run/xtables.lock
          name: xtables-lock
          readOnly: false
        - mountPath: /lib/modules
          name: lib-modules
          readOnly: true
        env:
          - name: NODE_NAME
            valueFrom:
              fieldRef:
                fieldPath: spec.nodeName
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
      - name: kube-proxy
        configMap:
          name: kube-proxy
      - name: xtables-lock
        hostPath:
          path: /run/xtables.lock
          type: FileOrCreate
      - name: lib-modules
        hostPath:
          path: /lib/modules
      tolerations:
      - operator: Exists
      nodeSelector:
        kubernetes.io/os: linux
"#
    )
}

/// `kubectl apply -k` of the repository's kustomization: `deploy/` exactly as shipped.
pub fn deploy_ours(c: &Cluster) {
    let root = workspace_root();
    c.kubectl_ok(&["apply", "-k", root.to_str().unwrap()]);
}

/// Ours from the kustomization in `dir`, with `configmap` as kubeadm's ConfigMap
/// ([`kubeadm_configmap_for`]); waits as [`deploy`] does and returns how long that took.
pub fn deploy_ours_from(
    c: &Cluster,
    dir: &std::path::Path,
    configmap: &str,
    limit: Duration,
) -> Duration {
    c.apply(configmap);
    c.create(&kubeadm_config_for(c.family));
    let t0 = std::time::Instant::now();
    c.kubectl_ok(&["apply", "-k", dir.to_str().expect("a UTF-8 path")]);
    c.wait_for(limit, "our proxy pods Ready", |c| {
        c.pods_ready("kube-system", Proxy::Ours.selector(), c.nodes.len())
    });
    t0.elapsed()
}

/// Upstream kube-proxy as kubeadm's addon, running `image` (upstream's by default).
pub fn deploy_kubeadm_addon(c: &Cluster, image: &str) {
    c.apply(&kubeadm_addon(image));
}

/// Deploys `proxy` with kubeadm's ConfigMap in `mode` (for the cluster's families) and waits
/// until its pods are Running and Ready on every node; returns how long that took.
pub fn deploy(c: &Cluster, proxy: Proxy, mode: &str, limit: Duration) -> Duration {
    deploy_configured(c, proxy, &kubeadm_configmap_for(mode, c.family), limit)
}

/// [`deploy`] with `configmap` as kubeadm's ConfigMap ([`kubeadm_configmap_for`], say
/// with [`with_config_fields`]).
pub fn deploy_configured(c: &Cluster, proxy: Proxy, configmap: &str, limit: Duration) -> Duration {
    c.apply(configmap);
    c.create(&kubeadm_config_for(c.family));
    let t0 = std::time::Instant::now();
    match proxy {
        Proxy::Ours => deploy_ours(c),
        Proxy::Upstream => deploy_kubeadm_addon(c, images::KUBE_PROXY),
    }
    c.wait_for(limit, &format!("{proxy:?} proxy pods Ready"), |c| {
        c.pods_ready("kube-system", proxy.selector(), c.nodes.len())
    });
    t0.elapsed()
}

/// The label upstream kube-proxy ignores a Service by and ours, beside it, selects by.
pub const SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";

/// A MutatingAdmissionPolicy (GA in 1.36) that labels every Service created or updated
/// outside `kube-system` and `default` for ours (`kube-nlproxy`) unless it already names a
/// proxy: upstream's e2e specs then run on Services ours serves beside upstream kube-proxy,
/// which keeps `kubernetes` and `kube-dns`. The EndpointSlice controller copies a Service's
/// labels onto its slices.
pub fn label_every_service_policy() -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: label-services-for-kube-nlproxy
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [services]
  matchConditions:
  - name: names-no-proxy
    expression: "!has(object.metadata.labels) || !('{SERVICE_PROXY_NAME}' in object.metadata.labels)"
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{{metadata: Object.metadata{{labels: {{"{SERVICE_PROXY_NAME}": "kube-nlproxy"}}}}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: label-services-for-kube-nlproxy
spec:
  policyName: label-services-for-kube-nlproxy
  matchResources:
    namespaceSelector:
      matchExpressions:
      - {{key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, default]}}
"#
    )
}

/// A copy of the repository's kustomization and `deploy/` in `dir`, with
/// `deploy/components/beside-kube-proxy` added as an operator adds it (README, "Beside
/// kube-proxy"); returns `dir`.
pub fn beside_kustomization(dir: &std::path::Path) -> std::path::PathBuf {
    kustomization_with(dir, &["deploy/components/beside-kube-proxy"])
}

/// A copy of the repository's kustomization and `deploy/` in `dir` with `components` added
/// in order, as `kustomize edit add component` adds each; returns `dir`.
pub fn kustomization_with(dir: &std::path::Path, components: &[&str]) -> std::path::PathBuf {
    fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_tree(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), &target).unwrap();
            }
        }
    }
    let root = workspace_root();
    copy_tree(&root.join("deploy"), &dir.join("deploy"));
    let mut k = std::fs::read_to_string(root.join("kustomization.yaml")).unwrap();
    assert!(
        k.trim_end().ends_with("- deploy/images"),
        "components last: {k}"
    );
    for c in components {
        k.push_str(&format!("- {c}\n"));
    }
    std::fs::write(dir.join("kustomization.yaml"), k).unwrap();
    dir.to_path_buf()
}

/// Upstream kube-proxy as kubeadm's addon with `configmap`, the policy that labels every
/// Service for ours ([`label_every_service_policy`], checked on a Service of its own first),
/// then ours from [`beside_kustomization`]; waits for both proxies' pods on every node and
/// returns how long ours took.
pub fn deploy_beside(c: &Cluster, configmap: &str, limit: Duration) -> Duration {
    c.apply(&label_every_service_policy());
    c.kubectl_ok(&["create", "namespace", "beside-probe"]);
    // The policy takes effect once the API server has loaded it (about a second).
    c.wait_for(limit, "a new Service labelled by the policy", |c| {
        let _ = c.kubectl(&["-n", "beside-probe", "delete", "service", "probe", "--wait"]);
        let out = c.kubectl(&[
            "-n",
            "beside-probe",
            "create",
            "service",
            "clusterip",
            "probe",
            "--tcp=80:80",
            "-o",
            "jsonpath={.metadata.labels}",
        ]);
        String::from_utf8_lossy(&out.stdout).contains(SERVICE_PROXY_NAME)
    });
    c.kubectl_ok(&["delete", "namespace", "beside-probe", "--wait=false"]);
    deploy_configured(c, Proxy::Upstream, configmap, limit);
    let dir = beside_kustomization(&c.dir.join("beside-kustomization"));
    let t0 = std::time::Instant::now();
    c.kubectl_ok(&["apply", "-k", dir.to_str().expect("a UTF-8 path")]);
    c.wait_for(limit, "our proxy pods Ready beside kube-proxy", |c| {
        c.pods_ready("kube-system", Proxy::Ours.selector(), c.nodes.len())
    });
    t0.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_configmap_parses_and_keeps_the_undefaulted_file() {
        let cm: serde_json::Value = serde_saphyr::from_str(&kubeadm_configmap("nftables")).unwrap();
        let conf = cm["data"]["config.conf"].as_str().unwrap();
        assert!(conf.contains("mode: \"nftables\""), "{conf}");
        assert!(conf.contains("clusterCIDR: 10.244.0.0/16"), "{conf}");
        assert!(conf.contains("maxPerCore: null"), "{conf}");
        let kc = cm["data"]["kubeconfig.conf"].as_str().unwrap();
        assert!(
            kc.contains(&format!("server: https://{}:6443", super::super::CP_IP)),
            "{kc}"
        );
    }

    #[test]
    fn config_fields_are_replaced_or_added() {
        let cm = with_config_fields(
            &kubeadm_configmap_for("nftables", Family::Ipv4),
            &[
                (
                    "featureGates".into(),
                    "{KubeProxyNFTablesLocalhostNodePorts: true}".into(),
                ),
                ("nodePortAddresses".into(), "[primary, localhost]".into()),
            ],
        );
        let cm: serde_json::Value = serde_saphyr::from_str(&cm).unwrap();
        let conf: serde_json::Value =
            serde_saphyr::from_str(cm["data"]["config.conf"].as_str().unwrap()).unwrap();
        assert_eq!(
            conf["featureGates"]["KubeProxyNFTablesLocalhostNodePorts"],
            true
        );
        assert_eq!(
            conf["nodePortAddresses"],
            serde_json::json!(["primary", "localhost"])
        );
        assert_eq!(conf["mode"], "nftables");
    }

    #[test]
    fn kubeadm_config_holds_a_cluster_configuration_with_the_proxy_addon_on() {
        let cm: serde_json::Value =
            serde_saphyr::from_str(&kubeadm_config_for(Family::Dual)).unwrap();
        assert_eq!(cm["metadata"]["name"], "kubeadm-config");
        let text = cm["data"]["ClusterConfiguration"].as_str().unwrap();
        let cc: serde_json::Value = serde_saphyr::from_str(text).unwrap();
        assert_eq!(cc["kind"], "ClusterConfiguration");
        assert_eq!(cc["apiVersion"], "kubeadm.k8s.io/v1beta4");
        assert_eq!(cc["kubernetesVersion"], "v1.37.2");
        assert_eq!(cc["networking"]["podSubnet"], Family::Dual.cluster_cidrs());
        assert_eq!(cc["proxy"], serde_json::json!({}));
        assert!(text.contains("\nproxy: {}\n"), "{text}");
    }

    #[test]
    fn a_dual_stack_configmap_names_both_pod_ranges() {
        let cm: serde_json::Value =
            serde_saphyr::from_str(&kubeadm_configmap_for("nftables", Family::Dual)).unwrap();
        let conf = cm["data"]["config.conf"].as_str().unwrap();
        assert!(
            conf.contains("\nclusterCIDR: 10.244.0.0/16,fd00:10:244::/56\n"),
            "{conf}"
        );
        assert!(conf.contains("mode: \"nftables\""), "{conf}");
        assert_eq!(
            kubeadm_configmap_for("iptables", Family::Ipv4),
            kubeadm_configmap("iptables")
        );
    }

    #[test]
    fn an_ipv6_configmap_binds_ipv6_and_names_the_api_server_in_brackets() {
        let cm: serde_json::Value =
            serde_saphyr::from_str(&kubeadm_configmap_for("nftables", Family::Ipv6)).unwrap();
        let conf = cm["data"]["config.conf"].as_str().unwrap();
        assert!(conf.contains("\nclusterCIDR: fd00:10:244::/56\n"), "{conf}");
        assert!(conf.contains("\nbindAddress: \"::\"\n"), "{conf}");
        let kc = cm["data"]["kubeconfig.conf"].as_str().unwrap();
        assert!(kc.contains("server: https://[fd00:99::10]:6443"), "{kc}");
        assert_eq!(focus_for(Family::Ipv6), PROXY_FOCUS);
        let skip = skip_regex_for(Family::Ipv6);
        assert!(
            !skip.contains("IPv6") && skip.contains("|DualStack|"),
            "{skip}"
        );
    }

    #[test]
    fn dual_stack_adds_the_dual_stack_specs_and_stops_skipping_them() {
        assert_eq!(focus_for(Family::Ipv4), PROXY_FOCUS);
        assert_eq!(
            focus_for(Family::Dual),
            format!("{PROXY_FOCUS}|{DUAL_STACK_FOCUS}")
        );
        assert_eq!(skip_regex(), skip_regex_for(Family::Ipv4));
        assert!(skip_regex().contains(IPV6_SKIP));
        let dual = skip_regex_for(Family::Dual);
        assert!(
            !dual.contains("IPv6") && !dual.contains("DualStack"),
            "{dual}"
        );
        assert!(dual.contains(r"\[Serial\]") && dual.contains("SCTPConnectivity"));
    }

    #[test]
    fn ci_runs_dual_stack_with_the_dual_stack_specs_it_requires() {
        assert!(CI_FAMILY.is_dual());
        assert_eq!(ci_focus_for(Family::Ipv4), CI_FOCUS);
        let focus = ci_focus_for(CI_FAMILY);
        assert!(focus.starts_with(&format!("{CI_FOCUS}|")), "{focus}");
        assert!(
            focus.contains(
                r"\[Feature:IPv6DualStack\] should create service with ipv6,v4 cluster ip"
            ),
            "{focus}"
        );
        assert_eq!(regex_escape("a[b].c (d)|e"), r"a\[b\]\.c \(d\)\|e");
        // Each required spec is one the dual-stack focus selects and the skip keeps.
        let skip = skip_regex_for(CI_FAMILY);
        for must in CI_MUST_PASS_DUAL_STACK {
            assert!(must.starts_with("[Feature:IPv6DualStack] "), "{must}");
            assert!(
                !skip.contains("DualStack") && !must.contains("[Slow]"),
                "{must}"
            );
        }
    }

    #[test]
    fn the_addon_is_five_objects_naming_the_image() {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&kubeadm_addon("example/kube-proxy:v1")).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
                "DaemonSet"
            ]
        );
        assert_eq!(
            docs[4]["spec"]["template"]["spec"]["containers"][0]["image"],
            "example/kube-proxy:v1"
        );
    }

    #[test]
    fn every_skip_has_a_reason() {
        for (re, why) in SKIPS {
            assert!(!re.is_empty() && why.len() > 10, "{re}: {why}");
        }
        assert!(skip_regex().contains(r"\[Serial\]|\[Disruptive\]"));
    }
}
