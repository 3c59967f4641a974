//! A real Kubernetes control plane for the tests: etcd and kube-apiserver, built from their
//! Go modules by `netlink-tests/upstream/build.sh` (cached under /var/tmp), started inside a
//! network namespace of the test cluster so that the proxy running there reaches them on
//! loopback. Certificates are the apiserver's own self-signed ones (`--cert-dir`), the
//! service-account key pair is generated with openssl, the test's admin authenticates with
//! a static token, and the proxy with the ServiceAccount token of `deploy/` (TokenRequest),
//! under `--authorization-mode=Node,RBAC`. No controller manager: tests create Nodes,
//! Services and EndpointSlices themselves. Every wait is bounded.
#![allow(clippy::disallowed_methods)] // test tooling runs the upstream binaries

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ns::NetNs;

pub const K8S_VERSION: &str = "v1.37.2";
pub const ETCD_VERSION: &str = "v3.6.14";
/// The service CIDR the apiserver allocates ClusterIPs from.
/// Dual-stack, IPv4 first (the `kubernetes` Service is IPv4).
pub const SERVICE_CIDR: &str = "10.96.0.0/16,fd00:96::/112";
/// The largest service CIDR the apiserver takes (an IPv4 range of at most 20 bits): for
/// the benchmark's 100k Services, which a /16 cannot hold.
pub const LARGE_SERVICE_CIDR: &str = "10.96.0.0/12,fd00:96::/112";
const ADMIN_TOKEN: &str = "nlp-test-admin-token";

fn bin(dir: &str, name: &str) -> PathBuf {
    let p = PathBuf::from(format!("/var/tmp/kube-nlproxy-upstream/{dir}/{name}"));
    assert!(
        p.exists(),
        "{} missing: run netlink-tests/upstream/build.sh",
        p.display()
    );
    p
}

/// etcd and kube-apiserver running in `ns`.
pub struct ControlPlane {
    ns_name: String,
    etcd: Child,
    apiserver: Child,
    /// `--service-cluster-ip-range`.
    service_cidr: &'static str,
    pub dir: PathBuf,
    /// `https://NODE_IP:6443`, reachable inside the namespace.
    pub url: String,
}

impl ControlPlane {
    /// Starts both and waits (up to 60 s) until the apiserver answers `/readyz`.
    pub fn start(ns: &NetNs) -> ControlPlane {
        Self::start_with_service_cidr(ns, SERVICE_CIDR)
    }

