//! Helpers shared by the CLI's process tests.

use std::net::{SocketAddr, TcpListener};

/// A base port with `n` free consecutive ports after it on 127.0.0.1
/// (bound then released; the nodes bind them next). Each call draws
/// another candidate, so tests running together do not pick the same.
pub fn free_base(n: u16) -> u16 {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut seed = (std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15)
        .wrapping_add(call.wrapping_mul(0x2545_f491_4f6c_dd1d));
    for _ in 0..200 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let base = 20_000 + (seed >> 33) as u16 % 30_000;
        if (0..n).all(|i| TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], base + i))).is_ok()) {
            return base;
        }
    }
    panic!("no {n} free consecutive ports");
}
