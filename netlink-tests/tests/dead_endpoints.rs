//! `--reset-dead-endpoint-connections` with real TCP connections: a client in a pod holds a
//! connection through the ClusterIP to endpoint A; A dies (its slice entry vanishes while it
//! was ready, its pod goes silent) and B takes over. With the flag the client's next send is
//! answered by a reset within a second; without it (upstream's behaviour) the client hangs.
//! An endpoint that drains (terminating, then gone) keeps its connection with the flag.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools

use std::io::ErrorKind;
use std::time::{Duration, Instant};

use netlink_tests::backend::{tcp_backend, OpenConn, Reply};
use netlink_tests::cluster::yaml::SliceEndpoint;
use netlink_tests::cluster::{sa, yaml, Cluster, Daemon};

const A: &str = "10.244.1.2";
const B: &str = "10.244.1.4";
/// An endpoint without a pod, only ever added.
const C: &str = "10.244.1.5";
const CLUSTER_IP: &str = "10.96.0.80";
const FLAG: &str = "--reset-dead-endpoint-connections";
const LOG_LINE: &str = "deleted TCP conntrack entries of endpoints that died";

/// The Service web (TCP 80 → 8080) with endpoints `eps`.
fn web(eps: &[SliceEndpoint]) -> String {
    yaml::service(
        "default",
        "web",
        &[CLUSTER_IP],
        &[("http", "TCP", 80, 0)],
        "",
    ) + &yaml::slice(
        "default",
        "web",
        "web-1",
        "IPv4",
        ("http", "TCP", 8080),
        eps,
    )
}

/// pods: 0 = A, 1 = B, 2 = the client (10.244.1.3); A and B serve TCP 8080.
fn cluster() -> Cluster {
    let mut c = Cluster::new();
    c.add_pod(2);
    c.add_pod(4);
    c.add_pod(3);
    tcp_backend(&c.pods[0], "A", sa(A, 8080));
    tcp_backend(&c.pods[1], "B", sa(B, 8080));
    c
}

/// Starts the daemon with A as the only endpoint and opens the client's connection to A.
fn connected_to_a(c: &Cluster, extra: &[&str]) -> (Daemon, OpenConn) {
    let d = c.start_daemon(&web(&[yaml::ready(A, "node1")]), extra);
    let mut conn = OpenConn::open(&c.pods[2], sa(CLUSTER_IP, 80));
    assert!(
        matches!(&conn.greeting, Reply::Answered { name, .. } if name == "A"),
        "the connection reaches A: {:?}",
        conn.greeting
    );
    assert_eq!(conn.echo("hello").expect("echo through A"), "hello");
    (d, conn)
}

/// A dies: its slice entry vanishes while ready, B takes over, and A's pod goes silent.
fn a_dies(c: &Cluster) {
    c.write_manifests(&web(&[yaml::ready(B, "node1")]));
    c.wait_ruleset("ip", "endpoint B", |r| r.contains(B) && !r.contains(A));
    c.pods[0].ip("link set eth0 down");
}

#[test]
fn with_the_flag_a_client_of_a_dead_endpoint_gets_a_reset() {
    let c = cluster();
    let (d, mut conn) = connected_to_a(&c, &[FLAG]);
    a_dies(&c);
    d.wait_for_log(LOG_LINE, 1);
    let t = Instant::now();
    let res = conn.echo("are you there");
    let took = t.elapsed();
    match res {
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::ConnectionReset,
            "a reset, not {e} after {took:?}"
        ),
        Ok(got) => panic!("the dead endpoint's connection still answered {got:?}"),
    }
    assert!(took < Duration::from_secs(1), "reset after {took:?}");
}

#[test]
fn without_the_flag_a_client_of_a_dead_endpoint_hangs_as_upstream() {
    let c = cluster();
    let (d, mut conn) = connected_to_a(&c, &[]);
    a_dies(&c);
    // The sync that removed A is done (the ruleset shows it); give a deletion, if any, the
    // time the flagged run needs.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!d.log_text().contains(LOG_LINE), "nothing deleted");
    match conn.echo("are you there") {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "the client waits (read timeout), not {e}"
        ),
        Ok(got) => panic!("a silent endpoint answered {got:?}"),
    }
}

#[test]
fn with_the_flag_a_draining_endpoint_keeps_its_connection_until_it_is_gone() {
    let c = cluster();
    let (d, mut conn) = connected_to_a(&c, &[FLAG]);
    // A terminates (still serving) while B takes new connections...
    let a_terminating = yaml::ready(A, "node1").not_ready().terminating();
    c.write_manifests(&web(&[a_terminating, yaml::ready(B, "node1")]));
    c.wait_ruleset("ip", "endpoint B", |r| r.contains(B));
    assert_eq!(conn.echo("draining").expect("A still serves"), "draining");
    // ...then leaves the slice: it went through terminating, so its flow is kept. (C, an
    // endpoint added in the same change, shows in the ruleset when the change is synced;
    // A, terminating beside a ready B, was in no rule already.)
    c.write_manifests(&web(&[yaml::ready(B, "node1"), yaml::ready(C, "node1")]));
    c.wait_ruleset("ip", "A removed, C added", |r| r.contains(C));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        conn.echo("still here").expect("A's flow kept"),
        "still here"
    );
    assert!(!d.log_text().contains(LOG_LINE), "nothing deleted");
}
