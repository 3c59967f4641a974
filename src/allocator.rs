//! The process's allocator and what it holds: a [`Counted`] wrapper the binary installs around
//! glibc's malloc, so that "heap in use" is the bytes the program holds (glibc's own figure
//! counts its chunk headers too); glibc's settings; the release of freed memory after a
//! sync. Every layer may read it. I/O (the allocator's own calls); no socket.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Bytes handed out and not yet freed, counted by [`Counted`].
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Whether a [`Counted`] allocator serves this process (library tests use the system's).
static COUNTED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes it has handed out. One relaxed atomic add per
/// allocation and one subtract per free.
pub struct Counted<A> {
    inner: A,
}

impl<A> Counted<A> {
    pub const fn new(inner: A) -> Self {
        Counted { inner }
    }
}

// SAFETY: every call is passed unchanged to `inner`, which upholds GlobalAlloc's contract;
// the counters are only arithmetic beside it.
#[allow(unsafe_code)] // GlobalAlloc is an unsafe trait
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { self.inner.alloc(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { self.inner.alloc_zeroed(layout) };
        if !p.is_null() {
            note_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.inner.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let p = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // On failure the old block stays allocated, so nothing changes.
            IN_USE.fetch_add(new_size, Ordering::Relaxed);
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

fn note_alloc(size: usize) {
    IN_USE.fetch_add(size, Ordering::Relaxed);
    if !COUNTED.load(Ordering::Relaxed) {
        COUNTED.store(true, Ordering::Relaxed);
    }
}

/// glibc's malloc, set up before any thread starts (call first thing in `main`), each setting
/// unless the environment sets it (its `MALLOC_*` variable or its `GLIBC_TUNABLES` entry):
/// - two arenas: glibc gives each thread that meets contention an arena of its own (up to 8
///   per core), and what is freed in one stays mapped there: with a 26 MB manifest decoded on
///   two threads, RSS after the first sync at 10k × 10 was 136 MiB with glibc's default,
///   98 MiB with two (102 MiB decoding on one thread), and one arena made the two decoding
///   threads wait on each other (cold start 2.64 s against 1.50 s; issue #18);
/// - blocks of 128 KiB and more mapped on their own, always: glibc starts there but raises the
///   threshold to the size of each mapped block it frees (up to 32 MiB), after which a sync's
///   transaction buffers are carved from the main heap, and the small long-lived objects
///   allocated between them keep the holes from being returned. In the hour's soak at
///   10k × 10 that grew the RSS floor from 83 to 98 MiB with 42 MiB in use (issue #50).
#[allow(unsafe_code)] // mallopt(3) has no safe wrapper
pub fn tune_glibc_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let env = |name: &str| std::env::var(name).ok();
        // SAFETY: mallopt only changes a tunable of the allocator; no thread runs yet.
        unsafe {
            if !set_by_environment("MALLOC_ARENA_MAX", "glibc.malloc.arena_max", env) {
                libc::mallopt(libc::M_ARENA_MAX, 2);
            }
            if !set_by_environment("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold", env) {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            }
        }
    }
}

/// Whether the operator set a malloc setting: its own variable, or its name among
/// `GLIBC_TUNABLES`' colon-separated `name=value` pairs (another tunable there leaves ours
/// in force; `mallopt` after start-up would override the operator's).
fn set_by_environment(variable: &str, tunable: &str, env: impl Fn(&str) -> Option<String>) -> bool {
    env(variable).is_some()
        || env("GLIBC_TUNABLES").is_some_and(|pairs| {
            pairs
                .split(':')
                .any(|pair| pair.split('=').next() == Some(tunable))
        })
}

/// glibc's own starting threshold, kept fixed (see [`tune_glibc_malloc`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Bytes the program holds on the heap now: [`Counted`]'s count when it serves the process,
/// else glibc's own figure (chunks in use plus blocks mapped on their own).
pub fn in_use_bytes() -> Option<usize> {
    if COUNTED.load(Ordering::Relaxed) {
        return Some(IN_USE.load(Ordering::Relaxed));
    }
    glibc_in_use()
}

#[allow(unsafe_code)] // mallinfo2(3) has no safe wrapper
fn glibc_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let m = unsafe { libc::mallinfo2() };
        Some(m.uordblks + m.hblkhd)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// After a sync, which allocates the whole transaction and its encoding for a moment: glibc
/// keeps freed pages of its heaps mapped until `malloc_trim` hands them back.
#[allow(unsafe_code)] // malloc_trim(3) has no safe wrapper
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap memory; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count follows allocations, growth and frees through the wrapper.
    #[test]
    fn the_count_follows_allocations_and_frees() {
        let a = Counted::new(std::alloc::System);
        let before = IN_USE.load(Ordering::Relaxed);
        let layout = Layout::from_size_align(1000, 8).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a valid non-zero layout; the block is freed with the layout it has.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(IN_USE.load(Ordering::Relaxed) - before, 1000);
            let q = a.realloc(p, layout, 5000);
            assert!(!q.is_null());
            assert_eq!(IN_USE.load(Ordering::Relaxed) - before, 5000);
            a.dealloc(q, Layout::from_size_align(5000, 8).unwrap());
        }
        assert_eq!(IN_USE.load(Ordering::Relaxed), before);
        assert!(in_use_bytes().is_some());
    }

    /// Each setting yields to its own variable or its own tunable, not to another's.
    #[test]
    fn the_environment_overrides_each_setting_by_its_own_name() {
        let with = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let arena =
            |vars| set_by_environment("MALLOC_ARENA_MAX", "glibc.malloc.arena_max", with(vars));
        assert!(!arena(&[]));
        assert!(arena(&[("MALLOC_ARENA_MAX", "4")]));
        assert!(arena(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=8"
        )]));
        assert!(!arena(&[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")]));
        assert!(!arena(&[("MALLOC_MMAP_THRESHOLD_", "65536")]));
        assert!(!arena(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max_extra=1"
        )]));
    }
}
