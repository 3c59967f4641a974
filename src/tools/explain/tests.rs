//! Unit tests of `explain` against a fake kernel view (pure): golden texts, the JSON
//! schema, `--from` resolution and flag errors.

use super::fake::FakeView;
use super::source::unrouted_source_iif;
use super::*;

fn report(a: &[&str]) -> Result<Report, ToolError> {
    let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
    explain(
        &mut FakeView::default(),
        &args::parse("explain", USAGE, FLAGS, &a)?,
    )
}

fn text(a: &[&str]) -> Result<String, ToolError> {
    report(a).map(|r| render_text(&r))
}

#[test]
fn golden_text_for_a_node_port_from_outside() {
    let got = text(&["--from", "external", "--to", "192.168.0.2:30080"]).unwrap();
    super::super::golden("explain-nodeport-external.txt", &got);
}

/// Found by the `explain` fuzz target: an IPv6 destination from a node whose route (here,
/// the fake's) names an IPv4 source built an IPv6 header with a 4-byte address and
/// panicked. The source must be of the destination's family; this node has no IPv6 address.
#[test]
fn a_destination_of_a_family_the_node_has_no_address_in_is_a_usage_error() {
    let err = report(&["--to", "[6::a]:80/udp", "--json"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "explain: --from node: this host has no IPv6 address"
    );
}

#[test]
fn golden_text_for_an_unused_cluster_ip_port_from_a_pod() {
    let got = text(&["--from", "10.244.1.3", "--to", "10.96.0.10:81/tcp"]).unwrap();
    super::super::golden("explain-unused-port.txt", &got);
}

#[test]
fn a_rejected_packet_is_a_finding_and_a_delivered_one_is_not() {
    let rejected = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:81/tcp"]).unwrap();
    assert!(refused(&rejected));
    let delivered = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
    assert!(!refused(&delivered));
    // The exit status run() gives them (1 a finding, 0 nothing found).
    let printed = |finding| super::super::Printed {
        text: String::new(),
        finding,
    };
    assert_eq!(printed(refused(&rejected)).exit_code(), 1);
    assert_eq!(printed(refused(&delivered)).exit_code(), 0);
    let a = ["--to", "10.96.0.10:81", "--exit-zero"].map(String::from);
    assert!(args::parse("explain", USAGE, FLAGS, &a)
        .unwrap()
        .has("exit-zero"));
}

#[test]
fn pod_to_cluster_ip_reaches_both_endpoints_with_the_client_address() {
    let r = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
    let o = &r.tables[0].outcomes;
    let dests: Vec<_> = o.iter().map(|o| o.destination.clone().unwrap()).collect();
    assert_eq!(dests, ["10.244.1.2:8080", "10.244.2.2:8080"]);
    assert!(o
        .iter()
        .all(|o| !o.masquerade && (o.probability - 0.5).abs() < 1e-9));
    assert_eq!(r.iif.as_deref(), Some("veth-pod3"));
}

/// A source with no route (a pod on another node here) is taken as arriving from
/// outside, on the route to outside's interface, and the report says so instead of
/// stopping; --iif still overrides.
#[test]
fn a_source_without_a_route_arrives_as_from_outside_and_says_so() {
    let r = report(&["--from", "10.244.9.7", "--to", "192.168.0.2:30080"]).unwrap();
    assert_eq!(r.iif.as_deref(), Some("eth0"));
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("no route to 10.244.9.7") && n.contains("on eth0")),
        "{:?}",
        r.notes
    );
    assert!(!r.tables[0].outcomes.is_empty());
    let r = report(&[
        "--from",
        "10.244.9.7",
        "--iif",
        "veth9",
        "--to",
        "192.168.0.2:30080",
    ])
    .unwrap();
    assert_eq!(r.iif.as_deref(), Some("veth9"));
    // No route to outside either: an interface no rule names.
    let mut notes = Vec::new();
    let iif = unrouted_source_iif(
        &mut FakeView {
            routes: false,
            ..Default::default()
        },
        "10.244.9.7".parse().unwrap(),
        Family::Ip,
        &mut notes,
    )
    .unwrap();
    assert_eq!(iif, UNKNOWN_IIF);
    assert!(notes[0].contains("none to outside"), "{notes:?}");
}

