//! Live traffic through a Service while the proxy under it changes: two echo backends (on
//! nodes 2 and 3) behind Service `default/echo`, and a client pod on node 1 that holds one
//! TCP connection and one UDP flow (fixed source port) to the Service's ClusterIP for its
//! whole life, one round trip a second each. Every round trip is a log line naming the
//! backend that answered; a broken connection ends the container. [`Flows`] reads the logs
//! back and says whether each flow kept going, to the same backend, without a gap.
//!
//! Pure text and log parsing, except the methods on [`Cluster`].

use std::time::Duration;

use super::{images, Cluster};

/// The client's and servers' scripts, mounted from a ConfigMap (dash and socat from the
/// agnhost image).
const SCRIPTS: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: traffic-scripts, namespace: default}
data:
  talk.sh: |
    # One round trip a second over stdin/stdout (the socket), each logged on stderr as
    # "PROTO N REPLY SECONDS"; a closed connection ends the script.
    i=0
    while :; do
      i=$((i+1))
      echo "$i"
      read -r reply || { echo "$1 closed after $i" >&2; exit 3; }
      echo "$1 $i $reply $(date +%s)" >&2
      sleep 1
    done
  echo.sh: |
    while read -r l; do echo "$(hostname) $l"; done
"#;

fn manifests() -> String {
    let img = images::AGNHOST;
    format!(
        r#"{SCRIPTS}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{{key: kubernetes.io/hostname, operator: NotIn, values: [node-1]}}]
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {{matchLabels: {{app: echo}}}}
            topologyKey: kubernetes.io/hostname
      volumes: [{{name: scripts, configMap: {{name: traffic-scripts}}}}]
      containers:
      - name: tcp
        image: {img}
        command: [socat, "TCP-LISTEN:9000,fork,reuseaddr", "SYSTEM:sh /scripts/echo.sh"]
        volumeMounts: [{{name: scripts, mountPath: /scripts}}]
      - name: udp
        image: {img}
        command: [socat, "UDP-LISTEN:9001,fork,reuseaddr", "SYSTEM:sh /scripts/echo.sh"]
        volumeMounts: [{{name: scripts, mountPath: /scripts}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  selector: {{app: echo}}
  ports:
  - {{name: tcp, port: 9000, protocol: TCP}}
  - {{name: udp, port: 9001, protocol: UDP}}
"#
    )
}

fn client() -> String {
    let img = images::AGNHOST;
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: default}}
spec:
  nodeName: node-1
  restartPolicy: Never
  volumes: [{{name: scripts, configMap: {{name: traffic-scripts}}}}]
  # The proxy may not have programmed the Service's endpoints yet when the pod starts (seen
  # under load: the TCP client's first connect failed 2 s after upstream's proxy started,
  # and with restartPolicy Never the flow was gone): wait until the Service answers. One
  # sync programs both ports, so the UDP flow's first datagram is translated too.
  initContainers:
  - name: wait-for-service
    image: {img}
    command: [sh, -c, 'until socat -T 2 /dev/null "TCP:$ECHO_SERVICE_HOST:9000,connect-timeout=2"; do sleep 1; done']
  containers:
  - name: tcp
    image: {img}
    command: [sh, -c, 'exec socat -t 5 "TCP:$ECHO_SERVICE_HOST:9000" "SYSTEM:sh /scripts/talk.sh tcp"']
    volumeMounts: [{{name: scripts, mountPath: /scripts}}]
  - name: udp
    image: {img}
    command: [sh, -c, 'exec socat -T 3600 "UDP:$ECHO_SERVICE_HOST:9001,sourceport=40001" "SYSTEM:sh /scripts/talk.sh udp"']
    volumeMounts: [{{name: scripts, mountPath: /scripts}}]
"#
    )
}

/// One flow's round trips read from its log: `(n, backend, unix seconds)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub trips: Vec<(u64, String, u64)>,
    /// A line saying the connection closed.
    pub closed: Option<String>,
}

