//! Protobuf bodies and watch frames decoded into the watcher's objects: each object on its
//! own ([`Lenient`]), so that one undecodable object is skipped alone. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use prost::bytes::Buf;
use prost::encoding::{decode_key, merge_loop, skip_field, DecodeContext, WireType};
use prost::Message;

use super::objects::{object_meta, status, ProtobufKind};
use super::wire::{self, WireError};
use crate::source::kube::Lenient;

/// One object's message decoded and carried over, or its metadata and why not.
pub fn lenient<K: ProtobufKind>(bytes: &[u8]) -> Lenient<K> {
    let decoded = message::<K>(bytes)
        .map_err(|e| e.to_string())
        .and_then(K::from_message);
    match decoded {
        Ok(k) => Lenient::Decoded(k),
        Err(error) => Lenient::Undecodable {
            metadata: Box::new(metadata_only(bytes).unwrap_or_default()),
            error,
        },
    }
}

/// `metadata.managedFields`' field number in `ObjectMeta`.
const MANAGED_FIELDS: u32 = 17;

/// An object's message, as `K::Message::decode` gives it but without
/// `metadata.managedFields`, which no proxy reads (entries of five strings and a byte string
/// each; decoding and dropping them was 10% of a watch event's decode in instructions,
/// BENCHMARKS.md "Fleet"): skipped on the wire instead. The fields are merged one by one as prost's own
/// derived `merge` does (`Message::merge_field`, the per-field step every prost message
/// implements).
fn message<K: ProtobufKind>(mut buf: &[u8]) -> Result<K::Message, prost::DecodeError> {
    let mut m = K::Message::default();
    // prost's recursion budget (100 levels) is not lowered for `metadata` here, as its own
    // `merge` would: `enter_recursion` is private. One level of 100, on a depth-bounded
    // kind.
    let ctx = DecodeContext::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            let meta = K::metadata_mut(&mut m).get_or_insert_with(Default::default);
            merge_loop(meta, &mut buf, ctx.clone(), |meta, buf, ctx| {
                let (tag, wire_type) = decode_key(buf)?;
                if tag == MANAGED_FIELDS {
                    skip_field(wire_type, tag, buf, ctx)
                } else {
                    meta.merge_field(tag, wire_type, buf, ctx)
                }
            })?;
        } else {
            m.merge_field(tag, wire_type, &mut buf, ctx.clone())?;
        }
    }
    Ok(m)
}

/// An object's `metadata` (field 1 of every kind) alone, when the rest does not decode.
fn metadata_only(object: &[u8]) -> Option<ObjectMeta> {
    let [meta] = wire::Fields::new("an object", object)
        .last_bytes([1])
        .ok()?;
    let meta = pb_meta::ObjectMeta::decode(meta).ok()?;
    object_meta(meta).ok()
}

/// A decoded list page.
#[derive(Debug)]
pub struct ListPage<K> {
    pub resource_version: String,
    pub continue_token: String,
    pub items: Vec<Lenient<K>>,
}

/// A list response's body (`k8s\0`, the envelope, a `…List`).
pub fn list<K: ProtobufKind>(body: &[u8]) -> Result<ListPage<K>, WireError> {
    let parts = wire::list_parts(wire::object_of(body, K::LIST_KIND)?)?;
    Ok(ListPage {
        resource_version: parts.resource_version.to_string(),
        continue_token: parts.continue_token.to_string(),
        items: parts.items.into_iter().map(lenient).collect(),
    })
}

/// One watch event.
#[derive(Debug)]
pub enum WatchEvent<K> {
    Added(Lenient<K>),
    Modified(Lenient<K>),
    Deleted(Lenient<K>),
    /// A bookmark's resourceVersion, and whether it ends a streaming list
    /// (`k8s.io/initial-events-end`).
    Bookmark {
        resource_version: String,
        initial_events_end: bool,
    },
    Error(Box<kube::core::Status>),
}

