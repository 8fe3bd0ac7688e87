//! The append-only segment log behind persistent pools (the history of a
//! persistent shard, standalone or replicated), and the data-directory
//! lock every node takes.
//!
//! A log is a directory of segment files `seg-<id:016x>.log`. Each starts
//! with a header (magic, format version, segment id, CRC32C) and holds
//! records:
//!
//! ```text
//! len u32 | crc32c(body) u32 | body
//! body = kind u8 (1 put, 2 remove) | version u64 | timestamp_us u64
//!      | prev_version_by_key u64 | key_len u16 | key | value
//! ```
//!
//! `prev_version_by_key` is the backpointer along a key's version chain.
//! Opening a log scans every segment and rebuilds what it holds: a torn
//! record at the very end of the newest segment (an append that never
//! finished: see [`is_torn_tail`]) is cut, its bytes kept beside the
//! segment; anything else that fails its checksum, a damaged last record
//! included, is reported with the file and offset and the log refuses to
//! open, never skipping data.
//!
//! All file access goes through the [`Fs`] trait so tests can inject short
//! writes, fsync failures and ENOSPC.
//!
//! Architecture invariants: no threads, no network; an append is
//! acknowledged (returns Ok) only after the sync policy is satisfied; a
//! failed write leaves the log as it was before that append (the partial
//! bytes are truncated before the next append).

mod fs;
mod lock;
mod log;
mod record;
pub mod versioned;

pub use fs::{transient, FaultFs, Faults, Fs, RealFs, SegmentFile};
pub use lock::{lock_holder, DirLock, LockError, LOCK_FILE};
pub use log::{
    scan_segment, segment_files, Compacted, Location, Log, LogError, LogOptions, Problem,
    Recovered, Scan, SyncPolicy,
};
pub use record::{is_torn_tail, Record, RecordKind, ValueRef, TORN_WRITE_ALIGN};
pub use versioned::{Changes, Entry, History, HistoryError, Range, Resolver};
