//! File descriptors: the node's own, kept apart from its clients'.
//!
//! Every client connection is a descriptor, and so is each of the node's
//! own files and sockets: log segments, snapshots, connections to peers,
//! lambda workers. A process at its descriptor limit cannot start a log
//! segment or reach a peer, so clients alone must never be able to take
//! them all. At start a node raises its soft limit (`ulimit -n`) to the
//! hard one, as Go's runtime and Redis do (a systemd service starts at a
//! soft 1,024), and accepts at most `limits.max_connections` clients or
//! the limit less a reserve for itself, whichever is fewer, with a warning
//! when that is fewer (Redis lowers `maxclients` the same way).

use std::sync::OnceLock;

/// Descriptors kept for the node's own use: its logs (a few per Raft
/// group), peers (two connections each way per peer), lambda workers,
/// snapshots being written and sent; more in a cluster whose peers'
/// connections need more (`reserve`). Taken from small limits at most
/// half.
pub const RESERVED: u64 = 256;

/// What a node keeps when it takes `peer_slots` connections from peers
/// past its clients' limit: `RESERVED`, or more where the peers' share
/// of it (64) is too little.
pub fn reserve(peer_slots: usize) -> u64 {
    RESERVED + (peer_slots as u64).saturating_sub(64)
}

/// The process's descriptor limit, after raising it once (the first call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit in force now.
    pub soft: u64,
    /// The hard limit (how far the soft one may be raised without
    /// privileges).
    pub hard: u64,
    /// The soft limit the process started with, when it was raised.
    pub raised_from: Option<u64>,
}

/// Raises the soft descriptor limit to the hard one (once per process)
/// and says where it stands. `None` where the limit cannot be read.
pub fn limit() -> Option<FdLimit> {
    static LIMIT: OnceLock<Option<FdLimit>> = OnceLock::new();
    *LIMIT.get_or_init(raise)
}

fn raise() -> Option<FdLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    let start = r.rlim_cur;
    let hard = r.rlim_max;
    if start >= hard {
        return Some(FdLimit {
            soft: start,
            hard,
            raised_from: None,
        });
    }
    // An unlimited hard limit is more than the kernel lets one process
    // have (`fs.nr_open`): ask for that many instead.
    let mut want = hard;
    if r.rlim_max == libc::RLIM_INFINITY {
        want = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20);
    }
    let new = libc::rlimit {
        rlim_cur: want,
        rlim_max: r.rlim_max,
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        return Some(FdLimit {
            soft: start,
            hard,
            raised_from: None,
        });
    }
    Some(FdLimit {
        soft: want,
        hard,
        raised_from: Some(start),
    })
}

/// The client connections a node with this limit accepts when
/// `max_connections` asks for that many: the limit less the reserve (at
/// most half of a small limit), at least one.
pub fn client_connections(max_connections: u32, soft: u64, reserve: u64) -> u32 {
    let reserve = reserve.min(soft / 2);
    let room = soft.saturating_sub(reserve).max(1);
    (max_connections as u64).min(room) as u32
}

/// Raises the limit and caps `max_connections` to what it leaves for
/// clients, saying so when either changes something.
pub fn cap_connections(max_connections: u32, reserve: u64) -> u32 {
    let Some(l) = limit() else {
        return max_connections;
    };
    if let Some(from) = l.raised_from {
        tracing::info!(
            from,
            to = l.soft,
            "raised the open file limit (ulimit -n) to the hard limit"
        );
    }
    let n = client_connections(max_connections, l.soft, reserve);
    if n < max_connections {
        tracing::warn!(
            "limits.max_connections = {max_connections}, but this process may open only {} files (ulimit -n; hard limit {}), and the node keeps {} of them for its logs, peers and lambda workers: accepting at most {n} client connections. Raise the limit (`ulimit -n`, or LimitNOFILE= in a systemd unit) to {} for all of them",
            l.soft,
            l.hard,
            l.soft - n as u64,
            max_connections as u64 + reserve,
        );
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_get_what_the_limit_leaves_after_the_reserve() {
        // Plenty: the configured number.
        let r = reserve(64);
        assert_eq!(r, RESERVED);
        assert_eq!(client_connections(1024, 1 << 20, r), 1024);
        assert_eq!(client_connections(1024, 1024 + RESERVED, r), 1024);
        // A systemd service's soft 1,024 that could not be raised.
        assert_eq!(client_connections(1024, 1024, r), 1024 - RESERVED as u32);
        // A small limit: half of it for the node.
        assert_eq!(client_connections(1024, 100, r), 50);
        assert_eq!(client_connections(10, 100, r), 10);
        assert_eq!(client_connections(1024, 1, r), 1);
        // A cluster of 100 nodes: room for 4 connections from each peer.
        let big = reserve(4 * 99);
        assert_eq!(big, RESERVED + 4 * 99 - 64);
        assert_eq!(client_connections(4096, 4096, big), 4096 - big as u32);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let l = limit().expect("getrlimit works on Linux");
        if l.hard != libc::RLIM_INFINITY {
            assert_eq!(l.soft, l.hard);
        }
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        assert_eq!(r.rlim_cur, l.soft);
    }
}
