//! The watched kinds decoded from protobuf (k8s-pb's prost messages) into the k8s-openapi
//! types the rest of the source converts, so that both encodings feed one conversion.
//! Strings and lists are moved, not copied. Go writes every non-pointer field in protobuf,
//! zero or not, where its JSON omits the zero ones (`omitempty`): those fields, marked
//! `.omit()` below (Go's value types, checked against the real API server by
//! `real_apiserver.rs`), and empty lists and maps become `None`, as JSON's decoding gives.
//! Left out: `managedFields`, skipped on the wire unread (`decode::lenient`), and a Node's
//! images, conditions, capacity and the like, which no proxy reads. Pure.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::api::discovery::v1 as pb_discovery;
use k8s_pb::api::networking::v1 as pb_networking;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;

/// A kind this source watches, as it comes in protobuf.
pub trait ProtobufKind: Sized {
    /// The message of one object.
    type Message: prost::Message + Default;
    /// The kind its envelope names, and its list's.
    const KIND: &'static str;
    const LIST_KIND: &'static str;
    /// The typed object; `Err` says which field could not be carried over.
    fn from_message(m: Self::Message) -> Result<Self, String>;
    /// The message's `metadata` (field 1 of every kind).
    fn metadata_mut(m: &mut Self::Message) -> &mut Option<pb_meta::ObjectMeta>;
}

/// `Some(v)` unless `v` is empty, as JSON omits empty lists and maps.
fn non_empty<C: Default + PartialEq>(v: C) -> Option<C> {
    (v != C::default()).then_some(v)
}

/// A Go value-type field with `omitempty`: its zero value is JSON's absent one.
trait OmitEmpty {
    fn omit(self) -> Self;
}

impl OmitEmpty for Option<String> {
    fn omit(self) -> Self {
        self.filter(|s| !s.is_empty())
    }
}

impl OmitEmpty for Option<i32> {
    fn omit(self) -> Self {
        self.filter(|&n| n != 0)
    }
}

impl OmitEmpty for Option<i64> {
    fn omit(self) -> Self {
        self.filter(|&n| n != 0)
    }
}

impl OmitEmpty for Option<bool> {
    fn omit(self) -> Self {
        self.filter(|&b| b)
    }
}

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), as apimachinery writes an unset
/// non-pointer `metav1.Time` in protobuf; JSON writes it as null.
const GO_ZERO_TIME: i64 = -62_135_596_800;

fn time(t: pb_meta::Time) -> Result<meta::Time, String> {
    let (s, ns) = (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0));
    k8s_openapi::jiff::Timestamp::new(s, ns)
        .map(meta::Time)
        .map_err(|e| format!("time {s}s {ns}ns: {e}"))
}

/// An object's metadata.
pub fn object_meta(m: pb_meta::ObjectMeta) -> Result<meta::ObjectMeta, String> {
    let creation = m
        .creation_timestamp
        .filter(|t| {
            !matches!(
                (t.seconds, t.nanos.unwrap_or(0)),
                (None | Some(GO_ZERO_TIME), 0)
            )
        })
        .map(time)
        .transpose();
    let deletion = m.deletion_timestamp.map(time).transpose();
    Ok(meta::ObjectMeta {
        annotations: non_empty(m.annotations),
        creation_timestamp: creation.map_err(|e| format!("metadata.creationTimestamp: {e}"))?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: deletion.map_err(|e| format!("metadata.deletionTimestamp: {e}"))?,
        finalizers: non_empty(m.finalizers),
        generate_name: m.generate_name.omit(),
        generation: m.generation.omit(),
        labels: non_empty(m.labels),
        managed_fields: None,
        name: m.name.omit(),
        namespace: m.namespace.omit(),
        owner_references: non_empty(
            m.owner_references
                .into_iter()
                .map(|o| meta::OwnerReference {
                    api_version: o.api_version.unwrap_or_default(),
                    block_owner_deletion: o.block_owner_deletion,
                    controller: o.controller,
                    kind: o.kind.unwrap_or_default(),
                    name: o.name.unwrap_or_default(),
                    uid: o.uid.unwrap_or_default(),
                })
                .collect::<Vec<_>>(),
        ),
        resource_version: m.resource_version.omit(),
        self_link: m.self_link.omit(),
        uid: m.uid.omit(),
    })
}

fn metadata(m: Option<pb_meta::ObjectMeta>) -> Result<meta::ObjectMeta, String> {
    object_meta(m.unwrap_or_default())
}