/// One watch frame.
pub fn watch_event<K: ProtobufKind>(frame: &[u8]) -> Result<WatchEvent<K>, WireError> {
    let parts = wire::watch_parts(frame)?;
    let wrong_kind = |expected: &'static str| WireError::Kind {
        expected,
        found: parts.kind.to_string(),
    };
    let object_kind_ok = parts.kind.is_empty() || parts.kind == K::KIND;
    Ok(match parts.event_type {
        "ADDED" | "MODIFIED" | "DELETED" if !object_kind_ok => return Err(wrong_kind(K::KIND)),
        "ADDED" => WatchEvent::Added(lenient(parts.object)),
        "MODIFIED" => WatchEvent::Modified(lenient(parts.object)),
        "DELETED" => WatchEvent::Deleted(lenient(parts.object)),
        "BOOKMARK" => {
            let meta = metadata_only(parts.object).unwrap_or_default();
            WatchEvent::Bookmark {
                resource_version: meta.resource_version.unwrap_or_default(),
                initial_events_end: meta
                    .annotations
                    .is_some_and(|a| a.contains_key("k8s.io/initial-events-end")),
            }
        }
        "ERROR" if parts.kind.is_empty() || parts.kind == "Status" => {
            let s = k8s_pb::apimachinery::pkg::apis::meta::v1::Status::decode(parts.object)
                .map_err(|e| WireError::Malformed {
                    what: "a watch error's Status",
                    detail: e.to_string(),
                })?;
            WatchEvent::Error(Box::new(status(s)))
        }
        "ERROR" => return Err(wrong_kind("Status")),
        other => {
            return Err(WireError::Malformed {
                what: "a watch event",
                detail: format!("event type {other:?}"),
            })
        }
    })
}

