//! A versioned key/value history over the log: every version of every key
//! on disk, the latest value of each key in memory, and the indexes that
//! answer reads by version and by time (issue #6 groundwork; not yet
//! behind a pool type).
//!
//! Indexes, rebuilt from the log on open:
//! - per key, its version chain (oldest first) with each version's
//!   timestamp, location and backpointer;
//! - time lookups use the same chains: within a key, versions and
//!   timestamps grow together, so one binary search answers both.

use crate::fs::Fs;
use crate::log::{Location, Log, LogError, LogOptions, Recovered};
use crate::record::{Record, RecordKind, ValueRef};
use bytes::Bytes;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One version of a key, as the index knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub version: u64,
    pub timestamp_us: u64,
    pub prev_version_by_key: u64,
    pub tombstone: bool,
    pub loc: Location,
    /// For a value held by reference: the segment of the other log that
    /// holds it.
    pub value_segment: Option<u64>,
}

/// What `History::changes` found.
pub struct Changes {
    /// (key, version) in range, oldest first.
    pub versions: Vec<(String, Entry)>,
    /// (key, newest version no longer held) for keys whose older
    /// versions in range were compacted away.
    pub gone: Vec<(String, u64)>,
}

/// Bounds of a history read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// Versions `from..=to`.
    Versions { from: u64, to: u64 },
    /// Timestamps `from..=to` (µs).
    Times { from: u64, to: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("version {version} is not above the last version {last}: versions must increase")]
    VersionOrder { version: u64, last: u64 },
    #[error("timestamp {timestamp_us} is below the last timestamp {last}: timestamps must not go backwards")]
    TimeOrder { timestamp_us: u64, last: u64 },
    #[error("reading the value of {key} version {version} from {at:?}: {reason}")]
    External {
        key: String,
        version: u64,
        at: Option<ValueRef>,
        reason: String,
    },
}

/// Reads a value that lives outside the history (`RecordKind::PutRef`).
pub type Resolver = Arc<dyn Fn(&ValueRef) -> std::io::Result<Bytes> + Send + Sync>;

pub struct History {
    log: Log,
    chains: HashMap<String, Vec<Entry>>,
    /// Latest live value of each key.
    latest: HashMap<String, Bytes>,
    last_version: u64,
    last_timestamp_us: u64,
    /// Bumped by `truncate_after`: a compaction planned before a cut must
    /// not install its result after it.
    epoch: u64,
    /// Reads values of `PutRef` records.
    resolver: Option<Resolver>,
}

impl History {
    pub fn open(
        dir: &Path,
        fs: Arc<dyn Fs>,
        opts: LogOptions,
    ) -> Result<(History, Recovered), HistoryError> {
        let (log, mut rec) = Log::open(dir, fs, opts)?;
        let mut h = History {
            log,
            chains: HashMap::new(),
            latest: HashMap::new(),
            last_version: 0,
            last_timestamp_us: 0,
            epoch: 0,
            resolver: None,
        };
        for (loc, r) in std::mem::take(&mut rec.records) {
            h.index(loc, r, None);
        }
        Ok((h, rec))
    }

    /// Indexes a record; `value` is a `PutRef`'s value when the caller has
    /// it (else the newest value of that key is read when asked for).
    fn index(&mut self, loc: Location, r: Record, value: Option<Bytes>) {
        let tombstone = r.kind == RecordKind::Remove;
        let e = Entry {
            version: r.version,
            timestamp_us: r.timestamp_us,
            prev_version_by_key: r.prev_version_by_key,
            tombstone,
            loc,
            value_segment: match r.kind {
                RecordKind::PutRef => ValueRef::decode(&r.value).map(|a| a.segment),
                _ => None,
            },
        };
        // The key is cloned only the first time it is seen.
        match self.chains.get_mut(&r.key) {
            Some(c) => c.push(e),
            None => {
                self.chains.insert(r.key.clone(), vec![e]);
            }
        }
        match (r.kind, value) {
            (RecordKind::Put, _) => {
                self.latest.insert(r.key, r.value);
            }
            (RecordKind::PutRef, Some(v)) => {
                self.latest.insert(r.key, v);
            }
            _ => {
                self.latest.remove(&r.key);
            }
        }
        self.last_version = self.last_version.max(r.version);
        self.last_timestamp_us = self.last_timestamp_us.max(r.timestamp_us);
    }

