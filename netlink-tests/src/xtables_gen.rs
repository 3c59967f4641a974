//! Random legacy x_tables rulesets for the rewriter's property test (issue #50.3), and the
//! expected result of removing upstream kube-proxy's chains from one, computed on
//! `iptables-save` text without any of the proxy's code. Pure.
//!
//! A ruleset holds the filter, nat and mangle tables (every one, so that a restore replaces
//! whatever the case before left), each with its built-in chains and a random mix of
//! kube-proxy's chains and foreign ones: kubelet's, which look like kube-proxy's and must
//! stay, and other programs'. Rules carry random matches, targets, jumps and gotos, and
//! counters. Jumps between user chains only go forward in the chain list, so no ruleset has
//! a loop (`iptables-restore` refuses one).

/// splitmix64: a small deterministic generator, so that a failing case is reproduced from its
/// seed alone.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// IPv4 (`iptables`) or IPv6 (`ip6tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// The chains upstream kube-proxy's iptables and IPVS modes create, written out here from
/// upstream's `pkg/proxy/iptables` and `pkg/proxy/ipvs` rather than taken from ours.
const KUBE_PROXY_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-FORWARD",
    "KUBE-PROXY-FIREWALL",
    "KUBE-PROXY-CANARY",
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];
/// Upstream's per-Service chain prefixes (a hash follows).
const KUBE_PROXY_PREFIXES: &[&str] = &[
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-SEP-",
    "KUBE-FW-",
    "KUBE-EXT-",
    "KUBE-XLB-",
];
/// Chains that are not kube-proxy's: kubelet's (which share the prefix) and others'.
const FOREIGN_CHAINS: &[&str] = &[
    "KUBE-FIREWALL",
    "KUBE-KUBELET-CANARY",
    "KUBE-MARK-DROP",
    "KUBE-SERVICES-X",
    "DOCKER",
    "DOCKER-USER",
    "CNI-FORWARD",
    "FLANNEL-FWD",
    "f2b-sshd",
    "LIBVIRT_INP",
];

/// Whether upstream kube-proxy owns chain `name`.
pub fn is_kube_proxy_chain(name: &str) -> bool {
    KUBE_PROXY_CHAINS.contains(&name) || KUBE_PROXY_PREFIXES.iter().any(|p| name.starts_with(p))
}

fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        _ => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    }
}

/// A random match part of a rule (possibly none).
fn random_match(rng: &mut Rng, family: Family) -> String {
    let n = rng.below(250);
    let addr = match family {
        Family::V4 => format!("10.{}.{}.0/24", rng.below(256), rng.below(256)),
        Family::V6 => format!("fd00:{:x}::/64", rng.below(0xffff)),
    };
    match rng.below(8) {
        0 => String::new(),
        1 => format!("-s {addr} "),
        2 => format!("-d {addr} "),
        3 => format!("-p tcp -m tcp --dport {} ", 1 + n),
        4 => format!("-p udp -m udp --sport {} ", 1 + n),
        // Not -i or -o: each is refused in the hooks of the other direction, and a user
        // chain may be reached from both.
        5 => "-m conntrack --ctstate NEW ".to_string(),
        6 => "-m mark --mark 0x4000/0x4000 ".to_string(),
        _ => format!("-m comment --comment \"rule {n}\" "),
    }
}

/// A random target for a rule in `table`: a verdict, a MARK, or a jump or goto to one of
/// `later` (the user chains after the rule's own).
fn random_target(rng: &mut Rng, table: &str, later: &[String]) -> String {
    if !later.is_empty() && rng.chance(45) {
        let to = rng.pick(later);
        return if rng.chance(20) {
            format!("-g {to}")
        } else {
            format!("-j {to}")
        };
    }
    match (rng.below(4), table) {
        (0, _) => "-j ACCEPT".into(),
        (1, _) => "-j RETURN".into(),
        (2, "nat") => "-j ACCEPT".into(),
        (2, _) => "-j DROP".into(),
        _ => format!(
            "-j MARK --set-xmark 0x{:x}/0xffffffff",
            1 + rng.below(0xffff)
        ),
    }
}

fn counters(rng: &mut Rng) -> String {
    let packets = rng.below(1_000_000);
    format!("[{packets}:{}]", packets * (40 + rng.below(1400)))
}

