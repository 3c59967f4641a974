//! The iptables mode's count of dropped INVALID packets
//! (`kubeproxy_iptables_ct_state_invalid_dropped_packets_total`): the counter of the
//! [`INVALID_DROP_COMMENT`] rule in each family's forward chain, read from the kernel at
//! every scrape as upstream's collector reads its nfacct counter. Counting is pure;
//! [`InvalidDropped::read`] does the I/O.

use crate::kernel::nft::decode::ListedRule;
use crate::kernel::nft::netlink::NetlinkNftables;
use crate::kernel::nft::{Error, Family};
use crate::proxy::names::{FILTER_FORWARD, INVALID_DROP_COMMENT};

/// Packets counted by our INVALID drop rules among `rules` (none: 0, as upstream's nfacct
/// counter reads when its rule is absent because the kernel is liberal).
pub fn count_dropped(rules: &[ListedRule]) -> u64 {
    rules
        .iter()
        .filter(|r| r.chain == FILTER_FORWARD && r.comment.as_deref() == Some(INVALID_DROP_COMMENT))
        .flat_map(|r| &r.counters)
        .map(|c| c.packets)
        .fold(0u64, u64::saturating_add)
}

/// Keeps the exported count monotonic: a full sync re-creates the rule and with it the
/// kernel's counter (at start, after a failed sync, after someone else changed our table),
/// where upstream's nfacct object lives on. A reading below the last one is taken as such a
/// restart and added on top of what was counted before; packets counted between the last
/// scrape and the restart are lost, never counted twice.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Monotonic {
    before: u64,
    last: u64,
}

impl Monotonic {
    /// The total after the kernel reads `now`.
    pub fn observe(&mut self, now: u64) -> u64 {
        if now < self.last {
            self.before = self.before.saturating_add(self.last);
        }
        self.last = now;
        self.before.saturating_add(now)
    }
}

/// Reads the count from the kernel through its own nftables socket (opened at the first
/// read, and again after a failure).
pub struct InvalidDropped {
    table: String,
    nft: Option<NetlinkNftables>,
    total: Monotonic,
}

impl InvalidDropped {
    pub fn new(table: impl Into<String>) -> InvalidDropped {
        InvalidDropped {
            table: table.into(),
            nft: None,
            total: Monotonic::default(),
        }
    }

    /// The packets dropped so far, both families together (upstream's one nfacct counter
    /// serves both).
    pub fn read(&mut self) -> Result<u64, Error> {
        let nft = match self.nft.as_mut() {
            Some(n) => n,
            None => self.nft.insert(NetlinkNftables::open()?),
        };
        let mut rules = Vec::new();
        for family in Family::all() {
            match nft.list_chain_rules(family, &self.table, FILTER_FORWARD) {
                Ok(r) => rules.extend(r),
                Err(e) => {
                    self.nft = None;
                    return Err(e);
                }
            }
        }
        Ok(self.total.observe(count_dropped(&rules)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::nft::decode::CounterValues;
    use crate::kernel::nft::lower::KExpr;

    fn rule(chain: &str, comment: Option<&str>, packets: u64) -> ListedRule {
        ListedRule {
            table: "kube-nlproxy".into(),
            chain: chain.into(),
            handle: 1,
            exprs: vec![KExpr::Counter],
            comment: comment.map(str::to_owned),
            counters: vec![CounterValues {
                packets,
                bytes: packets * 60,
            }],
        }
    }

    #[test]
    fn only_our_invalid_drop_rules_count_and_both_families_add_up() {
        let rules = [
            rule(FILTER_FORWARD, Some(INVALID_DROP_COMMENT), 3),
            rule(FILTER_FORWARD, Some(INVALID_DROP_COMMENT), 4),
            rule(FILTER_FORWARD, None, 100),
            rule("services", Some(INVALID_DROP_COMMENT), 100),
        ];
        assert_eq!(count_dropped(&rules), 7);
        assert_eq!(count_dropped(&[]), 0, "no rule (liberal kernel): zero");
    }

    #[test]
    fn a_recreated_rule_does_not_make_the_count_go_back() {
        let mut m = Monotonic::default();
        assert_eq!(m.observe(5), 5);
        assert_eq!(m.observe(8), 8);
        assert_eq!(m.observe(2), 10, "restarted at a full sync, then counted 2");
        assert_eq!(m.observe(3), 11);
    }
}
