use std::sync::atomic::{AtomicU64, Ordering};

/// A node's timestamp source: wall-clock microseconds, but strictly
/// increasing, so a timestamp never goes backwards on a node even if the
/// system clock is stepped back (it then advances by 1 µs per call until the
/// wall clock catches up).
#[derive(Debug, Default)]
pub struct Clock {
    last_us: AtomicU64,
}

impl Clock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn wall_us() -> u64 {
        sluice_types::wall_us()
    }

    /// The next timestamp: greater than every one handed out before.
    pub fn now_us(&self) -> u64 {
        let wall = Self::wall_us();
        let mut prev = self.last_us.load(Ordering::Relaxed);
        loop {
            let next = wall.max(prev + 1);
            match self.last_us.compare_exchange_weak(
                prev,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }

    /// Makes every later timestamp greater than `ts` (after recovering
    /// timestamps written by an earlier run).
    pub fn observe(&self, ts: u64) {
        self.last_us.fetch_max(ts, Ordering::AcqRel);
    }

    /// The latest timestamp handed out (0 before the first).
    pub fn last_us(&self) -> u64 {
        self.last_us.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_across_threads() {
        let c = std::sync::Arc::new(Clock::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..10_000).map(|_| c.now_us()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            let v = h.join().unwrap();
            assert!(v.windows(2).all(|w| w[0] < w[1]));
            all.extend(v);
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "timestamps are unique");
    }
}