    /// [`Self::start`] with another `--service-cluster-ip-range`.
    pub fn start_with_service_cidr(ns: &NetNs, service_cidr: &'static str) -> ControlPlane {
        let dir = std::env::temp_dir().join(format!("nlp-cp-{}", ns.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let sh = |cmd: &str| {
            let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
            assert!(
                out.status.success(),
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        sh(&format!(
            "openssl genrsa -out {d}/sa.key 2048 2>/dev/null && openssl rsa -in {d}/sa.key -pubout -out {d}/sa.pub 2>/dev/null",
            d = dir.display()
        ));
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},nlp-admin,nlp-admin,\"system:masters\"\n"),
        )
        .unwrap();
        // Every request at Metadata level: which user did which verb on what, and the answer.
        std::fs::write(
            dir.join("audit-policy.yaml"),
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )
        .unwrap();
        let log = |n: &str| std::fs::File::create(dir.join(n)).unwrap();
        let etcd = crate::bounded::dies_with_parent(&mut Command::new("ip"))
            .args(["netns", "exec", &ns.name])
            .arg(bin(&format!("etcd-{ETCD_VERSION}"), "etcd"))
            .args([
                "--data-dir",
                dir.join("etcd").to_str().unwrap(),
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ])
            .stdout(Stdio::null())
            .stderr(log("etcd.log"))
            .spawn()
            .expect("start etcd");
        let apiserver = spawn_apiserver(&ns.name, &dir, service_cidr);
        let mut cp = ControlPlane {
            ns_name: ns.name.clone(),
            etcd,
            apiserver,
            service_cidr,
            dir,
            url: format!("https://{}:6443", crate::cluster::NODE_IP),
        };
        cp.wait_ready();
        cp
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        while !self.ready() {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "kube-apiserver not ready:\n{}\n{}",
                self.log("apiserver.log"),
                self.log("etcd.log")
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stops kube-apiserver (etcd keeps the objects); `start_apiserver` brings it back.
    pub fn stop_apiserver(&mut self) {
        let _ = self.apiserver.kill();
        crate::bounded::wait_within(
            &mut self.apiserver,
            Duration::from_secs(10),
            "kube-apiserver",
        );
    }

    /// Starts kube-apiserver again over the same etcd and keys, and waits until it is ready.
    /// The kube-apiserver's process id (its CPU, for the fleet rows).
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.id()
    }

    pub fn start_apiserver(&mut self) {
        self.apiserver = spawn_apiserver(&self.ns_name, &self.dir, self.service_cidr);
        self.wait_ready();
    }
}

fn spawn_apiserver(ns: &str, dir: &Path, service_cidr: &str) -> Child {
    let d = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("apiserver.log"))
        .unwrap();
    {
        let apiserver = crate::bounded::dies_with_parent(&mut Command::new("ip"))
            .args(["netns", "exec", ns])
            .arg(bin(K8S_VERSION, "kube-apiserver"))
            .args([
                "--etcd-servers=http://127.0.0.1:2379".to_string(),
                // The endpoint reconciler refuses loopback: advertise the node's address
                // (the `kubernetes` Service then points at it, as on a real node).
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={}", crate::cluster::NODE_IP),
                "--secure-port=6443".into(),
                format!("--cert-dir={}", d("certs")),
                format!("--service-cluster-ip-range={service_cidr}"),
                "--authorization-mode=Node,RBAC".into(),
                format!("--token-auth-file={}", d("tokens.csv")),
                format!("--service-account-key-file={}", d("sa.pub")),
                format!("--service-account-signing-key-file={}", d("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--disable-admission-plugins=ServiceAccount".into(),
                format!("--audit-policy-file={}", d("audit-policy.yaml")),
                format!("--audit-log-path={}", d("audit.log")),
                "--enable-priority-and-fairness=false".into(),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver");
        apiserver
    }
}

impl ControlPlane {
    fn ready(&self) -> bool {
        let ca = self.dir.join("certs/apiserver.crt");
        if !ca.exists() {
            return false;
        }
        // bash's /dev/tcp cannot speak TLS; the admin client checks /readyz.
        let kc = self.kubeconfig(ADMIN_TOKEN, "admin");
        let ns = self.ns_name.clone();
        let url = self.url.clone();
        std::thread::spawn(move || {
            crate::ns::enter(&format!("/run/netns/{ns}"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(c) = client_from(&kc).await else {
                    return false;
                };
                let req = http::Request::get(format!("{url}/readyz"))
                    .body(Vec::new())
                    .unwrap();
                matches!(
                    tokio::time::timeout(Duration::from_secs(3), c.request_text(req)).await,
                    Ok(Ok(t)) if t.trim() == "ok"
                )
            })
        })
        .join()
        .unwrap_or(false)
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// A kubeconfig for `token`, trusting the apiserver's self-signed certificate.
    pub fn kubeconfig(&self, token: &str, name: &str) -> PathBuf {
        let p = self.dir.join(format!("{name}.kubeconfig"));
        write_atomically(
            &p,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: {name}}}\ncurrent-context: test\nusers:\n- name: {name}\n  user:\n    token: {token}\n",
                self.url,
                self.dir.join("certs/apiserver.crt").display()
            ),
        );
        p
    }

    /// The audit log's events (JSON lines) of the user `username`.
    pub fn audit_events(&self, username: &str) -> Vec<serde_json::Value> {
        self.log("audit.log")
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["user"]["username"] == username)
            .collect()
    }

    /// Moves etcd's revision on by `writes` puts of a key no API object uses, then compacts
    /// its history up to that revision, over etcd's JSON gateway: a watch resumed from
    /// before it gets `410 Gone`. Returns the revision.
    pub fn compact_etcd(&self, ns: &NetNs, writes: usize) -> u64 {
        let mut rev = 0;
        for i in 0..writes {
            let key = base64_encode(b"/nlp-test/compaction");
            let value = base64_encode(format!("{i}").as_bytes());
            let r = etcd_post(
                ns,
                "/v3/kv/put",
                &serde_json::json!({"key": key, "value": value}),
            );
            rev = r["header"]["revision"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("etcd put answered {r}"));
        }
        let r = etcd_post(
            ns,
            "/v3/kv/compaction",
            &serde_json::json!({"revision": rev.to_string(), "physical": true}),
        );
        assert!(r.get("header").is_some(), "etcd compaction answered {r}");
        rev
    }

    /// Writes `objects` (an etcd key and the API object there, as JSON) straight into etcd,
    /// under the running kube-apiserver: for workloads too large to create through the API.
    /// v1.37's ClusterIP allocator counts every IPAddress twice after each allocation for
    /// its metrics (`createIPAddress` calls `Used()` and `Free()`, each a list of all of
    /// them), so a Service create costs O(Services): ~200 creates a second at 10k, ~34 at
    /// 23k on this machine. The API server reads JSON from storage beside its own protobuf
    /// (its storage codec falls back to the universal deserializer) and its watch caches
    /// follow etcd. Not with the API server stopped: started over 100k Services, its
    /// ClusterIP repair's first pass must finish within a minute or it exits. Up to 120
    /// keys (etcd's default limit is 128 operations) and ~700 KB (its request limit is
    /// 1.5 MiB, base64 adds a third) per transaction. Returns the count written.
    pub fn seed_etcd(
        &self,
        ns: &NetNs,
        objects: impl Iterator<Item = (String, serde_json::Value)>,
    ) -> usize {
        let (mut ops, mut bytes, mut written) = (Vec::new(), 0, 0);
        let flush = |ops: &mut Vec<serde_json::Value>| {
            if ops.is_empty() {
                return;
            }
            let r = etcd_post(
                ns,
                "/v3/kv/txn",
                &serde_json::json!({ "success": std::mem::take(ops) }),
            );
            assert!(
                r["succeeded"] == true,
                "etcd transaction answered {}",
                r.to_string().chars().take(500).collect::<String>()
            );
        };
        for (key, object) in objects {
            let value = object.to_string();
            bytes += key.len() + value.len();
            ops.push(serde_json::json!({"requestPut": {
                "key": base64_encode(key.as_bytes()),
                "value": base64_encode(value.as_bytes()),
            }}));
            written += 1;
            if ops.len() == 120 || bytes > 700_000 {
                flush(&mut ops);
                bytes = 0;
            }
        }
        flush(&mut ops);
        written
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfig(ADMIN_TOKEN, "admin")
    }

    /// An admin kubeconfig for a client that reaches the apiserver at `server` (another
    /// namespace's route to it): the certificate is still checked, for its NODE_IP name.
    pub fn admin_kubeconfig_via(&self, server: &str) -> PathBuf {
        let p = self.dir.join("admin-via.kubeconfig");
        write_atomically(
            &p,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    tls-server-name: {}\n    certificate-authority: {}\ncontexts:\n- name: test\n  context: {{cluster: test, user: admin}}\ncurrent-context: test\nusers:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\n",
                crate::cluster::NODE_IP,
                self.dir.join("certs/apiserver.crt").display()
            ),
        );
        p
    }

    /// Runs `f` with an admin client inside `ns` (where the apiserver listens), its API
    /// calls bounded to 60 s.
    pub fn with_admin<T: Send + 'static>(
        &self,
        ns: &NetNs,
        f: impl FnOnce(kube::Client) -> futures::future::BoxFuture<'static, T> + Send + 'static,
    ) -> T {
        self.with_admin_within(ns, Duration::from_secs(60), f)
    }