fn int_or_string(v: k8s_pb::apimachinery::pkg::util::intstr::IntOrString) -> IntOrString {
    // apimachinery's Type: 0 Int, 1 String.
    match v.r#type {
        Some(1) => IntOrString::String(v.str_val.unwrap_or_default()),
        _ => IntOrString::Int(v.int_val.unwrap_or(0)),
    }
}

fn service_spec(s: pb_core::ServiceSpec) -> core::ServiceSpec {
    core::ServiceSpec {
        allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
        cluster_ip: s.cluster_ip.omit(),
        cluster_ips: non_empty(s.cluster_ips),
        external_ips: non_empty(s.external_ips),
        external_name: s.external_name.omit(),
        external_traffic_policy: s.external_traffic_policy.omit(),
        health_check_node_port: s.health_check_node_port.omit(),
        internal_traffic_policy: s.internal_traffic_policy,
        ip_families: non_empty(s.ip_families),
        ip_family_policy: s.ip_family_policy,
        load_balancer_class: s.load_balancer_class,
        load_balancer_ip: s.load_balancer_ip.omit(),
        load_balancer_source_ranges: non_empty(s.load_balancer_source_ranges),
        ports: non_empty(
            s.ports
                .into_iter()
                .map(|p| core::ServicePort {
                    app_protocol: p.app_protocol,
                    name: p.name.omit(),
                    node_port: p.node_port.omit(),
                    port: p.port.unwrap_or(0),
                    protocol: p.protocol.omit(),
                    target_port: p.target_port.map(int_or_string),
                })
                .collect::<Vec<_>>(),
        ),
        publish_not_ready_addresses: s.publish_not_ready_addresses.omit(),
        selector: non_empty(s.selector),
        session_affinity: s.session_affinity.omit(),
        session_affinity_config: s
            .session_affinity_config
            .map(|c| core::SessionAffinityConfig {
                client_ip: c.client_ip.map(|c| core::ClientIPConfig {
                    timeout_seconds: c.timeout_seconds,
                }),
            }),
        traffic_distribution: s.traffic_distribution,
        type_: s.r#type.omit(),
    }
}

fn service_status(s: pb_core::ServiceStatus) -> core::ServiceStatus {
    core::ServiceStatus {
        conditions: None,
        load_balancer: s.load_balancer.map(|lb| core::LoadBalancerStatus {
            ingress: non_empty(
                lb.ingress
                    .into_iter()
                    .map(|i| core::LoadBalancerIngress {
                        hostname: i.hostname.omit(),
                        ip: i.ip.omit(),
                        ip_mode: i.ip_mode,
                        ports: non_empty(
                            i.ports
                                .into_iter()
                                .map(|p| core::PortStatus {
                                    error: p.error,
                                    port: p.port.unwrap_or(0),
                                    protocol: p.protocol.unwrap_or_default(),
                                })
                                .collect::<Vec<_>>(),
                        ),
                    })
                    .collect::<Vec<_>>(),
            ),
        }),
    }
}

impl ProtobufKind for core::Service {
    type Message = pb_core::Service;
    const KIND: &'static str = "Service";
    const LIST_KIND: &'static str = "ServiceList";
    fn metadata_mut(m: &mut pb_core::Service) -> &mut Option<pb_meta::ObjectMeta> {
        &mut m.metadata
    }
    fn from_message(m: pb_core::Service) -> Result<Self, String> {
        Ok(core::Service {
            metadata: metadata(m.metadata)?,
            spec: m.spec.map(service_spec),
            status: m.status.map(service_status),
        })
    }
}

fn endpoint(e: pb_discovery::Endpoint) -> discovery::Endpoint {
    discovery::Endpoint {
        addresses: e.addresses,
        conditions: e.conditions.map(|c| discovery::EndpointConditions {
            ready: c.ready,
            serving: c.serving,
            terminating: c.terminating,
        }),
        deprecated_topology: None,
        hints: e.hints.map(|h| discovery::EndpointHints {
            for_nodes: non_empty(
                h.for_nodes
                    .into_iter()
                    .map(|n| discovery::ForNode {
                        name: n.name.unwrap_or_default(),
                    })
                    .collect::<Vec<_>>(),
            ),
            for_zones: non_empty(
                h.for_zones
                    .into_iter()
                    .map(|z| discovery::ForZone {
                        name: z.name.unwrap_or_default(),
                    })
                    .collect::<Vec<_>>(),
            ),
        }),
        hostname: e.hostname,
        node_name: e.node_name,
        target_ref: e.target_ref.map(|r| core::ObjectReference {
            api_version: r.api_version.omit(),
            field_path: r.field_path.omit(),
            kind: r.kind.omit(),
            name: r.name.omit(),
            namespace: r.namespace.omit(),
            resource_version: r.resource_version.omit(),
            uid: r.uid.omit(),
        }),
        zone: e.zone,
    }
}