impl Flow {
    /// Parses the log of a client container for `proto` (`tcp` or `udp`).
    pub fn parse(log: &str, proto: &str) -> Flow {
        let mut f = Flow::default();
        for line in log.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() != Some(&proto) {
                continue;
            }
            match w.as_slice() {
                [_, "closed", ..] => f.closed = Some(line.to_string()),
                // PROTO N BACKEND N SECONDS (the reply is "BACKEND N")
                [_, n, backend, echoed, secs] if n == echoed => {
                    if let (Ok(n), Ok(s)) = (n.parse(), secs.parse()) {
                        f.trips.push((n, backend.to_string(), s));
                    }
                }
                _ => {}
            }
        }
        f
    }

    /// The longest time between two round trips, in seconds.
    pub fn longest_gap(&self) -> u64 {
        self.trips
            .windows(2)
            .map(|w| w[1].2.saturating_sub(w[0].2))
            .max()
            .unwrap_or(0)
    }

    /// Every backend that answered, in order of first answer.
    pub fn backends(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (_, b, _) in &self.trips {
            if !out.contains(&b.as_str()) {
                out.push(b);
            }
        }
        out
    }

    /// Whether this flow, as read now, continued `earlier` unbroken: never closed, one
    /// backend throughout, numbers consecutive, no gap over `max_gap` seconds, and at least
    /// `more` round trips since.
    pub fn continues(&self, earlier: &Flow, more: usize, max_gap: u64) -> Result<(), String> {
        if let Some(c) = &self.closed {
            return Err(format!("the connection closed: {c}"));
        }
        if self.backends().len() != 1 {
            return Err(format!(
                "answered by {:?}, not one backend",
                self.backends()
            ));
        }
        if self.trips.len() < earlier.trips.len() + more {
            return Err(format!(
                "{} round trips, {} before: fewer than {more} since",
                self.trips.len(),
                earlier.trips.len()
            ));
        }
        let consecutive = self
            .trips
            .iter()
            .enumerate()
            .all(|(i, (n, _, _))| *n == self.trips[0].0 + i as u64);
        if !consecutive {
            return Err("a round trip is missing from the sequence".into());
        }
        if self.longest_gap() > max_gap {
            return Err(format!(
                "a gap of {} s between round trips (at most {max_gap})",
                self.longest_gap()
            ));
        }
        Ok(())
    }
}

/// Both flows of the client at one moment.
#[derive(Clone, Debug, Default)]
pub struct Flows {
    pub tcp: Flow,
    pub udp: Flow,
}

impl Flows {
    pub fn continues(&self, earlier: &Flows, more: usize, max_gap: u64) -> Result<(), String> {
        self.tcp
            .continues(&earlier.tcp, more, max_gap)
            .map_err(|e| format!("TCP: {e}"))?;
        self.udp
            .continues(&earlier.udp, more, max_gap)
            .map_err(|e| format!("UDP: {e}"))
    }

    /// [`Flows::continues`] for the TCP connection alone: a UDP flow through a Service that
    /// moves back to upstream kube-proxy may be cut, as upstream sees the Service a moment
    /// before the EndpointSlice controller relabels its slices, and meanwhile serves it
    /// without endpoints and clears its UDP conntrack entries.
    pub fn tcp_continues(&self, earlier: &Flows, more: usize, max_gap: u64) -> Result<(), String> {
        self.tcp
            .continues(&earlier.tcp, more, max_gap)
            .map_err(|e| format!("TCP: {e}"))
    }
}

impl Cluster {
    /// Starts the echo backends, their Service and the client, and waits until both flows
    /// have made a few round trips.
    pub fn start_traffic(&self, limit: Duration) -> Flows {
        self.apply(&manifests());
        self.wait_for(limit, "echo backends Ready", |c| {
            c.pods_ready("default", "app=echo", 2)
        });
        // The client's Service environment variables need the Service to exist first.
        self.apply(&client());
        self.wait_for(limit, "the client's flows going", |c| {
            let f = c.flows();
            f.tcp.trips.len() >= 3 && f.udp.trips.len() >= 3
        });
        self.flows()
    }

