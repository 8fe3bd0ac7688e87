//! One retry pause for every retry loop (client and node): exponential,
//! with full jitter (each pause a random part of the current step, so
//! clients that failed together do not retry together), never past the
//! caller's deadline.

use std::time::{Duration, Instant};

/// The pauses between the attempts of one operation.
#[derive(Debug)]
pub struct Backoff {
    step: Duration,
    max: Duration,
    deadline: Instant,
    rng: u64,
}

impl Backoff {
    /// Pauses starting at about `first`, doubling up to `max`, none ending
    /// past `deadline`.
    pub fn new(first: Duration, max: Duration, deadline: Instant) -> Backoff {
        Backoff {
            step: first.max(Duration::from_micros(1)),
            max: max.max(first),
            deadline,
            rng: crate::random_u64() | 1,
        }
    }

    /// The default for waiting out an election or a leader change:
    /// 10 ms doubling to 200 ms.
    pub fn for_leader(deadline: Instant) -> Backoff {
        Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
            deadline,
        )
    }

    /// The next pause, or `None` when the deadline has passed (give up).
    pub fn next_pause(&mut self) -> Option<Duration> {
        let left = self.deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        // xorshift64: plenty for spreading retries.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let step = self.step.as_nanos() as u64;
        // Full jitter over the upper half of the step: never a zero pause.
        let pause = Duration::from_nanos(step / 2 + self.rng % (step / 2 + 1));
        self.step = (self.step * 2).min(self.max);
        Some(pause.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_are_jittered_and_stop_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_secs(3600);
        let mut b = Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(80),
            deadline,
        );
        let pauses: Vec<Duration> = (0..6).map(|_| b.next_pause().unwrap()).collect();
        for (p, step) in pauses.iter().zip([10u64, 20, 40, 80, 80, 80]) {
            let step = Duration::from_millis(step);
            assert!(
                *p >= step / 2 && *p <= step,
                "{p:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        // Two clients that failed together do not wait alike.
        let mut a = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), deadline);
        let mut c = Backoff::new(Duration::from_millis(100), Duration::from_secs(1), deadline);
        let same = (0..8).filter(|_| a.next_pause() == c.next_pause()).count();
        assert!(same < 8, "jitter");
        // Past the deadline: no more attempts; near it: a short pause.
        let mut d = Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
            Instant::now(),
        );
        assert_eq!(d.next_pause(), None);
        let mut e = Backoff::new(
            Duration::from_secs(10),
            Duration::from_secs(10),
            Instant::now() + Duration::from_millis(50),
        );
        assert!(e.next_pause().unwrap() <= Duration::from_millis(50));
    }
}
