//! A fake kernel view for `explain` and `services`: node 192.168.0.2 with nftables mode's
//! plan of `default/web`. Used by their unit tests and by the `explain` fuzz target
//! (`src/fuzz.rs`). Pure.

use std::net::IpAddr;

use super::kernel::KernelView;
use crate::kernel::ipvs::{RealServer, VirtualServer};
use crate::kernel::nft::live::LiveTable;
use crate::kernel::nft::Family;
use crate::model::net::proto;
use crate::proxy::{LocalDetector, ProxierConfig};
use crate::tools::ToolError;

/// Node 192.168.0.2 with `default/web` (ClusterIP 10.96.0.10:80, NodePort 30080): one
/// local endpoint and one remote, as nftables mode plans them.
pub struct FakeView {
    /// Whether the host has routes (none at all: nothing is routed, not even outside).
    pub routes: bool,
    /// Our table is [`jhash_table`] instead of the planned one.
    pub jhash: bool,
}

impl Default for FakeView {
    fn default() -> Self {
        FakeView {
            routes: true,
            jhash: false,
        }
    }
}

/// `default/maglev` (10.96.0.20:80): one rule that DNATs by `jhash` into slots 2048..2055 of
/// an endpoint map over three endpoints, as a Maglev service port is planned.
fn jhash_table(family: Family) -> LiveTable {
    use crate::kernel::nft::{
        Chain, ChainType, CmpOp, ElemData, Element, Expr, Field, Hook, KeyValue, Rule, Set, Target,
    };
    let chain = Chain::base("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100);
    let rule = Rule::new(
        "nat-prerouting",
        vec![
            Expr::Addr {
                field: Field::Daddr,
                op: CmpOp::Eq,
                value: "10.96.0.20/32".parse().unwrap(),
            },
            Expr::L4Proto(proto::TCP),
            Expr::DnatHash {
                key: vec![Field::Saddr, Field::Sport, Field::Daddr, Field::Dport],
                modulus: 7,
                seed: 0x4b4e_4c50,
                offset: 2048,
                map: "endpoints-1".into(),
            },
        ],
    )
    .with_comment("default/maglev:http");
    let eps = ["10.244.1.5", "10.244.2.5", "10.244.1.6"];
    let elements: Vec<Element> = [0, 1, 2, 0, 1, 2, 0]
        .iter()
        .enumerate()
        .map(|(i, e)| {
            Element::new(
                "endpoints-1".into(),
                vec![KeyValue::Slot(2048 + i as u32)],
                ElemData::Target(Target::new(eps[*e].parse().unwrap(), 8080)),
                None,
            )
        })
        .collect();
    LiveTable::from_typed(
        family,
        crate::proxy::names::DEFAULT_TABLE,
        [(chain, vec![rule])].iter(),
        [Set::endpoint_map("endpoints-1")].iter(),
        elements.iter(),
    )
}

fn planned(family: Family) -> LiveTable {
    let st = crate::model::fixtures::web_state(Some(30080));
    let cfg = ProxierConfig {
        local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        ..Default::default()
    };
    crate::modes::nftables::plan::build_ruleset(&st, &cfg, family).as_live()
}

impl KernelView for FakeView {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError> {
        Ok(vec!["192.168.0.2".parse().unwrap()])
    }
    fn route(&mut self, a: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError> {
        if !self.routes || a.to_string().starts_with("10.244.9.") {
            return Ok(None); // a pod on another node this host has no route to
        }
        Ok(Some((
            if a.to_string().starts_with("10.244.1.") {
                "veth-pod3".into()
            } else {
                "eth0".into()
            },
            Some("192.168.0.2".parse().unwrap()),
        )))
    }
    fn table(&mut self, family: Family, name: &str) -> Result<Option<(LiveTable, u32)>, ToolError> {
        if name != crate::proxy::names::DEFAULT_TABLE {
            return Ok(None);
        }
        let table = if self.jhash {
            jhash_table(family)
        } else {
            planned(family)
        };
        Ok(Some((table, 7)))
    }
    fn ipvs(
        &mut self,
        _: IpAddr,
        _: u16,
        _: u8,
    ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError> {
        Ok(None)
    }
    fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError> {
        Ok(Vec::new())
    }
    fn listeners(
        &mut self,
        _: std::net::SocketAddr,
    ) -> Result<Vec<crate::proxy::ListenerInfo>, String> {
        Err("no daemon in unit tests".into())
    }
    fn pod_address(
        &mut self,
        pod: (&str, &str),
        _: Family,
        _: (Option<&str>, Option<&str>),
    ) -> Result<IpAddr, String> {
        match pod {
            ("default", "client-0") => Ok("10.244.1.3".parse().unwrap()),
            (ns, n) => Err(format!("no EndpointSlice in namespace {ns} lists Pod {n}")),
        }
    }
}
