//! The nftables mode's count of rejected loopback NodePort packets
//! (`kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family,protocol}`, upstream
//! gate `KubeProxyNFTablesLocalhostNodePorts`): the counter of the one rule in each family's
//! `localhost-nodeport-reject-<protocol>` chain, read from the kernel at every scrape as
//! upstream's collector reads its named counters. A protocol whose chain is absent (not
//! rejected in that family) has no sample, as upstream's absent counter has none. Counting is
//! pure; [`RejectedCounts::read`] does the I/O.

use std::collections::BTreeMap;

use super::invalid::Monotonic;
use crate::kernel::nft::decode::ListedRule;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::kernel::nft::Family;
use crate::model::Protocol;
use crate::proxy::names::{localhost_reject_chain, localhost_reject_counter};

/// Every protocol a loopback NodePort reject chain may exist for.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

/// The packets counted by the reject rule of `proto` among `rules` (the listing of its
/// chain); `None` when the rule is absent.
pub fn count_rejected(rules: &[ListedRule], proto: Protocol) -> Option<u64> {
    let comment = localhost_reject_counter(proto);
    let mut found = None;
    for r in rules.iter().filter(|r| {
        r.chain == localhost_reject_chain(proto) && r.comment.as_deref() == Some(&comment)
    }) {
        let n = r
            .counters
            .iter()
            .map(|c| c.packets)
            .fold(0u64, u64::saturating_add);
        found = Some(found.unwrap_or(0u64).saturating_add(n));
    }
    found
}

/// Reads the counts from the kernel through its own nftables socket (opened at the first
/// read, and again after a failure), each kept monotonic across full syncs that re-create
/// the rules.
pub struct RejectedCounts {
    table: String,
    nft: Option<NetlinkNftables>,
    totals: BTreeMap<(Family, Protocol), Monotonic>,
}

impl RejectedCounts {
    pub fn new(table: impl Into<String>) -> RejectedCounts {
        RejectedCounts {
            table: table.into(),
            nft: None,
            totals: BTreeMap::new(),
        }
    }

    /// The packets rejected so far per family and protocol, for the rejects that exist now.
    pub fn read(&mut self) -> Vec<((Family, Protocol), u64)> {
        let mut out = Vec::new();
        for family in Family::all() {
            for proto in PROTOCOLS {
                let nft = match self.nft.as_mut() {
                    Some(n) => n,
                    None => match NetlinkNftables::open() {
                        Ok(n) => self.nft.insert(n),
                        Err(e) => {
                            tracing::warn!(err = %e, "cannot read the localhost NodePort reject counters");
                            return out;
                        }
                    },
                };
                let chain = localhost_reject_chain(proto);
                let rules = match nft.list_chain_rules(family, &self.table, &chain) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(%family, chain, err = %e, "cannot read the localhost NodePort reject counter");
                        self.nft = None;
                        continue;
                    }
                };
                if let Some(n) = count_rejected(&rules, proto) {
                    let total = self.totals.entry((family, proto)).or_default().observe(n);
                    out.push(((family, proto), total));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::decode::CounterValues;
    use crate::kernel::nft::lower::KExpr;

    fn rule(chain: &str, comment: &str, packets: u64) -> ListedRule {
        ListedRule {
            table: "kube-nlproxy".into(),
            chain: chain.into(),
            handle: 1,
            exprs: vec![KExpr::Counter],
            comment: Some(comment.into()),
            counters: vec![CounterValues {
                packets,
                bytes: packets * 60,
            }],
        }
    }

    #[test]
    fn the_reject_rule_of_the_protocol_counts_and_an_absent_one_gives_no_sample() {
        let udp = [rule(
            "localhost-nodeport-reject-udp",
            "localhost-nodeport-rejected-udp",
            3,
        )];
        assert_eq!(count_rejected(&udp, Protocol::Udp), Some(3));
        assert_eq!(count_rejected(&udp, Protocol::Tcp), None, "other protocol");
        assert_eq!(count_rejected(&[], Protocol::Udp), None, "chain absent");
        let zero = [rule(
            "localhost-nodeport-reject-tcp",
            "localhost-nodeport-rejected-tcp",
            0,
        )];
        assert_eq!(
            count_rejected(&zero, Protocol::Tcp),
            Some(0),
            "present, nothing rejected yet: a zero sample, as upstream's new counter"
        );
        let foreign = [rule("localhost-nodeport-reject-udp", "someone else's", 9)];
        assert_eq!(count_rejected(&foreign, Protocol::Udp), None);
    }
}
