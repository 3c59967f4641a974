//! Where `--from` puts the packet: its source address and input interface, from a Pod name,
//! `node`, `external` or an address and the host's routes. Pure over a [`KernelView`].

use std::net::IpAddr;

use crate::kernel::nft::Family;

use super::super::args;
use super::{external_client, KernelView};
use crate::tools::ToolError;

/// What `--from` resolved to.
pub struct Source {
    pub addr: IpAddr,
    /// None: this host sends it.
    pub iif: Option<String>,
    pub notes: Vec<String>,
}

pub(super) fn resolve_from(
    kv: &mut dyn KernelView,
    a: &args::Args,
    daddr: IpAddr,
    locals: &[IpAddr],
) -> Result<Source, ToolError> {
    let usage = |msg: String| ToolError::Usage {
        tool: "explain",
        msg,
    };
    let family = Family::of(&daddr);
    let from = a.get("from").unwrap_or("node");
    let mut notes = Vec::new();
    let (addr, node) = match from {
        "node" => {
            // The source a connection from this host gets: the route's preferred source,
            // else the first global address of the family.
            let routed = kv
                .route(daddr)?
                .and_then(|(_, src)| src)
                .filter(|s| Family::of(s) == family);
            let addr = routed.or(first_global(locals, family)).ok_or_else(|| {
                usage(format!(
                    "--from node: this host has no {} address",
                    match family {
                        Family::Ip => "IPv4",
                        Family::Ip6 => "IPv6",
                    }
                ))
            })?;
            (addr, true)
        }
        "external" => (external_client(family), false),
        other => {
            let addr: IpAddr = match other.parse() {
                Ok(a) => a,
                Err(_) if is_pod_name(other) => {
                    let (ns, name) = other.split_once('/').unwrap_or(("default", other));
                    let found = kv
                        .pod_address((ns, name), family, (a.get("kubeconfig"), a.get("master")))
                        .map_err(|why| usage(format!("--from {other}: {why}")))?;
                    notes.push(format!("Pod {ns}/{name} is {found}"));
                    found
                }
                Err(_) => {
                    return Err(usage(format!(
                        "--from: want an address, NAMESPACE/POD, node or external, got {other:?}"
                    )))
                }
            };
            if Family::of(&addr) != family {
                return Err(usage(format!(
                    "--from {addr} and --to are of different IP families"
                )));
            }
            let node = locals.contains(&addr) && a.get("iif").is_none();
            if node {
                notes.push(format!(
                    "{addr} is this host's address: the packet starts at output"
                ));
            }
            (addr, node)
        }
    };
    let iif = if node {
        None
    } else if let Some(i) = a.get("iif") {
        Some(i.to_string())
    } else if let Some((i, _)) = kv.route(addr)? {
        notes.push(format!(
            "input interface {i}: the one the kernel routes {addr} through (override with --iif)"
        ));
        Some(i)
    } else {
        Some(unrouted_source_iif(kv, addr, family, &mut notes)?)
    };
    if from == "external" {
        notes.push(format!("external client {addr}"));
    }
    Ok(Source { addr, iif, notes })
}

/// The input interface of a source this host has no route to (a pod on another node behind
/// a CNI that routes by default, a client in a bare namespace): such a packet arrives as
/// traffic from outside this host does, on the interface of the route to outside (the one to
/// [`external_client`]); with no such route either, on an interface no rule names (so no
/// `iifname` match calls it a pod's). Either way a note says so.
pub(super) fn unrouted_source_iif(
    kv: &mut dyn KernelView,
    addr: IpAddr,
    family: Family,
    notes: &mut Vec<String>,
) -> Result<String, ToolError> {
    Ok(match kv.route(external_client(family))? {
        Some((i, _)) => {
            notes.push(format!(
                "no route to {addr}: taken as arriving from outside this host, on {i}, the interface of the route to outside (override with --iif)"
            ));
            i
        }
        None => {
            notes.push(format!(
                "no route to {addr} and none to outside: taken as arriving on an interface no rule names (override with --iif)"
            ));
            UNKNOWN_IIF.into()
        }
    })
}

/// The input interface name used when no route says which: no rule of ours names it.
pub const UNKNOWN_IIF: &str = "(unknown)";

/// `name` or `namespace/name`, each a DNS label or subdomain as Kubernetes names are.
fn is_pod_name(s: &str) -> bool {
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match s.split_once('/') {
        Some((ns, n)) => ok(ns) && ok(n),
        None => ok(s),
    }
}

/// This host's first global (not loopback, not link-local) address in `family`.
pub(crate) fn first_global(locals: &[IpAddr], family: Family) -> Option<IpAddr> {
    locals
        .iter()
        .copied()
        .find(|l| Family::of(l) == family && !l.is_loopback() && !is_link_local(l))
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}
