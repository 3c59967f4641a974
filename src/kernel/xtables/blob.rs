//! Pure reading and rewriting of an x_tables table blob (what `IPT_SO_GET_ENTRIES` returns
//! and `IPT_SO_SET_REPLACE` takes): entries in order, user chains opened by an `ERROR`
//! entry carrying the chain's name, jumps as standard-target verdicts holding the byte
//! offset of the entry jumped to. Removing chains means dropping their entries and the
//! entries elsewhere that jump into them, then renumbering every offset (hooks, underflows,
//! verdicts). Byte tests below build tables the way libiptc lays them out.

use super::uapi::*;

/// A table as read: its hooks and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableBlob {
    pub name: String,
    pub valid_hooks: u32,
    pub hook_entry: [u32; NF_INET_NUMHOOKS],
    pub underflow: [u32; NF_INET_NUMHOOKS],
    pub num_entries: u32,
    pub entries: Vec<u8>,
}

/// The replacement for a table, and what it removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub table: TableBlob,
    /// For each entry of `table`, the index of the entry of the old table it is: whose
    /// counters it carries on ([`add_counters_request`]).
    pub kept: Vec<u32>,
    pub removed_chains: Vec<String>,
    pub removed_jumps: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    off: usize,
    len: usize,
    /// Standard target: the verdict (`>= 0`: an offset to jump to).
    verdict: Option<i32>,
    /// ERROR target: the chain name it opens (or "ERROR" for the table's end).
    error_name: Option<String>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|x| u16::from_ne_bytes([x[0], x[1]]))
}

fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    b.get(at..at + 4)
        .map(|x| i32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn parse(layout: EntryLayout, blob: &[u8]) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < blob.len() {
        let e = &blob[off..];
        let t = u16_at(e, layout.target_offset).ok_or("entry cut short")? as usize;
        let n = u16_at(e, layout.next_offset).ok_or("entry cut short")? as usize;
        if n < layout.size || t < layout.size || t + TARGET_HDR > n || off + n > blob.len() {
            return Err(format!("entry at {off}: bad offsets {t}/{n}"));
        }
        let target = &e[t..n];
        let name = cstr(&target[2..2 + 29]);
        let (verdict, error_name) = match name.as_str() {
            "" => (i32_at(target, TARGET_HDR), None),
            ERROR_TARGET => (
                None,
                Some(cstr(
                    target
                        .get(TARGET_HDR..(TARGET_HDR + XT_TABLE_MAXNAMELEN).min(target.len()))
                        .unwrap_or(&[]),
                )),
            ),
            _ => (None, None),
        };
        out.push(Entry {
            off,
            len: n,
            verdict,
            error_name,
        });
        off += n;
    }
    Ok(out)
}

/// The user chains of a table with their byte ranges `[start, end)` (the ERROR header
/// included).
pub fn user_chains(
    layout: EntryLayout,
    t: &TableBlob,
) -> Result<Vec<(String, usize, usize)>, String> {
    let entries = parse(layout, &t.entries)?;
    let hooks: Vec<usize> = (0..NF_INET_NUMHOOKS)
        .filter(|h| t.valid_hooks & (1 << h) != 0)
        .map(|h| t.hook_entry[h] as usize)
        .collect();
    let mut chains: Vec<(String, usize, usize)> = Vec::new();
    for e in &entries {
        let opens_user_chain = e.error_name.as_deref().filter(|n| *n != ERROR_TARGET);
        if opens_user_chain.is_some() || hooks.contains(&e.off) || e.error_name.is_some() {
            if let Some(last) = chains.last_mut() {
                if last.2 == usize::MAX {
                    last.2 = e.off;
                }
            }
        }
        if let Some(name) = opens_user_chain {
            chains.push((name.to_string(), e.off, usize::MAX));
        }
    }
    Ok(chains)
}

