//! `kube-nlproxy explain` against real packets: every flow of the differential table
//! (ClusterIP, NodePort, externalIPs, LB IPs with source ranges, both traffic policies,
//! terminating endpoints, topology, affinity, no endpoints, hairpin, IPv6, UDP) through the
//! namespace cluster, then through `explain` reading the live kernel; the endpoints that
//! answer, the source they saw, and refused versus dropped must be what explain said.

use netlink_tests::apiserver::ApiServer;
use netlink_tests::differential::{check_explained, objects, wait_ours_programmed};
use netlink_tests::scenario::{web_cluster, Backends};

/// Served by our localhost NodePort listener (a socket, not a rule): explain says the
/// packet is accepted to this host and cannot name the endpoint behind the socket.
const UNEXPLAINED: &[&str] = &["NodePort via localhost"];

#[test]
fn explain_says_what_real_packets_do_in_nftables_mode() {
    let c = web_cluster(Backends {
        ipv6: true,
        udp: true,
    });
    let api = c.node.run(ApiServer::start);
    for o in objects() {
        api.apply(o);
    }
    let d = c.start_daemon_with(&["--master", &api.url()]);
    wait_ours_programmed(&c, "ours", &|| d.log_text());
    check_explained(&c, UNEXPLAINED, &|| d.log_text());
}
