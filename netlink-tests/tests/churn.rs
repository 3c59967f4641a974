//! Churn: 60 s of 100 endpoint changes per second across 1,000 Services, from a manifest
//! directory. Afterwards the kernel state equals what a fresh full sync produces (so no
//! update was lost), memory is back near its baseline, and other programs writing their own
//! tables meanwhile never made a sync fail nor lost anything of theirs.
#![allow(clippy::disallowed_methods)] // tests may run test-time tools
#![allow(unsafe_code)] // kill(2), setns(2), geteuid(2) and socket calls on test processes

use netlink_tests::bounded::{OutputWithin, TEST_LIMIT};
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_nlproxy::kernel::nft::netlink::NetlinkNftables;
use kube_nlproxy::kernel::nft::Family;
use netlink_tests::cluster::proxy_bin;
use netlink_tests::listing::kernel_listing;
use netlink_tests::ns::{require_root, NetNs};

const SERVICES: usize = 1000;

fn write_service(dir: &Path, i: usize, generation: usize) {
    let ep2 = format!("10.{}.{}.{}", 100 + generation % 100, i / 250, i % 250 + 1);
    let y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: churn}}\nspec: {{clusterIP: 10.96.{}.{}, ports: [{{name: p, port: 80}}]}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: s{i}-a, namespace: churn, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
         addressType: IPv4\nports: [{{name: p, port: 8080}}]\nendpoints: [{{addresses: [10.244.{}.{}]}}, {{addresses: [{ep2}]}}]\n",
        i / 250,
        i % 250 + 1,
        i / 250,
        i % 250 + 1
    );
    let tmp = dir.join(format!(".s{i}.tmp"));
    fs::write(&tmp, y).unwrap();
    fs::rename(&tmp, dir.join(format!("s{i}.yaml"))).unwrap();
}

fn rss_kib(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn listing(ns: &NetNs) -> netlink_tests::listing::Listing {
    ns.run(|| {
        kernel_listing(
            &mut NetlinkNftables::open().unwrap(),
            Family::Ip,
            "kube-nlproxy",
        )
    })
}

#[test]
fn sixty_seconds_of_endpoint_churn_loses_nothing() {
    require_root();
    let ns = NetNs::new("churn");
    let dir = std::env::temp_dir().join(format!("nlp-churn-{}", ns.name));
    fs::create_dir_all(&dir).unwrap();
    for i in 0..SERVICES {
        write_service(&dir, i, 0);
    }
    let log = dir.join("daemon.log");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(proxy_bin())
        .args([
            "--manifests",
            dir.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--min-sync-period",
            "200ms",
        ])
        .args(["--healthz-bind-address", "127.0.0.1:10256"])
        .env("RUST_LOG", netlink_tests::cluster::DAEMON_LOG)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("] \"synced\"")
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "no first sync");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let baseline = rss_kib(child.id());

    // Another program keeps writing its own table the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let (stop, name) = (stop.clone(), ns.name.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let cmd = format!(
                    "add table ip noise\nadd chain ip noise c{n}\nadd rule ip noise c{n} counter\n"
                );
                let mut p = Command::new("ip")
                    .args(["netns", "exec", &name, "nft", "-f", "-"])
                    .stdin(Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                p.stdin.take().unwrap().write_all(cmd.as_bytes()).unwrap();
                assert!(p.wait().unwrap().success());
                n += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        })
    };

    // 100 endpoint changes per second: ten files every 100 ms, 6,000 in all. Paced by the
    // clock, not by sleeps after each write: beside the rest of the suite the writes
    // themselves slowed a sleep-paced loop to 4,970 changes in its 60 s.
    let start = Instant::now();
    for generation in 1..=600 {
        let due = start + Duration::from_millis(100) * generation as u32;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        for k in 0..10 {
            write_service(&dir, (generation * 10 + k) % SERVICES, generation);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let noise_chains = noise.join().unwrap();
    eprintln!("churn: 6000 changes in {:?}", start.elapsed());

    // What a fresh full sync of the final manifests produces, in a second namespace.
    let fresh = NetNs::new("fresh");
    let out = Command::new("ip")
        .args(["netns", "exec", &fresh.name])
        .arg(proxy_bin())
        .args([
            "--manifests",
            dir.to_str().unwrap(),
            "--hostname-override",
            "node1",
            "--once",
        ])
        .output_within(TEST_LIMIT)
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = listing(&fresh);
    let t0 = Instant::now();
    loop {
        if listing(&ns) == want {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the kernel never converged on the final manifests"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("sync failed"),
        "a sync failed during churn:\n{}",
        &text[text.len().saturating_sub(4000)..]
    );
    let listed = ns.sh("nft list table ip noise");
    assert_eq!(
        listed.matches("chain c").count(),
        noise_chains,
        "the other program's table is intact"
    );

    std::thread::sleep(Duration::from_secs(2));
    let after = rss_kib(child.id());
    assert!(
        after <= baseline * 3 / 2 + 16 * 1024,
        "memory did not return near its baseline: {baseline} KiB before, {after} KiB after"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = fs::remove_dir_all(&dir);
}
