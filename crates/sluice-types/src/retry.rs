//! One retry pause for every retry loop (client and node): exponential,
//! with full jitter (each pause a random part of the current step, so
//! clients that failed together do not retry together), never past the
//! caller's deadline; and one loop for every operation that must reach
//! a group's leader (`follow_leader`).

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

/// What one try of a leader-bound operation says to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Stop with this try's result (success, or an error no retry fixes).
    Done,
    /// Try the named member at once (a leader hint).
    Follow(u32),
    /// Try again at once, wherever the caller picks next.
    Again,
    /// Try again after a jittered pause (no leader known yet, a member
    /// unreachable: an election needs time).
    Pause,
}

/// Runs `try_at` until it says `Done` or the deadline passes, and returns
/// its last result. `try_at` gets the member a leader hint named (`None`:
/// pick one by the caller's own rule: the known leader, the next member);
/// hints are followed at once, pauses grow as `Backoff::for_leader`.
pub async fn follow_leader<T, F, Fut>(deadline: Instant, mut try_at: F) -> T
where
    F: FnMut(Option<u32>) -> Fut,
    Fut: std::future::Future<Output = (T, Step)>,
{
    let mut backoff = Backoff::for_leader(deadline);
    let mut hint = None;
    loop {
        let (r, step) = try_at(hint.take()).await;
        if Instant::now() >= deadline {
            return r;
        }
        match step {
            Step::Done => return r,
            Step::Follow(l) => hint = Some(l),
            Step::Again => {}
            Step::Pause => match backoff.next_pause() {
                Some(p) => tokio::time::sleep(p).await,
                None => return r,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hints are followed at once, pauses taken, and the last result
    /// returned at the deadline.
    #[tokio::test]
    async fn follow_leader_follows_hints_pauses_and_gives_up_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        let r = follow_leader(deadline, |hint| {
            seen.push(hint);
            let n = seen.len();
            async move {
                match n {
                    1 => ("no leader", Step::Pause),
                    2 => ("not me", Step::Follow(3)),
                    3 => ("busy", Step::Again),
                    _ => ("ok", Step::Done),
                }
            }
        })
        .await;
        assert_eq!(r, "ok");
        assert_eq!(seen, vec![None, None, Some(3), None]);

        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(100);
        let mut tries = 0;
        let r = follow_leader(deadline, |_| {
            tries += 1;
            let n = tries;
            async move { (n, Step::Pause) }
        })
        .await;
        assert!(Instant::now() >= deadline && t0.elapsed() < Duration::from_secs(2));
        assert!(r > 1, "retried until the deadline, then the last result");
    }

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
