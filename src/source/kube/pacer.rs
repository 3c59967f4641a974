//! The pacer that batches API changes into states (a minimum interval between published states).
//! Pure: the caller passes the time.

/// When the API source publishes a state: at once for the first change after a quiet
/// spell, otherwise once `min_interval` has passed since the last one, with every change
/// held back in between. Pure: the caller passes the time.
#[derive(Debug)]
pub(super) struct Pacer {
    pub(super) min_interval: std::time::Duration,
    pub(super) last: Option<std::time::Instant>,
    pub(super) held: bool,
}

impl Pacer {
    pub(super) fn new(min_interval: std::time::Duration) -> Self {
        Pacer {
            min_interval,
            last: None,
            held: false,
        }
    }
    /// A change is ready at `now`: whether to publish it now (and count it as published),
    /// or hold it until [`Self::held_until`].
    pub(super) fn publish_now(&mut self, now: std::time::Instant) -> bool {
        if self.last.is_some_and(|t| now < t + self.min_interval) {
            self.held = true;
            return false;
        }
        self.held = false;
        self.last = Some(now);
        true
    }
    /// When held changes fall due, if any are held.
    pub(super) fn held_until(&self) -> Option<std::time::Instant> {
        self.held
            .then(|| self.last.map(|t| t + self.min_interval))
            .flatten()
    }
    /// The held changes fell due: whether there were any (the caller publishes them).
    pub(super) fn release(&mut self) -> bool {
        std::mem::take(&mut self.held)
    }
}