impl ProtobufKind for discovery::EndpointSlice {
    type Message = pb_discovery::EndpointSlice;
    const KIND: &'static str = "EndpointSlice";
    const LIST_KIND: &'static str = "EndpointSliceList";
    fn metadata_mut(m: &mut pb_discovery::EndpointSlice) -> &mut Option<pb_meta::ObjectMeta> {
        &mut m.metadata
    }
    fn from_message(m: pb_discovery::EndpointSlice) -> Result<Self, String> {
        Ok(discovery::EndpointSlice {
            address_type: m.address_type.unwrap_or_default(),
            // Not omitempty in Go: JSON carries `"endpoints": []` or null; either is none.
            endpoints: non_empty(m.endpoints.into_iter().map(endpoint).collect::<Vec<_>>()),
            metadata: metadata(m.metadata)?,
            ports: non_empty(
                m.ports
                    .into_iter()
                    .map(|p| discovery::EndpointPort {
                        app_protocol: p.app_protocol,
                        name: p.name,
                        port: p.port,
                        protocol: p.protocol,
                    })
                    .collect::<Vec<_>>(),
            ),
        })
    }
}

impl ProtobufKind for core::Node {
    type Message = pb_core::Node;
    const KIND: &'static str = "Node";
    const LIST_KIND: &'static str = "NodeList";
    fn metadata_mut(m: &mut pb_core::Node) -> &mut Option<pb_meta::ObjectMeta> {
        &mut m.metadata
    }
    fn from_message(m: pb_core::Node) -> Result<Self, String> {
        Ok(core::Node {
            metadata: metadata(m.metadata)?,
            spec: m.spec.map(|s| core::NodeSpec {
                pod_cidr: s.pod_cidr.omit(),
                pod_cidrs: non_empty(s.pod_cid_rs),
                provider_id: s.provider_id.omit(),
                unschedulable: s.unschedulable.omit(),
                ..Default::default()
            }),
            status: m.status.map(|s| core::NodeStatus {
                addresses: non_empty(
                    s.addresses
                        .into_iter()
                        .map(|a| core::NodeAddress {
                            address: a.address.unwrap_or_default(),
                            type_: a.r#type.unwrap_or_default(),
                        })
                        .collect::<Vec<_>>(),
                ),
                ..Default::default()
            }),
        })
    }
}

impl ProtobufKind for networking::ServiceCIDR {
    type Message = pb_networking::ServiceCIDR;
    const KIND: &'static str = "ServiceCIDR";
    const LIST_KIND: &'static str = "ServiceCIDRList";
    fn metadata_mut(m: &mut pb_networking::ServiceCIDR) -> &mut Option<pb_meta::ObjectMeta> {
        &mut m.metadata
    }
    fn from_message(m: pb_networking::ServiceCIDR) -> Result<Self, String> {
        Ok(networking::ServiceCIDR {
            metadata: metadata(m.metadata)?,
            spec: m.spec.map(|s| networking::ServiceCIDRSpec {
                cidrs: non_empty(s.cidrs),
            }),
            status: None,
        })
    }
}

/// An API `Status` (a watch's ERROR event, an error response).
pub fn status(s: pb_meta::Status) -> kube::core::Status {
    kube::core::Status {
        status: match s.status.as_deref() {
            Some("Success") => Some(kube::core::response::StatusSummary::Success),
            Some("Failure") => Some(kube::core::response::StatusSummary::Failure),
            _ => None,
        },
        code: s.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
        message: s.message.unwrap_or_default(),
        metadata: None,
        reason: s.reason.unwrap_or_default(),
        details: s.details.map(status_details),
    }
}

fn status_details(d: pb_meta::StatusDetails) -> kube::core::response::StatusDetails {
    kube::core::response::StatusDetails {
        name: d.name.unwrap_or_default(),
        group: d.group.unwrap_or_default(),
        kind: d.kind.unwrap_or_default(),
        uid: d.uid.unwrap_or_default(),
        causes: Vec::new(),
        retry_after_seconds: d
            .retry_after_seconds
            .and_then(|s| u32::try_from(s).ok())
            .unwrap_or(0),
    }
}
