//! The kernel reads `explain` and `services` make, behind [`KernelView`] so the tools run
//! against a fake; [`LiveKernel`] reads over netlink (I/O).

use std::net::IpAddr;

use crate::kernel::ipvs::{Ipvs, RealServer, VirtualServer};
use crate::kernel::nft::live::LiveTable;
use crate::kernel::nft::Family;
use crate::tools::ToolError;

/// The kernel reads `explain` needs, behind one trait so the command runs against a fake.
pub trait KernelView {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError>;
    /// The route the kernel picks for `addr`: its interface by name, and the source
    /// address this host would send from.
    fn route(&mut self, addr: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError>;
    /// A table with its generation; None when it does not exist (or is empty).
    fn table(&mut self, family: Family, name: &str) -> Result<Option<(LiveTable, u32)>, ToolError>;
    /// The address of Pod `namespace/name` in `family`, from the EndpointSlices that list
    /// it (`kubeconfig`/`master` as the daemon's flags).
    fn pod_address(
        &mut self,
        pod: (&str, &str),
        family: Family,
        api: (Option<&str>, Option<&str>),
    ) -> Result<IpAddr, String>;
    /// Userspace mode's listeners, from the daemon's metrics server at `addr`.
    fn listeners(
        &mut self,
        addr: std::net::SocketAddr,
    ) -> Result<Vec<crate::proxy::ListenerInfo>, String>;
    /// IPVS virtual server for the key with its real servers; None without IPVS or VS.
    fn ipvs(
        &mut self,
        addr: IpAddr,
        port: u16,
        protocol: u8,
    ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError>;
    /// Every IPVS virtual server with its real servers; none without IPVS.
    fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError>;
}

/// The live kernel, over netlink.
pub struct LiveKernel {
    nft: Option<crate::kernel::nft::netlink::NetlinkNftables>,
    links: Option<crate::kernel::rtnl::NetlinkLinks>,
    ipvs: Option<Option<crate::kernel::ipvs::netlink::NetlinkIpvs>>,
}

impl LiveKernel {
    pub fn new() -> LiveKernel {
        LiveKernel {
            nft: None,
            links: None,
            ipvs: None,
        }
    }

    fn nft(&mut self) -> Result<&mut crate::kernel::nft::netlink::NetlinkNftables, ToolError> {
        if self.nft.is_none() {
            self.nft = Some(
                crate::kernel::nft::netlink::NetlinkNftables::open()
                    .map_err(|e| ToolError::kernel("open the nf_tables netlink socket", e))?,
            );
        }
        Ok(self.nft.as_mut().expect("just set"))
    }

    fn links(&mut self) -> Result<&mut crate::kernel::rtnl::NetlinkLinks, ToolError> {
        if self.links.is_none() {
            self.links = Some(
                crate::kernel::rtnl::NetlinkLinks::open()
                    .map_err(|e| ToolError::kernel("open the rtnetlink socket", e))?,
            );
        }
        Ok(self.links.as_mut().expect("just set"))
    }

    /// A table and its generation, read consistently: re-read when the generation moved
    /// while the several dumps ran (a sync in between), up to 5 times.
    pub fn read_table(
        &mut self,
        family: Family,
        name: &str,
    ) -> Result<(LiveTable, u32), ToolError> {
        let nft = self.nft()?;
        let what = || format!("read table {} {name}", family.name());
        let mut last = None;
        for _ in 0..5 {
            let g0 = nft.generation().map_err(|e| ToolError::kernel(what(), e))?;
            let t = nft
                .read_table(family, name)
                .map_err(|e| ToolError::kernel(what(), e))?;
            let g1 = nft.generation().map_err(|e| ToolError::kernel(what(), e))?;
            if g0 == g1 {
                return Ok((t, g1));
            }
            last = Some((t, g1));
        }
        Ok(last.expect("five reads"))
    }
}

impl Default for LiveKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelView for LiveKernel {
    fn local_addrs(&mut self) -> Result<Vec<IpAddr>, ToolError> {
        use crate::kernel::rtnl::Links;
        Ok(self
            .links()?
            .addresses()
            .map_err(|e| ToolError::kernel("list addresses", e))?
            .into_iter()
            .map(|a| a.addr)
            .collect())
    }

    fn route(&mut self, addr: IpAddr) -> Result<Option<(String, Option<IpAddr>)>, ToolError> {
        let links = self.links()?;
        let Some((index, src)) = links
            .route_get(addr)
            .map_err(|e| ToolError::kernel(format!("look up the route to {addr}"), e))?
        else {
            return Ok(None);
        };
        Ok(links
            .links()
            .map_err(|e| ToolError::kernel("list links", e))?
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| (l.name, src)))
    }

    fn table(&mut self, family: Family, name: &str) -> Result<Option<(LiveTable, u32)>, ToolError> {
        let (t, g) = self.read_table(family, name)?;
        Ok((!t.chains.is_empty()).then_some((t, g)))
    }

    fn pod_address(
        &mut self,
        pod: (&str, &str),
        family: Family,
        api: (Option<&str>, Option<&str>),
    ) -> Result<IpAddr, String> {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime: {e}"))?;
        let (ns, name) = pod;
        let want = if family == Family::Ip { "IPv4" } else { "IPv6" };
        rt.block_on(async {
            let client = crate::source::kube::client(api.0.map(std::path::Path::new), api.1)
                .await
                .map_err(|e| format!("cannot reach the API server: {e}"))?;
            let slices = kube::Api::<EndpointSlice>::namespaced(client, ns);
            let list = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                slices.list(&Default::default()),
            )
            .await
            .map_err(|_| "the API server did not answer in 10 s".to_string())?
            .map_err(|e| format!("cannot list EndpointSlices in {ns}: {e}"))?;
            for s in list.items.iter().filter(|s| s.address_type == want) {
                for e in s.endpoints.iter().flatten() {
                    let is_it = e.target_ref.as_ref().is_some_and(|t| {
                        t.kind.as_deref() == Some("Pod") && t.name.as_deref() == Some(name)
                    });
                    if let Some(a) = e.addresses.first().filter(|_| is_it) {
                        return a.parse().map_err(|_| format!("its address {a:?} is not an IP"));
                    }
                }
            }
            Err(format!(
                "no {want} EndpointSlice in namespace {ns} lists Pod {name} (only Pods behind a Service can be named; give the pod's IP)"
            ))
        })
    }