/// Removes the user chains `owned` selects, and every entry of another chain that jumps
/// into one of them. `None` when nothing is selected.
pub fn remove_chains(
    layout: EntryLayout,
    t: &TableBlob,
    owned: impl Fn(&str) -> bool,
) -> Result<Option<Rewrite>, String> {
    let entries = parse(layout, &t.entries)?;
    let chains = user_chains(layout, t)?;
    let doomed: Vec<&(String, usize, usize)> = chains.iter().filter(|c| owned(&c.0)).collect();
    if doomed.is_empty() {
        return Ok(None);
    }
    let in_doomed = |off: usize| doomed.iter().any(|(_, s, e)| off >= *s && off < *e);
    let mut removed_jumps = 0;
    let keep: Vec<bool> = entries
        .iter()
        .map(|e| {
            if in_doomed(e.off) {
                return false;
            }
            match e.verdict {
                Some(v) if v >= 0 && in_doomed(v as usize) => {
                    removed_jumps += 1;
                    false
                }
                _ => true,
            }
        })
        .collect();
    // old offset → new offset. A removed entry maps to where the next kept one lands: a
    // hook (or a jump) that pointed at a chain's removed first rule then points at the
    // chain's next rule. Offsets inside removed chains are never asked for (their jumps
    // went with them).
    let mut map = std::collections::HashMap::new();
    let mut new_off = 0usize;
    for (e, k) in entries.iter().zip(&keep) {
        if !in_doomed(e.off) {
            map.insert(e.off, new_off);
        }
        if *k {
            new_off += e.len;
        }
    }
    let remap = |old: usize, what: &str| -> Result<u32, String> {
        map.get(&old)
            .map(|n| *n as u32)
            .ok_or_else(|| format!("{what} at {old} points into a removed chain"))
    };
    let mut blob = Vec::with_capacity(new_off);
    for (e, k) in entries.iter().zip(&keep) {
        if !*k {
            continue;
        }
        let start = blob.len();
        blob.extend_from_slice(&t.entries[e.off..e.off + e.len]);
        if let Some(v) = e.verdict.filter(|v| *v >= 0) {
            let nv = remap(v as usize, "a jump")?;
            let t_off = u16_at(&t.entries[e.off..], layout.target_offset).unwrap_or(0) as usize;
            let at = start + t_off + TARGET_HDR;
            blob[at..at + 4].copy_from_slice(&(nv as i32).to_ne_bytes());
        }
    }
    let mut hook_entry = t.hook_entry;
    let mut underflow = t.underflow;
    for h in 0..NF_INET_NUMHOOKS {
        if t.valid_hooks & (1 << h) != 0 {
            hook_entry[h] = remap(t.hook_entry[h] as usize, "a hook")?;
            underflow[h] = remap(t.underflow[h] as usize, "an underflow")?;
        }
    }
    Ok(Some(Rewrite {
        table: TableBlob {
            name: t.name.clone(),
            valid_hooks: t.valid_hooks,
            hook_entry,
            underflow,
            num_entries: keep.iter().filter(|k| **k).count() as u32,
            entries: blob,
        },
        kept: keep
            .iter()
            .enumerate()
            .filter(|(_, k)| **k)
            .map(|(i, _)| i as u32)
            .collect(),
        removed_chains: doomed.iter().map(|c| c.0.clone()).collect(),
        removed_jumps,
    }))
}

/// `struct ipt_get_entries` request for `size` bytes of entries.
pub fn get_entries_request(name: &str, size: u32) -> Vec<u8> {
    let mut b = vec![0u8; GET_ENTRIES_HDR + size as usize];
    put_name(&mut b, name);
    b[32..36].copy_from_slice(&size.to_ne_bytes());
    b
}

fn put_name(b: &mut [u8], name: &str) {
    let n = name.len().min(XT_TABLE_MAXNAMELEN - 1);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
}

/// `struct ipt_getinfo` request.
pub fn get_info_request(name: &str) -> Vec<u8> {
    let mut b = vec![0u8; GETINFO_LEN];
    put_name(&mut b, name);
    b
}

/// Reads `struct ipt_getinfo`: (valid_hooks, hook_entry, underflow, num_entries, size).
#[allow(clippy::type_complexity)]
pub fn parse_info(
    b: &[u8],
) -> Option<(
    u32,
    [u32; NF_INET_NUMHOOKS],
    [u32; NF_INET_NUMHOOKS],
    u32,
    u32,
)> {
    if b.len() < GETINFO_LEN {
        return None;
    }
    let u = |at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let mut hooks = [0; NF_INET_NUMHOOKS];
    let mut under = [0; NF_INET_NUMHOOKS];
    for h in 0..NF_INET_NUMHOOKS {
        hooks[h] = u(36 + 4 * h);
        under[h] = u(56 + 4 * h);
    }
    Some((u(32), hooks, under, u(76), u(80)))
}

/// `struct ipt_replace` for `new`, with room for the kernel to return `old_entries`
/// counters at `counters_addr`.
pub fn replace_request(new: &TableBlob, old_entries: u32, counters_addr: u64) -> Vec<u8> {
    let mut b = vec![0u8; REPLACE_HDR];
    put_name(&mut b, &new.name);
    let mut put = |at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    put(32, new.valid_hooks);
    put(36, new.num_entries);
    put(40, new.entries.len() as u32);
    for h in 0..NF_INET_NUMHOOKS {
        put(44 + 4 * h, new.hook_entry[h]);
        put(64 + 4 * h, new.underflow[h]);
    }
    put(84, old_entries);
    b[88..96].copy_from_slice(&counters_addr.to_ne_bytes());
    b.extend_from_slice(&new.entries);
    b
}