/// One table in `iptables-restore -c` syntax; with `foreign_only`, none of kube-proxy's
/// chains.
fn random_table(rng: &mut Rng, family: Family, table: &str, foreign_only: bool) -> String {
    let mut user: Vec<String> = Vec::new();
    for _ in 0..rng.below(8) {
        let kind = if foreign_only { 2 } else { rng.below(3) };
        let name = match kind {
            0 => rng.pick(KUBE_PROXY_CHAINS).to_string(),
            1 => format!("{}{:016X}", rng.pick(KUBE_PROXY_PREFIXES), rng.next_u64()),
            _ => rng.pick(FOREIGN_CHAINS).to_string(),
        };
        if !user.contains(&name) {
            user.push(name);
        }
    }
    let mut out = format!("*{table}\n");
    for chain in builtin_chains(table) {
        let policy = if table == "filter" && rng.chance(20) {
            "DROP"
        } else {
            "ACCEPT"
        };
        out.push_str(&format!(":{chain} {policy} {}\n", counters(rng)));
    }
    for chain in &user {
        out.push_str(&format!(":{chain} - {}\n", counters(rng)));
    }
    let mut rules = String::new();
    for chain in builtin_chains(table) {
        for _ in 0..rng.below(6) {
            let m = random_match(rng, family);
            let t = random_target(rng, table, &user);
            rules.push_str(&format!("{} -A {chain} {m}{t}\n", counters(rng)));
        }
    }
    for (i, chain) in user.iter().enumerate() {
        for _ in 0..rng.below(5) {
            let m = random_match(rng, family);
            let t = random_target(rng, table, &user[i + 1..]);
            rules.push_str(&format!("{} -A {chain} {m}{t}\n", counters(rng)));
        }
    }
    out.push_str(&rules);
    out.push_str("COMMIT\n");
    out
}

/// A whole ruleset for `iptables-legacy-restore -c` (or `ip6tables-…`): filter, nat and
/// mangle, each with random chains and rules; one in seven has none of kube-proxy's chains
/// (a cleanup must then leave it exactly as it was).
pub fn random_ruleset(rng: &mut Rng, family: Family) -> String {
    let foreign_only = rng.below(7) == 0;
    ["filter", "nat", "mangle"]
        .iter()
        .map(|t| random_table(rng, family, t, foreign_only))
        .collect()
}

/// `iptables-save` output without its comment lines (the `# Generated by` and `#
/// Completed on` lines carry times).
pub fn without_comments(saved: &str) -> String {
    saved
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `saved` (`iptables-save -c` text, comments dropped) as it must read once upstream
/// kube-proxy's chains are removed: their `:CHAIN` lines and rules gone, and every rule of
/// another chain that jumps or goes to one of them; the rest, counters included, as it was.
pub fn expected_after_cleanup(saved: &str) -> String {
    let mut out = String::new();
    for line in saved.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or("");
            if is_kube_proxy_chain(name) {
                continue;
            }
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        // `[p:b] -A CHAIN …` with -c, `-A CHAIN …` without.
        if let Some(i) = words.iter().position(|w| *w == "-A") {
            let chain = words.get(i + 1).copied().unwrap_or("");
            let target = words
                .windows(2)
                .find(|w| w[0] == "-j" || w[0] == "-g")
                .map(|w| w[1]);
            if is_kube_proxy_chain(chain) || target.is_some_and(is_kube_proxy_chain) {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_ruleset() {
        let a = random_ruleset(&mut Rng::new(7), Family::V4);
        let b = random_ruleset(&mut Rng::new(7), Family::V4);
        assert_eq!(a, b);
        assert_ne!(a, random_ruleset(&mut Rng::new(8), Family::V4));
        assert_eq!(a.matches("COMMIT\n").count(), 3);
    }

    #[test]
    fn rulesets_mix_kube_proxys_chains_with_foreign_ones() {
        let mut rng = Rng::new(1);
        let all: String = (0..50)
            .map(|_| random_ruleset(&mut rng, Family::V6))
            .collect();
        assert!(all.contains(":KUBE-SVC-") && all.contains(":KUBE-SERVICES "));
        assert!(all.contains(":KUBE-FIREWALL ") && all.contains(":DOCKER "));
        assert!(all.contains(" -g KUBE-") && all.contains(" -j KUBE-"));
        assert!(all.contains("fd00:"));
    }

    #[test]
    fn the_expected_result_drops_kube_proxys_chains_and_the_jumps_into_them_only() {
        let saved = "*nat\n:PREROUTING ACCEPT [1:60]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AB - [0:0]\n:KUBE-MARK-DROP - [0:0]\n:DOCKER - [0:0]\n[3:180] -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n[4:240] -A PREROUTING -j DOCKER\n[5:300] -A DOCKER -g KUBE-SVC-AB\n[6:360] -A DOCKER -j KUBE-MARK-DROP\n[7:420] -A KUBE-SERVICES -j KUBE-SVC-AB\n[8:480] -A KUBE-SVC-AB -j DOCKER\nCOMMIT\n";
        assert_eq!(
            expected_after_cleanup(saved),
            "*nat\n:PREROUTING ACCEPT [1:60]\n:KUBE-MARK-DROP - [0:0]\n:DOCKER - [0:0]\n[4:240] -A PREROUTING -j DOCKER\n[6:360] -A DOCKER -j KUBE-MARK-DROP\nCOMMIT\n"
        );
        assert_eq!(
            without_comments("# Generated by x\n*nat\nCOMMIT\n# Completed on y\n"),
            "*nat\nCOMMIT\n"
        );
    }
}