    /// [`Self::with_admin`] with another bound (the fleet rows' windows of 1,000 watches).
    pub fn with_admin_within<T: Send + 'static>(
        &self,
        ns: &NetNs,
        bound: Duration,
        f: impl FnOnce(kube::Client) -> futures::future::BoxFuture<'static, T> + Send + 'static,
    ) -> T {
        let kc = self.admin_kubeconfig();
        ns.run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = client_from(&kc).await.expect("admin client");
                tokio::time::timeout(bound, f(client))
                    .await
                    .unwrap_or_else(|_| panic!("API calls within {bound:?}"))
            })
        })
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for c in [&mut self.apiserver, &mut self.etcd] {
            let _ = c.kill();
            let _ =
                crate::bounded::wait_within(c, Duration::from_secs(10), "a control-plane process");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `text` to `path` through a file of its own renamed over it: threads calling
/// [`ControlPlane::with_admin`] at once each rewrite the admin kubeconfig, and a reader must
/// never see one half written ("failed to determine current context", seen in the soak).
fn write_atomically(path: &Path, text: &str) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A kube-rs client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(cfg).map_err(|e| e.to_string())
}

/// POSTs `body` to etcd's JSON gateway in `ns` (plain HTTP/1.1 on 127.0.0.1:2379).
fn etcd_post(ns: &NetNs, path: &str, body: &serde_json::Value) -> serde_json::Value {
    use std::io::{Read, Write};
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:2379\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let resp = ns.run(move || {
        let mut s = std::net::TcpStream::connect("127.0.0.1:2379").expect("connect to etcd");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("etcd's answer within 10 s");
        String::from_utf8_lossy(&out).into_owned()
    });
    let json = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    // A chunked answer: the JSON object is on its own line between the chunk sizes.
    let json = json
        .lines()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or(json);
    serde_json::from_str(json).unwrap_or_else(|e| panic!("etcd {path}: {e}: {resp}"))
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A file of `deploy/`.
pub fn deploy_file(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../deploy/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}