/// `struct xt_counters_info` for table `name`: for each new entry, the counters the old
/// entry `kept[i]` had when the table was replaced (`old_counters`, as `IPT_SO_SET_REPLACE`
/// returned them, `COUNTERS_LEN` bytes per old entry). `IPT_SO_SET_ADD_COUNTERS` adds them
/// to the new table's entries in order, as iptables-restore does after a replace: without
/// it every rule kept, another program's included, would start again from zero.
pub fn add_counters_request(name: &str, old_counters: &[u8], kept: &[u32]) -> Option<Vec<u8>> {
    let mut b = vec![0u8; ADD_COUNTERS_HDR];
    put_name(&mut b, name);
    b[XT_TABLE_MAXNAMELEN..XT_TABLE_MAXNAMELEN + 4]
        .copy_from_slice(&(kept.len() as u32).to_ne_bytes());
    for &old in kept {
        let at = old as usize * COUNTERS_LEN;
        b.extend_from_slice(old_counters.get(at..at + COUNTERS_LEN)?);
    }
    Some(b)
}

/// Tables laid out as libiptc lays them out, for the unit tests and the `xtables_blob` fuzz
/// target's seeds.
#[cfg(any(test, feature = "testing"))]
pub mod fixtures {
    use super::*;

    /// Builds entries as libiptc lays them out.
    pub struct Builder {
        pub layout: EntryLayout,
        pub buf: Vec<u8>,
    }

    impl Builder {
        pub fn new(layout: EntryLayout) -> Self {
            Builder {
                layout,
                buf: Vec::new(),
            }
        }
        fn entry(&mut self, target: &[u8]) -> usize {
            let off = self.buf.len();
            let n = self.layout.size + target.len();
            let mut e = vec![0u8; self.layout.size];
            e[self.layout.target_offset..self.layout.target_offset + 2]
                .copy_from_slice(&(self.layout.size as u16).to_ne_bytes());
            e[self.layout.next_offset..self.layout.next_offset + 2]
                .copy_from_slice(&(n as u16).to_ne_bytes());
            self.buf.extend_from_slice(&e);
            self.buf.extend_from_slice(target);
            off
        }
        /// A standard target (40 bytes: header, verdict, padding).
        pub fn standard(&mut self, verdict: i32) -> usize {
            let mut t = vec![0u8; 40];
            t[0..2].copy_from_slice(&40u16.to_ne_bytes());
            t[32..36].copy_from_slice(&verdict.to_ne_bytes());
            self.entry(&t)
        }
        /// An ERROR target (64 bytes) naming a chain.
        pub fn error(&mut self, name: &str) -> usize {
            let mut t = vec![0u8; 64];
            t[0..2].copy_from_slice(&64u16.to_ne_bytes());
            t[2..7].copy_from_slice(b"ERROR");
            t[32..32 + name.len()].copy_from_slice(name.as_bytes());
            self.entry(&t)
        }
        /// Some other target (MASQUERADE-like), 32 bytes of header only.
        pub fn other(&mut self, name: &str) -> usize {
            let mut t = vec![0u8; 32];
            t[0..2].copy_from_slice(&32u16.to_ne_bytes());
            t[2..2 + name.len()].copy_from_slice(name.as_bytes());
            self.entry(&t)
        }
        pub fn patch_verdict(&mut self, entry_off: usize, verdict: i32) {
            let at = entry_off + self.layout.size + 32;
            self.buf[at..at + 4].copy_from_slice(&verdict.to_ne_bytes());
        }
    }

    const ACCEPT: i32 = -2;
    const RETURN: i32 = -5;

