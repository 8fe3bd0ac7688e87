//! Token buckets for rate limits: one per (rate policy, principal) on a
//! node, refilled continuously, holding at most one second's worth.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// What a request costs and what the bucket answers.
#[derive(Debug, PartialEq)]
pub enum Take {
    /// Run now.
    Now,
    /// Run after this delay (within the policy's bound; already paid).
    After(Duration),
    /// Over the limit by more than the bound: refuse (nothing paid).
    Refuse { retry_after: Duration },
}

#[derive(Debug)]
pub struct Bucket {
    ops_per_s: Option<f64>,
    bytes_per_s: Option<f64>,
    max_delay: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    ops: f64,
    bytes: f64,
    at: Instant,
}

impl Bucket {
    pub fn new(ops_per_s: Option<u64>, bytes_per_s: Option<u64>, max_delay: Duration) -> Bucket {
        let (ops, bytes) = (ops_per_s.map(|r| r as f64), bytes_per_s.map(|r| r as f64));
        Bucket {
            ops_per_s: ops,
            bytes_per_s: bytes,
            max_delay,
            state: Mutex::new(State {
                ops: ops.unwrap_or(0.0),
                bytes: bytes.unwrap_or(0.0),
                at: Instant::now(),
            }),
        }
    }

    /// Takes one operation and `bytes` value bytes at `now`. A request
    /// larger than a whole second's worth runs when the bucket is full and
    /// leaves it in debt, so it is never refused for ever.
    pub fn take(&self, bytes: u64, now: Instant) -> Take {
        let mut s = self.state.lock();
        let dt = now.saturating_duration_since(s.at).as_secs_f64();
        s.at = s.at.max(now);
        // Seconds until `level` covers `cost` (`cost` capped at a full bucket).
        let wait = |level: &mut f64, rate: Option<f64>, cost: f64| -> f64 {
            let Some(r) = rate else { return 0.0 };
            *level = (*level + r * dt).min(r);
            (cost.min(r) - *level).max(0.0) / r
        };
        let w_ops = wait(&mut s.ops, self.ops_per_s, 1.0);
        let w_bytes = wait(&mut s.bytes, self.bytes_per_s, bytes as f64);
        let w = w_ops.max(w_bytes);
        let waited = Duration::from_secs_f64(w);
        if waited > self.max_delay {
            return Take::Refuse {
                retry_after: waited - self.max_delay,
            };
        }
        if self.ops_per_s.is_some() {
            s.ops -= 1.0;
        }
        if self.bytes_per_s.is_some() {
            s.bytes -= bytes as f64;
        }
        if waited.is_zero() {
            Take::Now
        } else {
            Take::After(waited)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_admits_its_rate_and_then_delays_then_refuses() {
        let b = Bucket::new(Some(100), None, Duration::from_millis(50));
        let t0 = Instant::now();
        // A full bucket: one second's worth at once.
        for _ in 0..100 {
            assert_eq!(b.take(0, t0), Take::Now);
        }
        // The next ones wait 10 ms apiece, up to the 50 ms bound.
        for i in 1..=5u64 {
            match b.take(0, t0) {
                Take::After(d) => assert!(
                    (d.as_secs_f64() - i as f64 * 0.01).abs() < 1e-6,
                    "{i}: {d:?}"
                ),
                other => panic!("{i}: {other:?}"),
            }
        }
        match b.take(0, t0) {
            Take::Refuse { retry_after } => assert!(retry_after <= Duration::from_millis(11)),
            other => panic!("{other:?}"),
        }
        // A second later the debt is paid and the bucket full again.
        let t1 = t0 + Duration::from_secs(2);
        for _ in 0..100 {
            assert_eq!(b.take(0, t1), Take::Now);
        }
        assert!(matches!(b.take(0, t1), Take::After(_)));
    }

    #[test]
    fn over_time_the_rate_is_what_the_policy_says() {
        // 1000 ops/s without delays: count what is admitted in 3 s of
        // simulated time, asking every 100 µs.
        let b = Bucket::new(Some(1000), None, Duration::ZERO);
        let t0 = Instant::now();
        let mut admitted = 0;
        for i in 0..30_000u64 {
            if b.take(0, t0 + Duration::from_micros(i * 100)) == Take::Now {
                admitted += 1;
            }
        }
        // The first second's burst (1000) plus 1000/s for the 3 s.
        assert!((3900..=4001).contains(&admitted), "{admitted}");
    }

    #[test]
    fn bytes_limit_and_large_requests() {
        let b = Bucket::new(None, Some(1000), Duration::ZERO);
        let t0 = Instant::now();
        // Bigger than a second's worth: runs on a full bucket...
        assert_eq!(b.take(5000, t0), Take::Now);
        // ...and leaves a debt of 4 s before anything else runs.
        match b.take(1, t0) {
            Take::Refuse { retry_after } => {
                assert!(
                    (retry_after.as_secs_f64() - 4.001).abs() < 1e-3,
                    "{retry_after:?}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(b.take(1, t0 + Duration::from_millis(4002)), Take::Now);
    }
}
