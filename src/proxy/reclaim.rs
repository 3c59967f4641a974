//! [`drop_in_background`]: frees what a sync replaced on a thread of its own, after the
//! sync. A state at 45k service ports takes ~6 ms to free (two maps of 45k keys, a
//! reference count per service port, name and endpoint list, scattered over the heap):
//! as much as the rest of a one-endpoint change, kernel commit included (issue #18). The
//! rules are in the kernel before it starts either way; this keeps the sync loop from
//! waiting for it.

use std::sync::mpsc::{channel, Sender};
use std::sync::OnceLock;

type Garbage = Box<dyn Send>;

/// Drops `value` on the reclaimer thread (started on first use), or here when that thread
/// cannot be started.
pub fn drop_in_background<T: Send + 'static>(value: T) {
    static RECLAIMER: OnceLock<Option<Sender<Garbage>>> = OnceLock::new();
    let tx = RECLAIMER.get_or_init(|| {
        let (tx, rx) = channel::<Garbage>();
        std::thread::Builder::new()
            .name("reclaim".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    match tx {
        // A send fails only when the thread has gone: the value comes back and drops here.
        Some(tx) => drop(tx.send(Box::new(value))),
        None => drop(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Noted(Arc<Mutex<Vec<std::thread::ThreadId>>>);
    impl Drop for Noted {
        fn drop(&mut self) {
            self.0.lock().unwrap().push(std::thread::current().id());
        }
    }

    #[test]
    fn a_value_is_dropped_once_on_another_thread() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        drop_in_background(Noted(seen.clone()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never dropped");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_ne!(seen[0], std::thread::current().id());
    }
}
