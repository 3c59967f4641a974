//! nftables rule planning: from the model to the [`Ruleset`] of each family's table, and from
//! rulesets to transactions. Pure: nothing here opens a socket.

pub mod names;
pub mod plan;
pub mod ruleset;
pub mod slots;

pub use plan::{build_ruleset, build_ruleset_with_slots};
pub use ruleset::{
    plan_changes, plan_full, plan_transaction, Change, Existing, Fragment, Plan, Ruleset,
};
pub use slots::SlotAllocator;

use crate::nft::Cidr;

/// How traffic from pods on this node is told apart from traffic from elsewhere (which is
/// masqueraded when it reaches a ClusterIP).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LocalDetector {
    /// No detection: ClusterIP traffic is masqueraded only with `masquerade_all`.
    #[default]
    None,
    /// Sources inside these CIDRs are pods (`ClusterCIDR` or `NodeCIDR` mode).
    Cidrs(Vec<Cidr>),
    /// Packets arriving on this bridge come from pods (`BridgeInterface` mode).
    Bridge(String),
    /// Packets arriving on interfaces with this prefix come from pods
    /// (`InterfaceNamePrefix` mode).
    InterfacePrefix(String),
}

/// Which local addresses accept NodePort traffic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Every local address except loopback.
    #[default]
    All,
    /// Local addresses inside these CIDRs.
    Cidrs(Vec<Cidr>),
    /// The node's primary addresses from its Node object.
    Primary,
}

/// Settings of the nftables proxier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxierConfig {
    pub table: String,
    pub masquerade_bit: u8,
    pub masquerade_all: bool,
    pub local_detector: LocalDetector,
    pub nodeport_addresses: NodePortAddresses,
}

impl Default for ProxierConfig {
    fn default() -> Self {
        ProxierConfig {
            table: names::DEFAULT_TABLE.into(),
            masquerade_bit: 14,
            masquerade_all: false,
            local_detector: LocalDetector::None,
            nodeport_addresses: NodePortAddresses::All,
        }
    }
}

impl ProxierConfig {
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit
    }
}
