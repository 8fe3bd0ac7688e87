//! The marks a node records when `SLUICE_MARKS` names a directory: where a
//! replicated write's entry was when (`sluice-cluster`'s `marks` records
//! them, `sluice bench cluster --breakdown` reads them). One line per
//! mark in `<dir>/marks-<pid>.txt`: `ns point group index node`, where
//! `ns` is the wall clock in nanoseconds (one clock for every process of
//! a machine, so marks of different nodes compare).

/// The environment variable naming the directory of the marks' files.
pub const ENV: &str = "SLUICE_MARKS";

/// A point an entry passes on its way through a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Point {
    /// The leader's client write, dated from when it was asked for (its
    /// index is known once it returns).
    Propose = 0,
    /// The entry went into this node's log (leader or follower; `group`
    /// 0: the log does not know its group).
    LogAppend = 1,
    /// The leader handed an AppendEntries carrying the entry to the peer
    /// transport (`node`: the follower), before encoding it.
    Send = 2,
    /// A follower decoded an AppendEntries carrying the entry (`node`:
    /// that follower).
    Recv = 3,
    /// The follower's consensus answered that AppendEntries (`node`: that
    /// follower); the answer is encoded and sent next.
    Reply = 4,
    /// The leader's transport got the follower's answer (`node`: the
    /// follower).
    Acked = 5,
    /// The state machine applied the entry.
    Apply = 6,
    /// The leader's client write returned.
    Done = 7,
}

impl Point {
    pub const ALL: [Point; 8] = [
        Point::Propose,
        Point::LogAppend,
        Point::Send,
        Point::Recv,
        Point::Reply,
        Point::Acked,
        Point::Apply,
        Point::Done,
    ];

    /// The point a file's number stands for.
    pub fn from_u8(n: u8) -> Option<Point> {
        Point::ALL.get(n as usize).copied()
    }
}

/// One mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub ns: u64,
    pub point: Point,
    pub group: u64,
    pub index: u64,
    /// The follower for `Send`, `Recv`, `Reply` and `Acked`; 0 elsewhere.
    pub node: u64,
}

impl Mark {
    /// The mark as a file's line (without its newline).
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.ns, self.point as u8, self.group, self.index, self.node
        )
    }

    /// A file's line read back; None for anything else.
    pub fn parse(line: &str) -> Option<Mark> {
        let mut f = line.split_ascii_whitespace().map(str::parse::<u64>);
        let mut next = || f.next()?.ok();
        Some(Mark {
            ns: next()?,
            point: Point::from_u8(u8::try_from(next()?).ok()?)?,
            group: next()?,
            index: next()?,
            node: next()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_back_as_the_mark_it_was_written_from() {
        let m = Mark {
            ns: 1_790_000_000_123_456_789,
            point: Point::Acked,
            group: 7,
            index: 42,
            node: 2,
        };
        assert_eq!(Mark::parse(&m.line()), Some(m));
        assert_eq!(Mark::parse("1 99 0 0 0"), None, "no such point");
        assert_eq!(Mark::parse("1 2 3"), None, "a short line");
        assert_eq!(Mark::parse("x 1 0 0 0"), None);
        for p in Point::ALL {
            assert_eq!(Point::from_u8(p as u8), Some(p));
        }
    }
}
