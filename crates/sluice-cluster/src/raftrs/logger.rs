//! raft-rs logs through `slog`; this drain hands its records to
//! `tracing` (target `raft`), with their key-value pairs as text, so a
//! node's consensus log lines go where all its others go.

use slog::{Drain, Key, OwnedKVList, Record, Serializer, KV};
use std::fmt::Write as _;

/// A logger for one group's `RawNode`.
pub(super) fn for_group(group: u64) -> slog::Logger {
    slog::Logger::root(ToTracing.fuse(), slog::o!("group" => group))
}

struct ToTracing;

/// `key=value` pairs, space separated.
struct Pairs(String);

impl Serializer for Pairs {
    fn emit_arguments(&mut self, key: Key, val: &std::fmt::Arguments) -> slog::Result {
        let sep = if self.0.is_empty() { "" } else { " " };
        let _ = write!(self.0, "{sep}{key}={val}");
        Ok(())
    }
}

impl Drain for ToTracing {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record, values: &OwnedKVList) -> Result<(), slog::Never> {
        // Formatting costs: only for levels tracing would keep.
        let enabled = match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::enabled!(target: "raft", tracing::Level::ERROR)
            }
            slog::Level::Warning => tracing::enabled!(target: "raft", tracing::Level::WARN),
            slog::Level::Info => tracing::enabled!(target: "raft", tracing::Level::INFO),
            slog::Level::Debug => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            slog::Level::Trace => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut kv = Pairs(String::new());
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let (msg, kv) = (record.msg(), kv.0);
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{msg} {kv}")
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{msg} {kv}"),
            slog::Level::Info => tracing::info!(target: "raft", "{msg} {kv}"),
            slog::Level::Debug => tracing::debug!(target: "raft", "{msg} {kv}"),
            slog::Level::Trace => tracing::trace!(target: "raft", "{msg} {kv}"),
        }
        Ok(())
    }
}