/// `explain --json`'s field names, what scripts read (docs/operating.md): a rename
/// fails here.
#[test]
fn json_schema_is_pinned() {
    fn keys(v: &serde_json::Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }
    let r = report(&["--from", "10.244.1.3", "--to", "10.96.0.10:80"]).unwrap();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        keys(&v),
        [
            "destination",
            "iif",
            "ipvs",
            "notes",
            "protocol",
            "source",
            "tables"
        ]
    );
    assert_eq!(v["source"], "10.244.1.3:40000");
    assert_eq!(v["destination"], "10.96.0.10:80");
    assert_eq!(v["protocol"], "tcp");
    let t = &v["tables"][0];
    assert_eq!(
        keys(t),
        [
            "elements",
            "family",
            "generation",
            "outcomes",
            "rules",
            "table"
        ]
    );
    assert_eq!(
        (t["family"].as_str(), t["generation"].as_u64()),
        (Some("ip"), Some(7))
    );
    let o = &t["outcomes"][0];
    assert_eq!(
        keys(o),
        [
            "affinitySets",
            "destination",
            "detail",
            "listener",
            "masquerade",
            "masqueradeReason",
            "path",
            "probability",
            "verdict"
        ]
    );
    assert_eq!(o["verdict"], "dnat");
    assert_eq!(o["destination"], "10.244.1.2:8080");
    assert!(o["path"].as_array().is_some_and(|p| !p.is_empty()));
}

#[test]
fn bad_flags_name_the_flag() {
    let e = |a: &[&str]| text(a).unwrap_err().to_string();
    assert_eq!(
        e(&[]),
        "explain: --to is required (e.g. --to 10.96.0.10:53/udp)"
    );
    assert!(e(&["--to", "10.96.0.10"]).starts_with("explain: --to: want ADDRESS:PORT"));
    assert!(e(&["--to", "10.96.0.10:53/icmp"]).contains("unknown protocol \"icmp\""));
    assert!(e(&["--to", "10.96.0.10:53", "--from", "fd00::1"]).contains("different IP families"));
    assert!(e(&["--to", "10.96.0.10:53", "--from", "My_Pod"]).contains("--from: want an address"));
    assert!(e(&["--to", "10.96.0.10:53", "--mark", "x"]).contains("--mark"));
    assert_eq!(
        e(&["--to", "10.96.0.10:53", "--from", "prod/web-1"]),
        "explain: --from prod/web-1: no EndpointSlice in namespace prod lists Pod web-1"
    );
}

#[test]
fn a_pod_name_stands_for_its_address() {
    let r = report(&["--from", "client-0", "--to", "10.96.0.10:80"]).unwrap();
    assert_eq!(r.source, "10.244.1.3:40000");
    assert!(
        r.notes
            .iter()
            .any(|n| n == "Pod default/client-0 is 10.244.1.3"),
        "{:?}",
        r.notes
    );
}

#[test]
fn to_parses_both_families_and_protocols() {
    assert_eq!(
        parse_to("[fd00::10]:53/UDP").unwrap(),
        ("fd00::10".parse().unwrap(), 53, proto::UDP)
    );
    assert_eq!(
        parse_to("10.0.0.1:80").unwrap(),
        ("10.0.0.1".parse().unwrap(), 80, proto::TCP)
    );
}

/// A `jhash` DNAT is no coin toss: the report shows the hash of the packet's key, the slot
/// and the one endpoint in it, the very one the kernel's `nft_jhash_eval` picks.
#[test]
fn golden_text_for_a_jhash_dnat_shows_the_hash_the_slot_and_the_endpoint() {
    let a: Vec<String> = ["--from", "10.244.1.3", "--to", "10.96.0.20:80"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut view = FakeView {
        jhash: true,
        ..Default::default()
    };
    let r = explain(
        &mut view,
        &args::parse("explain", USAGE, FLAGS, &a).unwrap(),
    )
    .unwrap();
    let got = render_text(&r);
    super::super::golden("explain-jhash.txt", &got);
    // The slot by hand: 10.244.1.3 . 40000 . 10.96.0.20 . 80, each padded to 32 bits.
    let key = [10, 244, 1, 3, 0x9c, 0x40, 0, 0, 10, 96, 0, 20, 0, 80, 0, 0];
    let slot = crate::kernel::nft::jhash::nft_jhash(&key, 7, 0x4b4e_4c50, 2048);
    let eps = ["10.244.1.5", "10.244.2.5", "10.244.1.6"];
    let want = format!(
        "{}:8080",
        eps[[0, 1, 2, 0, 1, 2, 0][(slot - 2048) as usize]]
    );
    let o = &r.tables[0].outcomes;
    assert_eq!(o.len(), 1, "one flow, one endpoint: {o:?}");
    assert_eq!(o[0].destination.as_deref(), Some(want.as_str()));
    assert_eq!(o[0].probability, 1.0);
    assert!(
        o[0].path[0]
            .action
            .contains(&format!("= {} → slot {slot}, dnat to {want}", slot - 2048)),
        "{:?}",
        o[0].path
    );
    // Another source port, maybe another slot: still exactly one.
    let mut b = a.clone();
    b.extend(["--sport".to_string(), "40001".to_string()]);
    let r = explain(
        &mut view,
        &args::parse("explain", USAGE, FLAGS, &b).unwrap(),
    )
    .unwrap();
    assert_eq!(r.tables[0].outcomes.len(), 1);
}