/// An error response's `Status`, when the body is one in protobuf.
pub fn error_status(body: &[u8]) -> Option<kube::core::Status> {
    let raw = wire::object_of(body, "Status").ok()?;
    k8s_pb::apimachinery::pkg::apis::meta::v1::Status::decode(raw)
        .ok()
        .map(status)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_pb::api::core::v1 as pb_core;
    use k8s_pb::api::discovery::v1 as pb_discovery;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;

    /// A body in a v1 envelope of `kind`.
    pub fn enveloped(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        wire::fixtures::enveloped("v1", kind, raw)
    }

    pub fn meta(ns: &str, name: &str, rv: &str) -> pb_meta::ObjectMeta {
        pb_meta::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    pub fn service(name: &str, cluster_ip: &str, port: i32) -> pb_core::Service {
        pb_core::Service {
            metadata: Some(meta("default", name, "7")),
            spec: Some(pb_core::ServiceSpec {
                cluster_ip: Some(cluster_ip.into()),
                cluster_ips: vec![cluster_ip.into()],
                r#type: Some("ClusterIP".into()),
                ports: vec![pb_core::ServicePort {
                    name: Some("http".into()),
                    protocol: Some("TCP".into()),
                    port: Some(port),
                    target_port: Some(k8s_pb::apimachinery::pkg::util::intstr::IntOrString {
                        r#type: Some(1),
                        str_val: Some("web".into()),
                        int_val: None,
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn frame(event_type: &str, kind: &str, object: Vec<u8>) -> Vec<u8> {
        wire::fixtures::event(event_type, kind, object)
    }

    #[test]
    fn a_list_with_one_broken_service_keeps_the_others() {
        let mut items = pb_core::ServiceList {
            metadata: Some(pb_meta::ListMeta {
                resource_version: Some("100".into()),
                ..Default::default()
            }),
            items: vec![service("a", "10.0.0.1", 80), service("c", "10.0.0.3", 443)],
        }
        .encode_to_vec();
        // Item "b": its metadata decodes, its spec is a varint where a message belongs.
        let mut b = pb_meta::ObjectMeta {
            name: Some("b".into()),
            namespace: Some("default".into()),
            ..Default::default()
        }
        .encode_to_vec();
        b.splice(0..0, [0x0a, b.len() as u8]);
        b.extend_from_slice(&[0x10, 0x01]);
        items.extend_from_slice(&[0x12, b.len() as u8]);
        items.extend_from_slice(&b);
        let page = list::<Service>(&enveloped("ServiceList", items)).unwrap();
        assert_eq!(page.resource_version, "100");
        let names: Vec<_> = page
            .items
            .into_iter()
            .map(|l| match l {
                Lenient::Decoded(s) => (s.metadata.name.unwrap(), None),
                Lenient::Undecodable { metadata, error } => (metadata.name.unwrap(), Some(error)),
            })
            .collect();
        assert_eq!(names[0], ("a".to_string(), None));
        assert_eq!(names[1], ("c".to_string(), None));
        assert_eq!(names[2].0, "b");
        assert!(
            names[2].1.as_deref().unwrap().contains("Service.spec"),
            "{names:?}"
        );
    }

    #[test]
    fn a_service_carries_over_what_the_json_path_reads() {
        let Lenient::Decoded(s) =
            lenient::<Service>(&service("web", "10.0.0.1", 80).encode_to_vec())
        else {
            panic!("decodes")
        };
        let json: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7"},
            "spec": {"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "type": "ClusterIP",
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80,
                                "targetPort": "web"}]}
        }))
        .unwrap();
        assert_eq!(s, json);
    }

    /// Go writes its non-pointer fields in protobuf even when zero (as the real API server
    /// does: `nodePort: 0`, `externalName: ""`, `generation: 0`, an unset time as Go's
    /// zero time); JSON omits them, and both encodings must give the same object.
    #[test]
    fn zero_values_go_writes_are_what_json_omits() {
        let mut svc = service("web", "10.0.0.1", 80);
        let m = svc.metadata.as_mut().unwrap();
        m.generate_name = Some(String::new());
        m.generation = Some(0);
        m.self_link = Some(String::new());
        m.creation_timestamp = Some(pb_meta::Time {
            seconds: Some(-62_135_596_800),
            nanos: Some(0),
        });
        let spec = svc.spec.as_mut().unwrap();
        spec.external_name = Some(String::new());
        spec.external_traffic_policy = Some(String::new());
        spec.health_check_node_port = Some(0);
        spec.load_balancer_ip = Some(String::new());
        spec.publish_not_ready_addresses = Some(false);
        spec.ports[0].node_port = Some(0);
        // A pointer field keeps its zero: `allocateLoadBalancerNodePorts: false` is said.
        spec.allocate_load_balancer_node_ports = Some(false);
        let Lenient::Decoded(s) = lenient::<Service>(&svc.encode_to_vec()) else {
            panic!("decodes")
        };
        let json: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7"},
            "spec": {"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1"], "type": "ClusterIP",
                     "allocateLoadBalancerNodePorts": false,
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80,
                                "targetPort": "web"}]}
        }))
        .unwrap();
        assert_eq!(s, json);
    }

    #[test]
    fn a_slice_carries_over_what_the_json_path_reads() {
        let slice = pb_discovery::EndpointSlice {
            metadata: Some(pb_meta::ObjectMeta {
                labels: [("kubernetes.io/service-name".to_string(), "web".to_string())].into(),
                ..meta("default", "web-abc", "9")
            }),
            address_type: Some("IPv4".into()),
            endpoints: vec![pb_discovery::Endpoint {
                addresses: vec!["10.1.0.5".into()],
                conditions: Some(pb_discovery::EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: Some("n1".into()),
                zone: Some("z1".into()),
                hints: Some(pb_discovery::EndpointHints {
                    for_zones: vec![pb_discovery::ForZone {
                        name: Some("z1".into()),
                    }],
                    for_nodes: vec![],
                }),
                ..Default::default()
            }],
            ports: vec![pb_discovery::EndpointPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(8080),
                app_protocol: None,
            }],
        };
        let Lenient::Decoded(s) = lenient::<EndpointSlice>(&slice.encode_to_vec()) else {
            panic!("decodes")
        };
        let json: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-abc", "namespace": "default", "resourceVersion": "9",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.5"], "nodeName": "n1", "zone": "z1",
                           "conditions": {"ready": true, "serving": true, "terminating": false},
                           "hints": {"forZones": [{"name": "z1"}]}}],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
        }))
        .unwrap();
        assert_eq!(s, json);
    }

    /// `metadata.managedFields` is skipped on the wire, unread: entries that are not even
    /// valid protobuf do not fail the object, and everything around them is kept. A
    /// `metadata` written in two parts is merged, as protobuf has it.
    #[test]
    fn managed_fields_are_skipped_unread_and_metadata_parts_merge() {
        let entry = pb_meta::ManagedFieldsEntry {
            manager: Some("kube-controller-manager".into()),
            fields_v1: Some(pb_meta::FieldsV1 {
                raw: Some(br#"{"f:endpoints":{}}"#.to_vec()),
            }),
            ..Default::default()
        };
        let first = pb_meta::ObjectMeta {
            managed_fields: vec![entry],
            ..meta("default", "web-abc", "9")
        };
        let mut meta_bytes = first.encode_to_vec();
        // A managedFields entry (field 17, length-delimited) of a varint key with no value.
        meta_bytes.extend_from_slice(&[0x8a, 0x01, 0x01, 0x08]);
        let second = pb_meta::ObjectMeta {
            labels: [("kubernetes.io/service-name".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        let mut object = Vec::new();
        for m in [meta_bytes, second.encode_to_vec()] {
            object.push(0x0a);
            prost::encoding::encode_varint(m.len() as u64, &mut object);
            object.extend_from_slice(&m);
        }
        object.extend(
            pb_discovery::EndpointSlice {
                address_type: Some("IPv4".into()),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert!(
            pb_discovery::EndpointSlice::decode(&object[..]).is_err(),
            "the entry is invalid for prost's own decode"
        );
        let Lenient::Decoded(s) = lenient::<EndpointSlice>(&object) else {
            panic!("decodes without reading managedFields")
        };
        let m = &s.metadata;
        assert_eq!(m.name.as_deref(), Some("web-abc"));
        assert_eq!(m.resource_version.as_deref(), Some("9"));
        assert_eq!(m.managed_fields, None);
        assert_eq!(
            m.labels.as_ref().unwrap()["kubernetes.io/service-name"],
            "web"
        );
        assert_eq!(s.address_type, "IPv4");
    }

    #[test]
    fn watch_events_of_every_type() {
        let svc = service("web", "10.0.0.1", 80).encode_to_vec();
        for (t, want) in [
            ("ADDED", "added"),
            ("MODIFIED", "modified"),
            ("DELETED", "deleted"),
        ] {
            let got = match watch_event::<Service>(&frame(t, "Service", svc.clone())).unwrap() {
                WatchEvent::Added(Lenient::Decoded(_)) => "added",
                WatchEvent::Modified(Lenient::Decoded(_)) => "modified",
                WatchEvent::Deleted(Lenient::Decoded(_)) => "deleted",
                other => panic!("{other:?}"),
            };
            assert_eq!(got, want);
        }
        let bookmark = pb_core::Service {
            metadata: Some(pb_meta::ObjectMeta {
                resource_version: Some("55".into()),
                annotations: [("k8s.io/initial-events-end".to_string(), "true".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match watch_event::<Service>(&frame("BOOKMARK", "Service", bookmark.encode_to_vec())) {
            Ok(WatchEvent::Bookmark {
                resource_version,
                initial_events_end: true,
            }) => assert_eq!(resource_version, "55"),
            other => panic!("{other:?}"),
        }
        let gone = pb_meta::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            message: Some("too old resource version".into()),
            ..Default::default()
        };
        match watch_event::<Service>(&frame("ERROR", "Status", gone.encode_to_vec())) {
            Ok(WatchEvent::Error(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            watch_event::<Service>(&frame("ADDED", "Pod", svc.clone())),
            Err(WireError::Kind { .. })
        ));
        assert!(matches!(
            watch_event::<Service>(&frame("RENAMED", "Service", svc)),
            Err(WireError::Malformed { .. })
        ));
    }

    #[test]
    fn error_bodies_in_protobuf() {
        let forbidden = pb_meta::Status {
            code: Some(403),
            reason: Some("Forbidden".into()),
            ..Default::default()
        };
        let s = error_status(&enveloped("Status", forbidden.encode_to_vec())).unwrap();
        assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
        assert!(error_status(b"{\"kind\":\"Status\"}").is_none());
    }
}
