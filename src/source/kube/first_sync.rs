//! What the first state waits for (the initial lists, this node's Node, its podCIDRs where they
//! detect local traffic), how long, and the progress lines while waiting. Pure: the caller passes
//! the time.

use super::*;

/// How often start-up says what it still waits for: the first list of a small cluster
/// completes well within one period, so the line appears only when something is missing,
/// and a streaming list the server never ends ([`END_WAIT`]'s 10 s) is named twice before
/// it is given up.
pub(super) const WAIT_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the first state waits for this node's Node object: upstream's getNodeIPs
/// polls with a 1 s backoff doubling over 6 steps (1+2+4+8+16 s = 31 s), and its
/// NodeManager waits ~30 s since kubernetes#133059, then both go on without the Node's
/// addresses ("Can't determine this node's IP, assuming loopback").
pub(super) const NODE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the first state waits for the Node's podCIDRs when local traffic is detected by
/// them (`NodeCIDR`): upstream's NodeManager waits 5 minutes "for allocators to assign a
/// PodCIDR to the node after it is registered" (and then fails start-up; we go on and pick
/// them up when they come, with the detector's warning at each sync meanwhile).
pub(super) const POD_CIDR_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

/// One turn of the API source's loop.
pub(super) enum Step {
    Batch(Vec<watcher::Result<Update>>),
    /// Held changes fell due.
    Held,
    /// Time to say what the first state still waits for.
    Progress,
}

/// What the first state waits for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FirstSync {
    /// The initial lists of these kinds.
    Kinds(Vec<&'static str>),
    /// This node's Node object, for less than the wait.
    Node,
    /// The Node wait is over: go on without it.
    NodeGivenUp,
    /// The Node's podCIDRs (`NodeCIDR` detection), for less than their wait.
    PodCidrs,
    /// The podCIDR wait is over: go on without them.
    PodCidrsGivenUp,
    Ready,
}

/// How long the first state waits for what it needs of this node's Node.
#[derive(Debug, Clone, Copy)]
pub(super) struct NodeWaits {
    pub(super) node: std::time::Duration,
    /// `Some` when local traffic is detected by the Node's podCIDRs.
    pub(super) pod_cidrs: Option<std::time::Duration>,
}

/// What the first state waits for after `waited`. Pure.
pub(super) fn first_sync_wait(
    stores: &Stores,
    node: &str,
    waited: std::time::Duration,
    waits: NodeWaits,
) -> FirstSync {
    let missing: Vec<&'static str> = [
        ("Services", stores.services.synced()),
        ("EndpointSlices", stores.slices.synced()),
        ("Nodes", stores.nodes.synced()),
    ]
    .into_iter()
    .filter(|(_, synced)| !synced)
    .map(|(kind, _)| kind)
    .collect();
    let this = stores.nodes.values().find(|n| n.name == node);
    match (missing.is_empty(), this, waits.pod_cidrs) {
        (false, _, _) => FirstSync::Kinds(missing),
        (true, None, _) if waited < waits.node => FirstSync::Node,
        (true, None, _) => FirstSync::NodeGivenUp,
        (true, Some(n), Some(limit)) if n.pod_cidrs.is_empty() => {
            if waited < limit {
                FirstSync::PodCidrs
            } else {
                FirstSync::PodCidrsGivenUp
            }
        }
        (true, Some(_), _) => FirstSync::Ready,
    }
}

/// What the first state waits for and has stopped waiting for: the initial lists, this
/// node's Node (up to [`NODE_WAIT`]) and its podCIDRs where they detect local traffic (up to
/// [`POD_CIDR_WAIT`]); a ruleset programmed without them is not this node's.
pub(super) struct FirstSyncWait {
    pub(super) waits: NodeWaits,
    pub(super) started: std::time::Instant,
    /// The first state went out.
    pub(super) announced: bool,
    pub(super) node_given_up: bool,
    pub(super) pod_cidrs_given_up: bool,
}

impl FirstSyncWait {
    pub(super) fn new(waits: NodeWaits) -> Self {
        FirstSyncWait {
            waits,
            started: std::time::Instant::now(),
            announced: false,
            node_given_up: false,
            pod_cidrs_given_up: false,
        }
    }

    /// Says what the first state still waits for; whether a wait was given up now (the
    /// state may go out without it).
    pub(super) fn progress(&mut self, stores: &Stores, node: &str) -> bool {
        let waited = self.started.elapsed();
        match first_sync_wait(stores, node, waited, self.waits) {
            FirstSync::Kinds(missing) => tracing::info!(
                missing = %missing.join(", "),
                waited_s = waited.as_secs(),
                "waiting for the initial list"
            ),
            FirstSync::Node => tracing::info!(
                node = %node,
                waited_s = waited.as_secs(),
                limit_s = NODE_WAIT.as_secs(),
                "waiting for this node's Node object (its addresses, podCIDR and labels)"
            ),
            FirstSync::NodeGivenUp if !self.node_given_up => {
                tracing::warn!(
                    node = %node,
                    waited_s = waited.as_secs(),
                    "no Node object by this name; proceeding without its addresses until it appears, as upstream kube-proxy does after its wait"
                );
                self.node_given_up = true;
                return true;
            }
            FirstSync::PodCidrs => tracing::info!(
                node = %node,
                waited_s = waited.as_secs(),
                limit_s = POD_CIDR_WAIT.as_secs(),
                "waiting for this node's podCIDRs (detect-local-mode NodeCIDR)"
            ),
            FirstSync::PodCidrsGivenUp if !self.pod_cidrs_given_up => {
                tracing::warn!(
                    node = %node,
                    waited_s = waited.as_secs(),
                    "the Node has no podCIDRs; proceeding without local traffic detection until it has"
                );
                self.pod_cidrs_given_up = true;
                return true;
            }
            FirstSync::NodeGivenUp | FirstSync::PodCidrsGivenUp | FirstSync::Ready => {}
        }
        false
    }

    /// Whether the first state is still held back for the Node or its podCIDRs.
    pub(super) fn holds(&self, stores: &Stores, node: &str) -> bool {
        if self.announced {
            return false;
        }
        match first_sync_wait(stores, node, self.started.elapsed(), self.waits) {
            FirstSync::Node | FirstSync::NodeGivenUp => !self.node_given_up,
            FirstSync::PodCidrs | FirstSync::PodCidrsGivenUp => !self.pod_cidrs_given_up,
            FirstSync::Kinds(_) | FirstSync::Ready => false,
        }
    }

    /// The first state goes out: say so once.
    pub(super) fn announce(&mut self, stores: &Stores) {
        if !self.announced {
            tracing::info!(
                services = stores.services.len(),
                slices = stores.slices.len(),
                "initial list complete"
            );
            self.announced = true;
        }
    }
}
