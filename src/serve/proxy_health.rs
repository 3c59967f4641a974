//! Proxy health with upstream semantics (`pkg/proxy/healthcheck/proxy_health.go`): the proxy
//! is unhealthy when an update has been queued for longer than the health timeout
//! (2 × sync period) without a successful sync of that family. `/healthz` also reports the
//! node as ineligible while it is being deleted; `/livez` ignores eligibility. Pure: callers
//! pass the time.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::kernel::nft::Family;

/// Health bookkeeping for the families the proxy programs.
#[derive(Debug, Clone)]
pub struct ProxyHealth {
    timeout: Duration,
    /// The families reported: both until start-up finds which the host has.
    families: Vec<Family>,
    last_updated: BTreeMap<Family, SystemTime>,
    oldest_queued: BTreeMap<Family, SystemTime>,
    node_eligible: bool,
}

/// One family's state in the JSON body.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FamilyStatus {
    #[serde(rename = "lastUpdated")]
    pub last_updated: String,
    pub healthy: bool,
}

/// The JSON body of `/healthz` and `/livez`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HealthStatus {
    #[serde(rename = "lastUpdated")]
    pub last_updated: String,
    #[serde(rename = "currentTime")]
    pub current_time: String,
    #[serde(rename = "nodeEligible")]
    pub node_eligible: bool,
    pub healthy: bool,
    pub status: BTreeMap<String, FamilyStatus>,
}

/// RFC 3339 in UTC with nanoseconds trimmed to what Go prints by default.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = if month <= 2 { y + 1 } else { y };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

impl ProxyHealth {
    pub fn new(timeout: Duration) -> Self {
        ProxyHealth {
            timeout,
            families: Family::all().to_vec(),
            last_updated: BTreeMap::new(),
            oldest_queued: BTreeMap::new(),
            node_eligible: true,
        }
    }

    /// Reports `families` only (a host without usable IPv6 runs IPv4 alone), as upstream
    /// reports the families it runs a proxier for.
    pub fn set_families(&mut self, families: &[Family]) {
        self.families = families.to_vec();
        self.last_updated.retain(|f, _| families.contains(f));
        self.oldest_queued.retain(|f, _| families.contains(f));
    }

    /// An update for `family` was queued (only the oldest pending one counts).
    pub fn queued_update(&mut self, family: Family, now: SystemTime) {
        self.oldest_queued.entry(family).or_insert(now);
    }

    /// `family` was synced successfully.
    pub fn updated(&mut self, family: Family, now: SystemTime) {
        self.last_updated.insert(family, now);
        self.oldest_queued.remove(&family);
    }

    pub fn set_node_eligible(&mut self, eligible: bool) {
        self.node_eligible = eligible;
    }

    /// The status at `now`. `/healthz` uses `healthy && node_eligible`; `/livez` `healthy`.
    pub fn status(&self, now: SystemTime) -> HealthStatus {
        let mut healthy = true;
        let mut status = BTreeMap::new();
        for &family in &self.families {
            let fam_healthy = match self.oldest_queued.get(&family) {
                Some(q) => now.duration_since(*q).unwrap_or_default() < self.timeout,
                None => true,
            };
            healthy &= fam_healthy;
            let lu = self.last_updated.get(&family).copied();
            status.insert(
                match family {
                    Family::Ip => "IPv4".to_string(),
                    Family::Ip6 => "IPv6".to_string(),
                },
                FamilyStatus {
                    last_updated: lu.map(rfc3339).unwrap_or_default(),
                    healthy: fam_healthy,
                },
            );
        }
        let last = self.last_updated.values().max().copied();
        HealthStatus {
            last_updated: last.map(rfc3339).unwrap_or_default(),
            current_time: rfc3339(now),
            node_eligible: self.node_eligible,
            healthy,
            status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    /// A single-stack host reports its one family, as upstream reports the families it
    /// runs a proxier for.
    #[test]
    fn a_single_stack_host_reports_its_one_family() {
        let mut h = ProxyHealth::new(Duration::from_secs(60));
        assert_eq!(h.status(t(0)).status.len(), 2, "both until start-up knows");
        h.queued_update(Family::Ip6, t(0));
        h.set_families(&[Family::Ip]);
        h.queued_update(Family::Ip, t(1));
        h.updated(Family::Ip, t(2));
        let s = h.status(t(500));
        assert_eq!(s.status.keys().collect::<Vec<_>>(), vec!["IPv4"]);
        assert!(s.healthy, "the IPv6 update queued before is forgotten");
    }

    #[test]
    fn healthy_while_starting_and_when_synced() {
        let mut h = ProxyHealth::new(Duration::from_secs(60));
        assert!(h.status(t(0)).healthy);
        h.queued_update(Family::Ip, t(0));
        assert!(h.status(t(59)).healthy, "queued for less than the timeout");
        assert!(!h.status(t(61)).healthy, "queued too long without a sync");
        h.updated(Family::Ip, t(62));
        assert!(h.status(t(200)).healthy);
    }

    #[test]
    fn only_the_oldest_queued_update_counts() {
        let mut h = ProxyHealth::new(Duration::from_secs(60));
        h.queued_update(Family::Ip6, t(0));
        h.queued_update(Family::Ip6, t(50));
        let s = h.status(t(61));
        assert!(!s.healthy);
        assert!(!s.status["IPv6"].healthy);
        assert!(s.status["IPv4"].healthy);
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_709_251_199)),
            "2024-02-29T23:59:59.000000000Z"
        );
    }
}