    fn listeners(
        &mut self,
        addr: std::net::SocketAddr,
    ) -> Result<Vec<crate::proxy::ListenerInfo>, String> {
        let body = crate::tools::http_get(addr, "/userspace/listeners")?;
        serde_json::from_str(&body).map_err(|e| format!("not a listener list: {e}"))
    }

    fn ipvs(
        &mut self,
        addr: IpAddr,
        port: u16,
        protocol: u8,
    ) -> Result<Option<(VirtualServer, Vec<RealServer>)>, ToolError> {
        let Some(ipvs) = self.ipvs_socket()? else {
            return Ok(None);
        };
        let services = ipvs
            .services()
            .map_err(|e| ToolError::kernel("list IPVS virtual servers", e))?;
        let Some(vs) = services
            .into_iter()
            .find(|v| v.addr == addr && v.port == port && v.protocol == protocol)
        else {
            return Ok(None);
        };
        let dests = ipvs
            .dests(&vs)
            .map_err(|e| ToolError::kernel(format!("list the real servers of {}", vs.key()), e))?;
        Ok(Some((vs, dests)))
    }

    fn ipvs_all(&mut self) -> Result<Vec<(VirtualServer, Vec<RealServer>)>, ToolError> {
        let Some(ipvs) = self.ipvs_socket()? else {
            return Ok(Vec::new());
        };
        let services = ipvs
            .services()
            .map_err(|e| ToolError::kernel("list IPVS virtual servers", e))?;
        let mut out = Vec::with_capacity(services.len());
        for vs in services {
            let dests = ipvs.dests(&vs).map_err(|e| {
                ToolError::kernel(format!("list the real servers of {}", vs.key()), e)
            })?;
            out.push((vs, dests));
        }
        Ok(out)
    }
}

impl LiveKernel {
    /// The IPVS socket, opened at the first use; `None` when the kernel has no IPVS.
    fn ipvs_socket(
        &mut self,
    ) -> Result<Option<&mut crate::kernel::ipvs::netlink::NetlinkIpvs>, ToolError> {
        if self.ipvs.is_none() {
            self.ipvs = Some(match crate::kernel::ipvs::netlink::NetlinkIpvs::open() {
                Ok(i) => Some(i),
                Err(crate::kernel::ipvs::Error::Unavailable) => None,
                Err(e) => return Err(ToolError::kernel("open the IPVS netlink socket", e)),
            });
        }
        Ok(self.ipvs.as_mut().and_then(Option::as_mut))
    }
}