    /// Every key with at least one version (tombstoned ones included).
    pub fn keys(&self) -> Vec<String> {
        self.chains.keys().cloned().collect()
    }

    pub fn last_version(&self) -> u64 {
        self.last_version
    }

    pub fn last_timestamp_us(&self) -> u64 {
        self.last_timestamp_us
    }

    /// Writes a version (a put, or a remove when `value` is None). The
    /// caller assigns versions and timestamps; both must move forward.
    pub fn write(
        &mut self,
        key: &str,
        version: u64,
        timestamp_us: u64,
        value: Option<Bytes>,
    ) -> Result<Entry, HistoryError> {
        self.write_record(key, version, timestamp_us, value, None)
    }

    /// Writes a put whose value stays where `at` says (another log, read
    /// back through the resolver): only the reference is written here.
    /// `value` is kept in memory as the key's latest value.
    pub fn write_ref(
        &mut self,
        key: &str,
        version: u64,
        timestamp_us: u64,
        at: ValueRef,
        value: Bytes,
    ) -> Result<Entry, HistoryError> {
        self.write_record(key, version, timestamp_us, Some(value), Some(at))
    }

    /// The lowest segment of the other log that a version still held
    /// refers to (`None`: no version refers to one): segments below it can
    /// go.
    pub fn min_value_segment(&self) -> Option<u64> {
        self.chains
            .values()
            .flat_map(|c| c.iter())
            .filter_map(|e| e.value_segment)
            .min()
    }

    /// How many versions held refer to each segment of the other log
    /// below `segment` (from memory: no record is read).
    pub fn value_ref_counts_below(&self, segment: u64) -> std::collections::BTreeMap<u64, usize> {
        let mut out = std::collections::BTreeMap::new();
        for e in self.chains.values().flatten() {
            if let Some(s) = e.value_segment.filter(|s| *s < segment) {
                *out.entry(s).or_insert(0) += 1;
            }
        }
        out
    }

    /// Where the values of the versions held that refer to one of
    /// `segments` of the other log lie there (each such record read):
    /// what of those segments must stay readable.
    pub fn value_refs_in(
        &self,
        segments: &std::collections::BTreeSet<u64>,
    ) -> Result<Vec<ValueRef>, HistoryError> {
        let mut out = Vec::new();
        for e in self.chains.values().flatten() {
            if e.value_segment.is_some_and(|s| segments.contains(&s)) {
                let r = self.log.read(e.loc)?;
                if let Some(at) = ValueRef::decode(&r.value) {
                    out.push(at);
                }
            }
        }
        Ok(out)
    }

    /// Sets how `PutRef` values are read.
    pub fn set_resolver(&mut self, r: Resolver) {
        self.resolver = Some(r);
    }

    fn write_record(
        &mut self,
        key: &str,
        version: u64,
        timestamp_us: u64,
        value: Option<Bytes>,
        at: Option<ValueRef>,
    ) -> Result<Entry, HistoryError> {
        if version <= self.last_version && self.last_version != 0 {
            return Err(HistoryError::VersionOrder {
                version,
                last: self.last_version,
            });
        }
        if timestamp_us < self.last_timestamp_us {
            return Err(HistoryError::TimeOrder {
                timestamp_us,
                last: self.last_timestamp_us,
            });
        }
        let prev = self
            .chains
            .get(key)
            .and_then(|c| c.last())
            .map_or(u64::MAX, |e| e.version);
        let (kind, stored, held) = match (at, value) {
            (Some(at), Some(v)) => (RecordKind::PutRef, at.encode(), Some(v)),
            (_, Some(v)) => (RecordKind::Put, v, None),
            (_, None) => (RecordKind::Remove, Bytes::new(), None),
        };
        let r = Record {
            kind,
            version,
            timestamp_us,
            prev_version_by_key: prev,
            key: key.to_string(),
            value: stored,
        };
        let loc = self.log.append(std::slice::from_ref(&r))?[0];
        self.index(loc, r, held);
        Ok(*self.chains[key].last().expect("just indexed"))
    }

    fn value_of(&self, key: &str, e: &Entry) -> Result<Bytes, HistoryError> {
        if e.tombstone {
            return Ok(Bytes::new());
        }
        let chain = &self.chains[key];
        if chain.last().map(|l| l.version) == Some(e.version) {
            if let Some(v) = self.latest.get(key) {
                return Ok(v.clone());
            }
        }
        let r = self.log.read(e.loc)?;
        self.resolve(r)
    }

