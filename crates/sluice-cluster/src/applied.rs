//! How far a member of a group had applied its log before it stopped:
//! the last entry it handed to its state machine, kept in the group's
//! directory (`applied`) across restarts. (For the metadata group only
//! the commit point matters: a restarted node has its pools and graphs
//! back at once, and the graphs run before its shards take new writes.)
//!
//! A restarted member applies its log again, from its snapshot (from the
//! start of a persistent shard's history without one). Those writes had
//! been delivered when first applied: their lambdas ran, watchers saw
//! them. Without this mark every one of them was delivered again, and
//! after a whole cluster restarted every lambda of every write since the
//! last snapshot ran a second time (its outputs written twice). With it
//! (`Sm::open`) the member applies them again without delivering them,
//! takes them as committed (they were: only committed entries are
//! applied), so it applies them at once instead of waiting for a leader to
//! tell it the commit point, and answers no stable read until it has
//! (a read would see less than it served before the restart).
//!
//! The mark is written before an entry is applied, so a member killed
//! while applying it does not deliver it after the restart (at most once,
//! as for the lambdas queued on a member that dies). Writing it is a few
//! stores into a mapped page, no system call; the page survives the
//! process being killed (after a power loss it may be older than what was
//! applied, and those writes are delivered again). Two slots taken in
//! turn, each with a check word: a process killed in the middle of writing
//! one leaves the other whole. A mark is trusted only if the log holds the
//! entry it names with the same term (by Raft's log matching, the same
//! history): a directory whose log was replaced names no mark.

use crate::types::{CommittedLeaderId, LogId};
use std::path::Path;

/// The file in a group's directory.
pub const FILE: &str = "applied";
/// One slot: sequence, index, term, check word.
const SLOT: usize = 32;
const MAGIC: u64 = 0x736c_7569_6365_6170; // "sluiceap"

/// A group's mark, mapped.
pub struct AppliedMark {
    map: memmap2::MmapMut,
    seq: u64,
}

impl std::fmt::Debug for AppliedMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppliedMark")
            .field("seq", &self.seq)
            .finish()
    }
}

fn word(b: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[i * 8..i * 8 + 8]);
    u64::from_le_bytes(w)
}

fn check(seq: u64, index: u64, term: u64) -> u64 {
    MAGIC ^ seq ^ index.rotate_left(21) ^ term.rotate_left(42)
}

impl AppliedMark {
    /// Opens (creating) the mark in `dir`; the entry it names, if a whole
    /// slot names one.
    pub fn open(dir: &Path) -> std::io::Result<(AppliedMark, Option<LogId>)> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(FILE))?;
        if f.metadata()?.len() != 2 * SLOT as u64 {
            f.set_len(2 * SLOT as u64)?;
        }
        // SAFETY: the file is this group's own (the node holds its data
        // directory's lock) and stays the mapped length.
        let map = unsafe { memmap2::MmapOptions::new().len(2 * SLOT).map_mut(&f)? };
        let best = (0..2)
            .map(|s| &map[s * SLOT..(s + 1) * SLOT])
            .map(|b| (word(b, 0), word(b, 1), word(b, 2), word(b, 3)))
            .filter(|&(seq, index, term, c)| seq != 0 && c == check(seq, index, term))
            .max_by_key(|&(seq, ..)| seq);
        let seq = best.map_or(0, |b| b.0);
        let last =
            best.map(|(_, index, term, _)| LogId::new(CommittedLeaderId::new(term, 0), index));
        Ok((AppliedMark { map, seq }, last))
    }

    /// Records `id` as the last entry handed to the state machine.
    pub fn set(&mut self, id: LogId) {
        self.seq += 1;
        let (index, term) = (id.index, id.leader_id.term);
        let mut b = [0u8; SLOT];
        for (i, w) in [self.seq, index, term, check(self.seq, index, term)]
            .into_iter()
            .enumerate()
        {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let s = (self.seq % 2) as usize;
        self.map[s * SLOT..(s + 1) * SLOT].copy_from_slice(&b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 0), index)
    }

    #[test]
    fn the_mark_reads_back_what_was_set_last() {
        let d = tempfile::tempdir().unwrap();
        let (mut m, last) = AppliedMark::open(d.path()).unwrap();
        assert_eq!(last, None, "a new mark names nothing");
        for i in 1..=5 {
            m.set(id(2, i));
        }
        drop(m);
        let (mut m, last) = AppliedMark::open(d.path()).unwrap();
        assert_eq!(last, Some(id(2, 5)));
        m.set(id(3, 6));
        drop(m);
        assert_eq!(AppliedMark::open(d.path()).unwrap().1, Some(id(3, 6)));
    }

    #[test]
    fn a_torn_slot_leaves_the_other() {
        let d = tempfile::tempdir().unwrap();
        let (mut m, _) = AppliedMark::open(d.path()).unwrap();
        m.set(id(1, 7));
        m.set(id(1, 8));
        drop(m);
        // The slot written last (seq 2: slot 0) cut in the middle.
        let path = d.path().join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..16].copy_from_slice(&99u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(AppliedMark::open(d.path()).unwrap().1, Some(id(1, 7)));
        // Both damaged: no mark.
        bytes[SLOT + 16..SLOT + 24].copy_from_slice(&5u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(AppliedMark::open(d.path()).unwrap().1, None);
    }
}
