//! One shared copy of names that recur: set names across a ruleset's ~220k elements, and
//! namespaces and port names across 10k Services and their EndpointSlices (issue #18: each
//! object held its own copy of `default` and `http`). Pure; a leaf.

/// A shared name: one pointer (8 bytes, not `Arc<str>`'s 16), so an element, a Service
/// port name or a store key that holds several is smaller (issue #18).
pub use arcstr::ArcStr;

/// Entries a [`BoundedCache`] keeps before it is emptied (values stay valid: each holds its
/// own count; only sharing stops until they recur).
const CAPACITY: usize = 4096;

/// A per-thread cache of shared values for keys with few distinct values, emptied when it
/// holds [`CAPACITY`] of them: names here, and the nftables layer's shared element heads.
pub(crate) struct BoundedCache<K, V>(std::collections::HashMap<K, V>);

impl<K, V> Default for BoundedCache<K, V> {
    fn default() -> Self {
        BoundedCache(std::collections::HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq, V: Clone> BoundedCache<K, V> {
    /// The value cached for `k`, else the entry `make` builds, cached.
    pub(crate) fn get_or_insert<Q>(&mut self, k: &Q, make: impl FnOnce() -> (K, V)) -> V
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if let Some(v) = self.0.get(k) {
            return v.clone();
        }
        if self.0.len() >= CAPACITY {
            self.0.clear();
        }
        let (k, v) = make();
        self.0.insert(k, v.clone());
        v
    }
}

/// The shared [`ArcStr`] of `s`, from a per-thread cache. Use it for names with few distinct
/// values (namespaces, port names, set names), not for per-object names, which would only
/// churn the cache.
pub fn shared(s: &str) -> ArcStr {
    thread_local! {
        static NAMES: std::cell::RefCell<BoundedCache<ArcStr, ArcStr>> = Default::default();
    }
    NAMES.with(|n| {
        n.borrow_mut().get_or_insert(s, || {
            let x = ArcStr::from(s);
            (x.clone(), x)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_allocation() {
        let (a, b) = (shared("default"), shared(&String::from("default")));
        assert!(ArcStr::ptr_eq(&a, &b));
        assert_eq!(&*a, "default");
        assert!(!ArcStr::ptr_eq(&a, &shared("kube-system")));
    }

    #[test]
    fn a_full_cache_starts_over_and_names_stay_valid() {
        let first = shared("name-0");
        for i in 1..=CAPACITY + 1 {
            shared(&format!("name-{i}"));
        }
        assert_eq!(&*first, "name-0");
        assert_eq!(&*shared("name-0"), "name-0");
    }
}