    /// A record's value: its own, or (`PutRef`) read where it points.
    fn resolve(&self, r: Record) -> Result<Bytes, HistoryError> {
        if r.kind != RecordKind::PutRef {
            return Ok(r.value);
        }
        let err = |at, reason: String| HistoryError::External {
            key: r.key.clone(),
            version: r.version,
            at,
            reason,
        };
        let at = ValueRef::decode(&r.value)
            .ok_or_else(|| err(None, "the record's reference is malformed".into()))?;
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| err(Some(at), "no resolver is set".into()))?;
        let v = resolver(&at).map_err(|e| err(Some(at), e.to_string()))?;
        if v.len() != at.len as usize {
            return Err(err(Some(at), format!("read {} bytes", v.len())));
        }
        Ok(v)
    }

    /// The latest version (`None`) or a given one; tombstones included
    /// (callers report them as not found).
    pub fn get(
        &self,
        key: &str,
        version: Option<u64>,
    ) -> Result<Option<(Entry, Bytes)>, HistoryError> {
        let Some(chain) = self.chains.get(key) else {
            return Ok(None);
        };
        let e = match version {
            None => chain.last(),
            Some(v) => chain
                .binary_search_by_key(&v, |e| e.version)
                .ok()
                .map(|i| &chain[i]),
        };
        match e {
            Some(e) => Ok(Some((*e, self.value_of(key, e)?))),
            None => Ok(None),
        }
    }

    /// The versions of `key` newer than `version` and the bytes they and
    /// `version` hold on disk (what a byte budget counts).
    pub fn newer_with_bytes(&self, key: &str, version: u64) -> Option<(usize, u64)> {
        let chain = self.chains.get(key)?;
        let i = chain.binary_search_by_key(&version, |e| e.version).ok()?;
        let bytes = chain[i..].iter().map(|e| u64::from(e.loc.len)).sum();
        Some((chain.len() - 1 - i, bytes))
    }

    /// The oldest version of `key` held here.
    pub fn oldest(&self, key: &str) -> Option<Entry> {
        self.chains.get(key).and_then(|c| c.first().copied())
    }

    /// The version of `key` current at `timestamp_us`: the newest version
    /// written at or before it.
    pub fn get_by_time(
        &self,
        key: &str,
        timestamp_us: u64,
    ) -> Result<Option<(Entry, Bytes)>, HistoryError> {
        let Some(chain) = self.chains.get(key) else {
            return Ok(None);
        };
        let n = chain.partition_point(|e| e.timestamp_us <= timestamp_us);
        match n.checked_sub(1).map(|i| &chain[i]) {
            Some(e) => Ok(Some((*e, self.value_of(key, e)?))),
            None => Ok(None),
        }
    }

    /// Every version of `key` in the range, newest first, found by walking
    /// the backpointers from the newest version in range.
    /// At most `limit` versions are read (callers page for more).
    pub fn range(
        &self,
        key: &str,
        range: Range,
        limit: usize,
    ) -> Result<Vec<(Entry, Bytes)>, HistoryError> {
        let Some(chain) = self.chains.get(key) else {
            return Ok(Vec::new());
        };
        let in_range = |e: &Entry| match range {
            Range::Versions { from, to } => (from..=to).contains(&e.version),
            Range::Times { from, to } => (from..=to).contains(&e.timestamp_us),
        };
        let start = match range {
            Range::Versions { to, .. } => chain.partition_point(|e| e.version <= to),
            Range::Times { to, .. } => chain.partition_point(|e| e.timestamp_us <= to),
        };
        let mut out = Vec::new();
        let mut cur = start.checked_sub(1).map(|i| chain[i]);
        while let Some(e) = cur {
            if !in_range(&e) || out.len() >= limit {
                break;
            }
            out.push((e, self.value_of(key, &e)?));
            cur = match chain.binary_search_by_key(&e.prev_version_by_key, |x| x.version) {
                Ok(i) => Some(chain[i]),
                Err(_) => None,
            };
        }
        Ok(out)
    }

    /// Every version of every key under `prefix` that lies in `range` and
    /// is at most `upto`, oldest first (what a resumed watch replays),
    /// with, per key, the newest version below the range that is no
    /// longer held (compacted away by retention), if any: the replay
    /// reports those as lost.
    pub fn changes(&self, prefix: &str, range: Range, upto: u64) -> Changes {
        let in_range = |e: &Entry| match range {
            Range::Versions { from, to } => (from..=to).contains(&e.version),
            Range::Times { from, to } => (from..=to).contains(&e.timestamp_us),
        };
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for (k, c) in self.chains.iter().filter(|(k, _)| k.starts_with(prefix)) {
            let held: Vec<&Entry> = c
                .iter()
                .filter(|e| e.version <= upto && in_range(e))
                .collect();
            // The oldest version held points back at one no longer here:
            // when that one falls in the range, it (and maybe more) is lost.
            if let Some(first) = c.first() {
                let prev = first.prev_version_by_key;
                let dropped_in_range = prev != u64::MAX
                    && match range {
                        Range::Versions { from, .. } => prev >= from,
                        // Times of dropped versions are unknown; any
                        // dropped predecessor of a version in range counts.
                        Range::Times { .. } => {
                            held.first().is_some_and(|h| h.version == first.version)
                        }
                    };
                if dropped_in_range {
                    gone.push((k.clone(), prev));
                }
            }
            out.extend(held.into_iter().map(|e| (k.clone(), *e)));
        }
        out.sort_unstable_by_key(|(_, e)| e.version);
        Changes {
            versions: out,
            gone,
        }
    }

    /// The value of one indexed version (see `changes`).
    pub fn value(&self, key: &str, e: &Entry) -> Result<Bytes, HistoryError> {
        self.value_of(key, e)
    }

    /// Keys live at a version: their newest version ≤ `version` is not a
    /// tombstone. Sorted; optionally under a prefix.
    pub fn keys_at_version(&self, version: u64, prefix: Option<&str>) -> Vec<String> {
        let mut out: Vec<String> = self
            .chains
            .iter()
            .filter(|(k, _)| prefix.is_none_or(|p| k.starts_with(p)))
            .filter(|(_, c)| {
                let n = c.partition_point(|e| e.version <= version);
                n > 0 && !c[n - 1].tombstone
            })
            .map(|(k, _)| k.clone())
            .collect();
        out.sort_unstable();
        out
    }

    /// Keys live at a time (see `keys_at_version`).
    pub fn keys_at_time(&self, timestamp_us: u64, prefix: Option<&str>) -> Vec<String> {
        // The version current at the time: the newest written at or before it.
        let v = self
            .chains
            .values()
            .flat_map(|c| c.iter())
            .filter(|e| e.timestamp_us <= timestamp_us)
            .map(|e| e.version)
            .max()
            .unwrap_or(0);
        self.keys_at_version(v, prefix)
    }

    /// The key written at a version.
    /// A scan of every chain: for tools and tests, not for the data path.
    pub fn key_of_version(&self, version: u64) -> Option<&str> {
        self.chains
            .iter()
            .find(|(_, c)| c.binary_search_by_key(&version, |e| e.version).is_ok())
            .map(|(k, _)| k.as_str())
    }

    /// Plans a compaction of one sealed segment: which of its versions to
    /// keep. `keep(key, entry, newer)` gets the number of newer versions of
    /// the key; the newest version of every key is always kept.
    pub fn compaction_plan(
        &self,
        segment: u64,
        keep: impl Fn(&str, &Entry, usize, u64) -> bool,
    ) -> std::collections::HashSet<u64> {
        let mut out = std::collections::HashSet::new();
        for (key, chain) in &self.chains {
            let n = chain.len();
            // Newest first, so the bytes of a version and those newer
            // than it add up as we go.
            let mut bytes = 0u64;
            for (i, e) in chain.iter().enumerate().rev() {
                bytes += u64::from(e.loc.len);
                if e.loc.segment == segment && (i + 1 == n || keep(key, e, n - 1 - i, bytes)) {
                    out.insert(e.version);
                }
            }
        }
        out
    }

    /// Forgets every key `purged` accepts (all its versions; the pool
    /// holding it was purged) and seals the active segment, so that a
    /// compaction of every sealed segment then removes their records from
    /// the disk. Returns (keys, versions) forgotten.
    pub fn forget(
        &mut self,
        purged: impl Fn(&str) -> bool,
    ) -> Result<(usize, usize), HistoryError> {
        let (mut keys, mut versions) = (0, 0);
        self.chains.retain(|k, c| {
            let gone = purged(k);
            if gone {
                keys += 1;
                versions += c.len();
            }
            !gone
        });
        self.latest.retain(|k, _| !purged(k));
        if versions > 0 {
            self.log.seal_active()?;
        }
        Ok((keys, versions))
    }

    /// Sealed segments, oldest first.
    pub fn sealed_segments(&self) -> Result<Vec<u64>, HistoryError> {
        Ok(self.log.sealed_segments()?)
    }

    /// The file system and directory, for `Log::prepare_compacted`.
    pub fn storage(&self) -> (Arc<dyn Fs>, std::path::PathBuf) {
        (self.log.fs().clone(), self.log.dir().to_path_buf())
    }

    /// Swaps in a compacted segment and updates the indexes: moved versions
    /// get their new locations, dropped ones leave the history (a range
    /// read then ends where the retained history ends).
    pub fn install_compacted(&mut self, c: &crate::log::Compacted) -> Result<(), HistoryError> {
        self.log.install_compacted(c)?;
        let moved: HashMap<u64, Location> = c.moved.iter().copied().collect();
        for chain in self.chains.values_mut() {
            chain.retain_mut(|e| {
                if e.loc.segment != c.id {
                    return true;
                }
                match moved.get(&e.version) {
                    Some(l) => {
                        e.loc = *l;
                        true
                    }
                    None => false,
                }
            });
        }
        Ok(())
    }

    /// Removes every version above `version`, durably (see `Log::cut`);
    /// returns how many were removed. A replica rolls its history back to
    /// the version its replication snapshot covers, then re-applies the
    /// consensus log from there, which writes the same versions again.
    pub fn truncate_after(&mut self, version: u64) -> Result<usize, HistoryError> {
        // Versions grow in log order: the first record above `version` is
        // where the cut goes, and everything after it is above too.
        let cut = self
            .chains
            .values()
            .flat_map(|c| c.iter())
            .filter(|e| e.version > version)
            .map(|e| (e.loc.segment, e.loc.offset))
            .min();
        let Some((segment, offset)) = cut else {
            return Ok(0);
        };
        self.log.cut(segment, offset)?;
        self.epoch += 1;
        let mut removed = 0;
        let mut touched = Vec::new();
        for (k, c) in self.chains.iter_mut() {
            let n = c.partition_point(|e| e.version <= version);
            if n < c.len() {
                removed += c.len() - n;
                c.truncate(n);
                touched.push(k.clone());
            }
        }
        self.chains.retain(|_, c| !c.is_empty());
        for k in touched {
            self.latest.remove(&k);
            if let Some(e) = self.chains.get(&k).and_then(|c| c.last()).copied() {
                if !e.tombstone {
                    let v = self.resolve(self.log.read(e.loc)?)?;
                    self.latest.insert(k, v);
                }
            }
        }
        let newest = self.chains.values().filter_map(|c| c.last());
        self.last_version = newest.clone().map(|e| e.version).max().unwrap_or(0);
        self.last_timestamp_us = self
            .chains
            .values()
            .flat_map(|c| c.iter())
            .map(|e| e.timestamp_us)
            .max()
            .unwrap_or(0);
        Ok(removed)
    }

    /// Changes with every `truncate_after`.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Every record with a version up to `version`, in version order
    /// (a replication snapshot of a persistent shard). Values of sealed
    /// segments are slices of their memory maps.
    pub fn records_upto(&self, version: u64) -> Result<Vec<(String, Entry, Bytes)>, HistoryError> {
        let mut es: Vec<(&String, &Entry)> = self
            .chains
            .iter()
            .flat_map(|(k, c)| {
                c.iter()
                    .filter(|e| e.version <= version)
                    .map(move |e| (k, e))
            })
            .collect();
        es.sort_unstable_by_key(|(_, e)| e.version);
        es.into_iter()
            .map(|(k, e)| Ok((k.clone(), *e, self.value_of(k, e)?)))
            .collect()
    }

    pub fn active_segment(&self) -> u64 {
        self.log.active_segment()
    }

    /// See `Log::sync_handle`.
    pub fn sync_handle(&self) -> Result<Box<dyn crate::fs::SegmentFile>, HistoryError> {
        Ok(self.log.sync_handle()?)
    }

    pub fn sync(&mut self) -> Result<(), HistoryError> {
        Ok(self.log.sync()?)
    }

    /// See `Log::take_unsynced`.
    pub fn take_unsynced(&mut self) -> Vec<(u64, std::path::PathBuf)> {
        self.log.take_unsynced()
    }

    /// See `Log::requeue_unsynced`.
    pub fn requeue_unsynced(&mut self, ids: impl IntoIterator<Item = u64>) {
        self.log.requeue_unsynced(ids)
    }
}
