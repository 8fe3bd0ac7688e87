//! raft-rs's `Storage` over a group's `LogStore`. raft-rs sees each
//! entry's term and index and a one-byte marker for its data
//! (`DATA_COMMAND`); the command itself stays in our log, with its values
//! by reference, and travels beside raft-rs's messages (`Outgoing`).

use super::{conf_change_data, Members, DATA_COMMAND};
use crate::log::{Head, Kind, LogStore};
use crate::types::Entry;
use crate::types::EntryPayload;
use raft::eraftpb::{self, HardState};
use raft::{GetEntriesContext, RaftState, StorageError};

/// A group's log as raft-rs reads it.
pub(super) struct RaftLog {
    pub(super) log: LogStore,
    /// The configuration as of the state machine's applied index when the
    /// group started (changes after it are in the log, applied again).
    pub(super) members: super::Members,
    /// The state machine: its saved snapshot is what a member too far
    /// behind is sent.
    pub(super) sm: crate::sm::Sm,
    /// A member was not sent the saved snapshot because it predates the
    /// member's joining (raft-rs ignores a snapshot whose configuration
    /// does not hold it): the driver builds a new one.
    pub(super) snapshot_wanted: std::sync::atomic::AtomicBool,
}

fn other(e: impl std::fmt::Display) -> raft::Error {
    raft::Error::Store(StorageError::Other(e.to_string().into()))
}

/// raft-rs's view of one of our entries.
pub(super) fn to_raft(e: &Entry) -> raft::Result<eraftpb::Entry> {
    let mut entry = head_to_raft(e.log_id, Kind::of(e));
    if let EntryPayload::Membership(m) = &e.payload {
        entry.set_entry_type(eraftpb::EntryType::EntryConfChangeV2);
        entry.data = conf_change_data(&Members::of_membership(m));
    }
    Ok(entry)
}

/// raft-rs's entry for a data entry or a blank, from its head (a
/// membership entry also needs its payload: `to_raft`).
fn head_to_raft(id: crate::types::LogId, kind: Kind) -> eraftpb::Entry {
    eraftpb::Entry {
        term: id.leader_id.term,
        index: id.index,
        data: match kind {
            Kind::Normal => vec![DATA_COMMAND],
            Kind::Blank | Kind::Membership => Vec::new(),
        },
        ..Default::default()
    }
}

impl raft::Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let (term, vote) = self.log.hard_state();
        // Entries a snapshot covers are committed (a synced log records
        // its commit point only at each segment's head, and purging drops
        // those segments). A commit point past the log's end (its tail
        // lost) is taken back to it: the leader sends the entries again.
        let b = self.log.bounds();
        let saved = self.log.commit_index();
        let commit = saved.clamp(b.first - 1, b.last);
        if saved > b.last {
            tracing::warn!(
                saved,
                last = b.last,
                "the log ends before its saved commit point; the leader sends the rest"
            );
        }
        let hard_state = HardState { term, vote, commit };
        Ok(RaftState::new(hard_state, self.members.conf_state()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<eraftpb::Entry>> {
        let b = self.log.bounds();
        if low < b.first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > b.last + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        // Heads only: raft-rs's entries carry no values (the driver finds
        // the commands where it needs them).
        let heads = self.log.heads_in(low, high, max).map_err(other)?;
        if heads.is_empty() && low < high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let id = |h: &Head| match h {
            Head::Id(id, _) => *id,
            Head::Whole(e) => e.log_id,
        };
        // raft-rs relies on entries that follow each other.
        if let Some((i, h)) = (low..).zip(&heads).find(|(i, h)| id(h).index != *i) {
            return Err(other(format!(
                "the log gave entry {} where {i} was asked",
                id(h).index
            )));
        }
        heads
            .iter()
            .map(|h| match h {
                Head::Whole(e) => to_raft(e),
                Head::Id(id, kind) => Ok(head_to_raft(*id, *kind)),
            })
            .collect()
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == 0 {
            return Ok(0);
        }
        match self.log.log_id_at(idx) {
            Some(id) => Ok(id.leader_id.term),
            None if idx < self.log.bounds().first => {
                Err(raft::Error::Store(StorageError::Compacted))
            }
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.log.bounds().first)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.log.bounds().last)
    }

    /// The state machine's saved snapshot (the log is purged only up to
    /// one, so it covers what the member is missing); "temporarily
    /// unavailable" until one covers `request_index` (raft-rs asks again).
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<eraftpb::Snapshot> {
        let unavailable = || raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable);
        let snap = self.sm.current_snapshot().map_err(other)?;
        let Some((id, s)) = snap.and_then(|s| s.meta.last_log_id.map(|id| (id, s))) else {
            return Err(unavailable());
        };
        if id.index < request_index {
            return Err(unavailable());
        }
        // The configuration as of the snapshot (a snapshot from before any
        // change: the one the group started with).
        let members = s.meta.last_membership.log_id().map_or_else(
            || self.members.clone(),
            |_| Members::of_membership(s.meta.last_membership.membership()),
        );
        if super::node_of(to).is_some_and(|n| !members.contains(n)) {
            self.snapshot_wanted
                .store(true, std::sync::atomic::Ordering::Relaxed);
            return Err(unavailable());
        }
        // A full resync, as Redis logs one: worth an operator's notice.
        tracing::info!(
            to = ?super::node_of(to),
            snapshot_index = id.index,
            bytes = s.data.len(),
            "sending a follower the whole state: it is behind the start of this leader's log"
        );
        Ok(eraftpb::Snapshot {
            data: s.data,
            metadata: Some(eraftpb::SnapshotMetadata {
                conf_state: Some(members.conf_state()),
                index: id.index,
                term: id.leader_id.term,
            }),
        })
    }
}
