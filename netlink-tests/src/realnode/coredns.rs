//! CoreDNS as kubeadm's addon installs it, behind Service `kube-system/kube-dns`, for a
//! cluster in either family.
//!
//! Pure text.

use super::{images, Family};

/// kubeadm's CoreDNS addon (v1.37: ServiceAccount, ClusterRole `system:coredns` and its
/// binding, the Corefile, the Deployment, Service `kube-dns`), one replica, with the CoreDNS
/// image the harness imports. In a dual-stack cluster kube-dns is `PreferDualStack` with a
/// ClusterIP in each family (kubeadm's own Service is single-stack); the `kubernetes`
/// plugin answers AAAA for dual-stack Services either way.
pub(super) fn manifest(family: Family) -> String {
    // IPv4 keeps kubeadm's Service word for word.
    let cluster_ips = if family.is_dual() {
        format!(
            "\n  ipFamilyPolicy: {}\n  clusterIPs: [{}]",
            family.dns_policy(),
            family.dns_ips().join(", ")
        )
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects:
- {{kind: ServiceAccount, name: coredns, namespace: kube-system}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health {{
           lameduck 5s
        }}
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
           pods insecure
           fallthrough in-addr.arpa ip6.arpa
           ttl 30
        }}
        prometheus :9153
        forward . /etc/resolv.conf {{
           max_concurrent 1000
        }}
        cache 30
        loop
        reload
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata:
      labels: {{k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      tolerations:
      - {{key: CriticalAddonsOnly, operator: Exists}}
      - {{key: node-role.kubernetes.io/control-plane, effect: NoSchedule}}
      containers:
      - name: coredns
        image: {image}
        imagePullPolicy: IfNotPresent
        args: ["-conf", "/etc/coredns/Corefile"]
        volumeMounts:
        - {{name: config-volume, mountPath: /etc/coredns, readOnly: true}}
        ports:
        - {{containerPort: 53, name: dns, protocol: UDP}}
        - {{containerPort: 53, name: dns-tcp, protocol: TCP}}
        - {{containerPort: 9153, name: metrics, protocol: TCP}}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {{add: [NET_BIND_SERVICE], drop: [ALL]}}
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet: {{path: /health, port: 8080, scheme: HTTP}}
          initialDelaySeconds: 60
          timeoutSeconds: 5
          failureThreshold: 5
        readinessProbe:
          httpGet: {{path: /ready, port: 8181, scheme: HTTP}}
      dnsPolicy: Default
      volumes:
      - name: config-volume
        configMap:
          name: coredns
          items: [{{key: Corefile, path: Corefile}}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns, kubernetes.io/cluster-service: "true", kubernetes.io/name: CoreDNS}}
spec:
  selector: {{k8s-app: kube-dns}}
  clusterIP: {dns_ip}{cluster_ips}
  ports:
  - {{name: dns, port: 53, protocol: UDP, targetPort: 53}}
  - {{name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}}
  - {{name: metrics, port: 9153, protocol: TCP, targetPort: 9153}}
"#,
        image = images::COREDNS,
        dns_ip = family.primary().dns_ip(),
    )
}

#[cfg(test)]
mod tests {
    use super::super::DNS_IP;
    use super::*;

    #[test]
    fn kube_dns_is_single_stack_as_kubeadm_writes_it_on_ipv4() {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&manifest(Family::Ipv4)).unwrap();
        let svc = docs.iter().find(|d| d["kind"] == "Service").unwrap();
        assert_eq!(svc["spec"]["clusterIP"], DNS_IP);
        assert!(svc["spec"].get("clusterIPs").is_none(), "{svc}");
        assert!(svc["spec"].get("ipFamilyPolicy").is_none(), "{svc}");
    }

    #[test]
    fn kube_dns_has_a_cluster_ip_per_family_on_dual_stack() {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&manifest(Family::Dual)).unwrap();
        let svc = docs.iter().find(|d| d["kind"] == "Service").unwrap();
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(
            svc["spec"]["clusterIPs"],
            serde_json::json!(["10.96.0.10", "fd00:96::a"])
        );
        assert_eq!(svc["spec"]["ipFamilyPolicy"], "PreferDualStack");
    }
}