    /// The client's flows as its logs show them now, read from node-1's pod log files (the
    /// CRI format `TIME STREAM TAG LINE`), so that they can be read while the API server is
    /// down.
    pub fn flows(&self) -> Flows {
        let pods = self.nodes[0].dir.join("var-log/pods");
        let dir = std::fs::read_dir(&pods)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("default_client_"))
            });
        let log = |c: &str| {
            let Some(d) = &dir else { return String::new() };
            let mut files: Vec<_> = std::fs::read_dir(d.join(c))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            files
                .iter()
                .filter_map(|f| std::fs::read_to_string(f).ok())
                .flat_map(|t| {
                    t.lines()
                        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or("").to_string())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        Flows {
            tcp: Flow::parse(&log("tcp"), "tcp"),
            udp: Flow::parse(&log("udp"), "udp"),
        }
    }

    /// A new connection from the client pod to the Service answers within `limit` (retried
    /// every second): the backend's name.
    pub fn new_connection_works(&self, limit: Duration) -> Result<String, String> {
        let t0 = std::time::Instant::now();
        loop {
            let out = self.kubectl(&[
                "-n",
                "default",
                "exec",
                "client",
                "-c",
                "tcp",
                "--",
                "sh",
                "-c",
                "echo probe | socat -t 3 - TCP:$ECHO_SERVICE_HOST:9000,connect-timeout=3",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && text.ends_with(" probe") {
                return Ok(text);
            }
            if t0.elapsed() > limit {
                return Err(format!(
                    "no answer within {limit:?}: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str =
        "tcp 1 echo-a-1 1 100\ntcp 2 echo-a-1 2 101\nudp 1 echo-b-2 1 100\ntcp 3 echo-a-1 3 102\n";

    #[test]
    fn a_flow_is_read_from_its_log() {
        let f = Flow::parse(LOG, "tcp");
        assert_eq!(f.trips.len(), 3);
        assert_eq!(f.backends(), ["echo-a-1"]);
        assert_eq!(f.longest_gap(), 1);
        assert_eq!(Flow::parse(LOG, "udp").trips, [(1, "echo-b-2".into(), 100)]);
    }

    #[test]
    fn continuation_rejects_a_close_a_new_backend_a_gap_and_a_stall() {
        let before = Flow::parse("tcp 1 a 1 100\n", "tcp");
        let good = Flow::parse("tcp 1 a 1 100\ntcp 2 a 2 101\ntcp 3 a 3 102\n", "tcp");
        assert_eq!(good.continues(&before, 2, 3), Ok(()));
        let closed = Flow::parse("tcp 1 a 1 100\ntcp closed after 2\n", "tcp");
        assert!(closed
            .continues(&before, 0, 3)
            .unwrap_err()
            .contains("closed"));
        let moved = Flow::parse("tcp 1 a 1 100\ntcp 2 b 2 101\n", "tcp");
        assert!(moved
            .continues(&before, 1, 3)
            .unwrap_err()
            .contains("not one backend"));
        let gap = Flow::parse("tcp 1 a 1 100\ntcp 2 a 2 110\n", "tcp");
        assert!(gap
            .continues(&before, 1, 3)
            .unwrap_err()
            .contains("gap of 10 s"));
        assert!(good
            .continues(&before, 5, 3)
            .unwrap_err()
            .contains("fewer than 5"));
        let hole = Flow::parse("tcp 1 a 1 100\ntcp 3 a 3 101\n", "tcp");
        assert!(hole
            .continues(&before, 1, 3)
            .unwrap_err()
            .contains("missing"));
    }
}