    /// nat-like: PREROUTING (hook 0) jumps to KUBE-SERVICES and FOREIGN; KUBE-SERVICES
    /// jumps to KUBE-SVC-X; FOREIGN stays.
    pub fn sample(layout: EntryLayout) -> (TableBlob, Vec<usize>) {
        let mut b = Builder::new(layout);
        let pre_jump_kube = b.standard(0);
        let pre_jump_foreign = b.standard(0);
        let pre_policy = b.standard(ACCEPT);
        let out_policy = b.standard(ACCEPT);
        let kube_hdr = b.error("KUBE-SERVICES");
        let kube_jump = b.standard(0);
        let kube_ret = b.standard(RETURN);
        let svc_hdr = b.error("KUBE-SVC-X");
        let _svc_rule = b.other("DNAT");
        let _svc_ret = b.standard(RETURN);
        let foreign_hdr = b.error("FOREIGN");
        let _foreign_rule = b.other("MASQUERADE");
        let _foreign_ret = b.standard(RETURN);
        let _end = b.error("ERROR");
        let chain_start = |hdr: usize| (hdr + layout.size + 64) as i32;
        b.patch_verdict(pre_jump_kube, chain_start(kube_hdr));
        b.patch_verdict(pre_jump_foreign, chain_start(foreign_hdr));
        b.patch_verdict(kube_jump, chain_start(svc_hdr));
        let _ = kube_ret;
        let t = TableBlob {
            name: "nat".into(),
            valid_hooks: 0b1001, // PREROUTING and OUTPUT(3)
            hook_entry: [pre_jump_kube as u32, 0, 0, out_policy as u32, 0],
            underflow: [pre_policy as u32, 0, 0, out_policy as u32, 0],
            num_entries: 14,
            entries: b.buf,
        };
        (t, vec![pre_jump_foreign, foreign_hdr])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn removes_owned_chains_and_jumps_and_renumbers() {
        for layout in [IPV4, IPV6] {
            let (t, _) = sample(layout);
            let chains = user_chains(layout, &t).unwrap();
            assert_eq!(
                chains.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
                ["KUBE-SERVICES", "KUBE-SVC-X", "FOREIGN"]
            );
            let r = remove_chains(layout, &t, |n| n.starts_with("KUBE-"))
                .unwrap()
                .unwrap();
            assert_eq!(r.removed_chains, ["KUBE-SERVICES", "KUBE-SVC-X"]);
            assert_eq!(r.removed_jumps, 1);
            assert_eq!(r.table.num_entries, 14 - 7);
            // The jump to FOREIGN, both policies, FOREIGN's three entries and the end:
            // the old entries whose counters the new ones carry on.
            assert_eq!(r.kept, [1, 2, 3, 10, 11, 12, 13]);
            let left = user_chains(layout, &r.table).unwrap();
            assert_eq!(left.len(), 1);
            assert_eq!(left[0].0, "FOREIGN");
            // PREROUTING now starts with the jump to FOREIGN, which points at FOREIGN's
            // first rule after renumbering.
            let entries = parse(layout, &r.table.entries).unwrap();
            assert_eq!(r.table.hook_entry[0], 0);
            assert_eq!(
                entries[0].verdict,
                Some((left[0].1 + layout.size + 64) as i32)
            );
            assert_eq!(r.table.underflow[0] as usize, entries[1].off);
            assert_eq!(r.table.hook_entry[3] as usize, entries[2].off);
            // nothing selected: untouched
            assert_eq!(remove_chains(layout, &t, |n| n == "NOPE").unwrap(), None);
        }
    }

    #[test]
    fn counters_are_carried_to_the_kept_entries_in_their_new_order() {
        // Three old entries: (packets, bytes) = (1, 10), (2, 20), (3, 30).
        let mut old = Vec::new();
        for (p, b) in [(1u64, 10u64), (2, 20), (3, 30)] {
            old.extend_from_slice(&p.to_ne_bytes());
            old.extend_from_slice(&b.to_ne_bytes());
        }
        let req = add_counters_request("filter", &old, &[0, 2]).unwrap();
        assert_eq!(req.len(), 40 + 2 * 16);
        assert_eq!(&req[..6], b"filter");
        assert!(req[6..32].iter().all(|b| *b == 0), "name NUL-padded");
        assert_eq!(u32::from_ne_bytes(req[32..36].try_into().unwrap()), 2);
        assert_eq!(&req[36..40], [0; 4], "padding before the counters");
        assert_eq!(&req[40..56], &old[0..16]);
        assert_eq!(&req[56..72], &old[32..48]);
        // An index past the counters returned is refused, not read out of bounds.
        assert_eq!(add_counters_request("filter", &old, &[3]), None);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let (t, _) = sample(IPV4);
        for cut in [1usize, 50, 100, 200, 500] {
            let mut bad = t.clone();
            bad.entries.truncate(cut.min(bad.entries.len()));
            let _ = remove_chains(IPV4, &bad, |_| true);
        }
        let mut bad = t.clone();
        bad.entries[IPV4.next_offset] = 1;
        bad.entries[IPV4.next_offset + 1] = 0;
        assert!(remove_chains(IPV4, &bad, |_| true).is_err());
    }

    #[test]
    fn request_layouts() {
        let r = get_info_request("nat");
        assert_eq!(r.len(), 84);
        assert_eq!(&r[..4], b"nat\0");
        let (t, _) = sample(IPV4);
        let b = replace_request(&t, 14, 0x1122334455667788);
        assert_eq!(b.len(), 96 + t.entries.len());
        assert_eq!(u32::from_ne_bytes(b[36..40].try_into().unwrap()), 14);
        assert_eq!(
            u32::from_ne_bytes(b[40..44].try_into().unwrap()) as usize,
            t.entries.len()
        );
        assert_eq!(
            u64::from_ne_bytes(b[88..96].try_into().unwrap()),
            0x1122334455667788
        );
        let g = get_entries_request("filter", 1000);
        assert_eq!(g.len(), 1040);
        assert_eq!(u32::from_ne_bytes(g[32..36].try_into().unwrap()), 1000);
    }
}
