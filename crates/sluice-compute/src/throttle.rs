//! Warnings that repeat at the rate of the data path (a lambda failing on
//! every object, a full upcall queue under overload) are let through a few
//! times and then at most once per interval, each saying how many were
//! held back since the last: a lambda that raised on every trigger put
//! wrote a 1.2 KB warning (its traceback included) per object, 12 MB a
//! second at 10,000 failures a second, into a log that `sluice dev` keeps
//! in a file. Nothing is lost to the counters: `sluice dfg ls` and the
//! metrics count every failure and refusal, with the last error.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Lines let through at once (and again after a quiet spell).
pub const BURST: f64 = 5.0;
/// Past the burst, one line per this long.
pub const EVERY: Duration = Duration::from_secs(10);

/// A token bucket for one kind of warning (`BURST` tokens, one more per
/// `EVERY`).
pub struct LogThrottle {
    state: Mutex<State>,
}

struct State {
    tokens: f64,
    at: Instant,
    held: u64,
}

impl Default for LogThrottle {
    fn default() -> Self {
        LogThrottle {
            state: Mutex::new(State {
                tokens: BURST,
                at: Instant::now(),
                held: 0,
            }),
        }
    }
}

impl LogThrottle {
    /// `Some(n)`: log this one, saying that `n` were held back since the
    /// last one logged; `None`: hold it back.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        let refill = now.saturating_duration_since(s.at).as_secs_f64() / EVERY.as_secs_f64();
        s.tokens = (s.tokens + refill).min(BURST);
        s.at = now;
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            Some(std::mem::take(&mut s.held))
        } else {
            s.held += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_line_per_interval_counting_what_was_held() {
        let t = LogThrottle::default();
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert_eq!(t.admit_at(t0), Some(0));
        }
        for _ in 0..1000 {
            assert_eq!(t.admit_at(t0), None);
        }
        // Half an interval: still held back.
        assert_eq!(t.admit_at(t0 + EVERY / 2), None);
        // A full interval after the burst: one line, counting the 1001.
        assert_eq!(t.admit_at(t0 + EVERY), Some(1001));
        assert_eq!(t.admit_at(t0 + EVERY), None);
        // A long quiet spell gives the whole burst back, no more.
        let later = t0 + EVERY * 100;
        assert_eq!(t.admit_at(later), Some(1));
        for _ in 1..BURST as usize {
            assert_eq!(t.admit_at(later), Some(0));
        }
        assert_eq!(t.admit_at(later), None);
    }
}
