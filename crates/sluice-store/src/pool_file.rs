//! The pool table on disk: `pools.json` holds the whole table, and
//! `pools.log` beside it one line per change made since (the changed pool
//! as it is after the change, or its removal, with the table's version),
//! so a change costs one appended line and one `fdatasync`, not the whole
//! table rewritten (with thousands of pools that took milliseconds per
//! create, on every node of a cluster). Once the log holds half as many
//! lines as the table has pools (and at least `MIN_LINES_BEFORE_REWRITE`)
//! the table is written whole again (temporary file, fsync, rename) and
//! the log emptied: O(1) disk work per change, amortized. Loading reads the table, then applies the log's lines
//! newer than it (a crash between the rename and the emptying leaves lines
//! the table already holds: skipped by version). A last line cut short by
//! a crash was never acknowledged: it is dropped (and cut from the file);
//! a damaged line before the last is an error naming the file and line.

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sluice_types::{PoolMeta, PoolTable, SluiceError};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, SluiceError>;

/// The log is folded into the table once it has this many lines, or
/// half as many as the table has pools if that is more.
const MIN_LINES_BEFORE_REWRITE: usize = 256;

/// One change: pool `path` after it (`None`: no longer in the table),
/// the table at `version` then.
#[derive(Serialize, Deserialize)]
struct Change {
    version: u64,
    path: String,
    pool: Option<PoolMeta>,
}

/// What `scan_pool_log` found in a pool table log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolLogScan {
    /// Whole lines read, all good.
    pub lines: usize,
    /// Where the good lines end.
    pub good: usize,
    pub problem: Option<PoolLogProblem>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolLogProblem {
    /// A last line cut short (never acknowledged): a node drops it.
    Torn { bytes: usize },
    /// A whole line (1-based `line`, at byte `offset`) that is not a
    /// change: a node refuses to start.
    Corrupt {
        line: usize,
        offset: usize,
        reason: String,
    },
}

/// Checks a pool table log (`pools.log`) as a node reads it at start.
pub fn scan_pool_log(bytes: &[u8]) -> PoolLogScan {
    scan(bytes).1
}

/// The log's changes up to its first problem, and what was found.
fn scan(bytes: &[u8]) -> (Vec<Change>, PoolLogScan) {
    let mut changes = Vec::new();
    let (mut at, mut problem) = (0usize, None);
    while at < bytes.len() {
        let end = bytes[at..].iter().position(|b| *b == b'\n');
        let line = &bytes[at..at + end.unwrap_or(bytes.len() - at)];
        match (serde_json::from_slice::<Change>(line), end) {
            (Ok(c), Some(end)) => {
                changes.push(c);
                at += end + 1;
                continue;
            }
            // The last line, cut short by a crash before it was synced
            // (so never acknowledged).
            (_, None) => {
                problem = Some(PoolLogProblem::Torn {
                    bytes: bytes.len() - at,
                })
            }
            (Err(e), Some(_)) => {
                problem = Some(PoolLogProblem::Corrupt {
                    line: changes.len() + 1,
                    offset: at,
                    reason: e.to_string(),
                })
            }
        }
        break;
    }
    let scan = PoolLogScan {
        lines: changes.len(),
        good: at,
        problem,
    };
    (changes, scan)
}

pub(crate) struct PoolFile {
    path: PathBuf,
    log_path: PathBuf,
    /// The log is opened for each change (no descriptor outlives a fold).
    log: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    /// Whether the table file exists (the first commit writes it whole,
    /// so a data directory always has one).
    table_written: bool,
    /// Lines in the log.
    lines: usize,
}

fn io(what: &str, file: &Path, e: impl std::fmt::Display) -> SluiceError {
    SluiceError::Io {
        reason: format!("{what} {}: {e}", file.display()),
    }
}

impl PoolFile {
    /// The table at `path` (`pools.json`) and its log (`pools.log`).
    pub(crate) fn new(path: &Path) -> PoolFile {
        PoolFile {
            path: path.to_path_buf(),
            log_path: path.with_extension("log"),
            log: Mutex::default(),
        }
    }

    /// The table as the files hold it; `None` when neither exists (a new
    /// node: its default pools are to be created).
    pub(crate) fn load(&self) -> Result<Option<PoolTable>> {
        let mut table = match std::fs::read_to_string(&self.path) {
            Ok(text) => Some(
                serde_json::from_str::<PoolTable>(&text)
                    .map_err(|e| io("the pool table is corrupt:", &self.path, e))?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("reading pool table", &self.path, e)),
        };
        self.log.lock().table_written = table.is_some();
        let bytes = match std::fs::read(&self.log_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(table),
            Err(e) => return Err(io("reading pool table log", &self.log_path, e)),
        };
        let (changes, scan) = scan(&bytes);
        if let Some(PoolLogProblem::Corrupt { line, reason, .. }) = scan.problem {
            return Err(io(
                &format!("the pool table log is damaged at line {line}:"),
                &self.log_path,
                format!("{reason} (each line is one pool change, oldest first: `sluice fsck --repair` cuts the file before that line, keeping the rest as evidence)"),
            ));
        }
        for c in changes {
            let t = table.get_or_insert_with(PoolTable::default);
            if c.version > t.version {
                match c.pool {
                    Some(p) => t.pools.insert(c.path, p),
                    None => t.pools.remove(&c.path),
                };
                t.version = c.version;
            }
        }
        let (lines, good_len) = (scan.lines, scan.good);
        if good_len < bytes.len() {
            tracing::warn!(file = %self.log_path.display(), bytes = bytes.len() - good_len, "dropped a pool table change cut short by a crash (never acknowledged)");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.log_path)
                .map_err(|e| io("opening", &self.log_path, e))?;
            f.set_len(good_len as u64)
                .and_then(|()| f.sync_all())
                .map_err(|e| io("cutting", &self.log_path, e))?;
        }
        self.log.lock().lines = lines;
        Ok(table)
    }

    /// Makes `table` durable, `changed` being the one pool path it
    /// changed since the table last committed (`None`: written whole).
    pub(crate) fn commit(&self, table: &PoolTable, changed: Option<&str>) -> Result<()> {
        let mut log = self.log.lock();
        let fold = !log.table_written
            || log.lines + 1 >= MIN_LINES_BEFORE_REWRITE.max(table.pools.len() / 2);
        match changed {
            Some(path) if !fold => {
                let mut line = serde_json::to_vec(&Change {
                    version: table.version,
                    path: path.to_string(),
                    pool: table.pools.get(path).cloned(),
                })
                .map_err(|e| SluiceError::Internal {
                    reason: e.to_string(),
                })?;
                line.push(b'\n');
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.log_path)
                    .map_err(|e| io("opening", &self.log_path, e))?;
                let before = f
                    .metadata()
                    .map_err(|e| io("reading the length of", &self.log_path, e))?
                    .len();
                if let Err(e) = f.write_all(&line).and_then(|()| f.sync_data()) {
                    // No part of a failed change stays to be followed by
                    // the next one (it would read as damage).
                    let _ = f.set_len(before);
                    return Err(io("appending to", &self.log_path, e));
                }
                log.lines += 1;
            }
            _ => {
                let bytes =
                    serde_json::to_vec_pretty(table).map_err(|e| SluiceError::Internal {
                        reason: e.to_string(),
                    })?;
                crate::store::write_atomically(&self.path, &bytes)?;
                log.table_written = true;
                // Emptied only once the table holding its lines is in
                // place (a crash in between: lines skipped by version).
                if log.lines > 0 || self.log_path.exists() {
                    File::create(&self.log_path)
                        .and_then(|f| f.sync_all())
                        .map_err(|e| io("emptying", &self.log_path, e))?;
                }
                log.lines = 0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(path: &str) -> sluice_types::PoolSpec {
        sluice_types::PoolSpec {
            pathname: path.into(),
            pool_type: Some(sluice_types::PoolType::Volatile),
            ..Default::default()
        }
    }

    fn create(t: &mut PoolTable, path: &str) {
        t.create(&spec(path), sluice_types::PoolType::Volatile, 1, 1)
            .unwrap();
    }

    /// Changes are appended and folded into the table as the log grows;
    /// what loads is what was committed, through every fold.
    #[test]
    fn changes_are_appended_and_load_back_through_folds() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("pools.json");
        let f = PoolFile::new(&path);
        assert!(f.load().unwrap().is_none());
        let mut t = PoolTable::default();
        f.commit(&t, None).unwrap();
        for i in 0..600 {
            let p = format!("/p{i}");
            create(&mut t, &p);
            f.commit(&t, Some(&p)).unwrap();
            if i % 3 == 0 {
                t.remove(&p).unwrap();
                f.commit(&t, Some(&p)).unwrap();
            }
            if i % 9 == 0 {
                t.purge(&p).unwrap();
                f.commit(&t, Some(&p)).unwrap();
            }
            if i % 97 == 0 {
                assert_eq!(PoolFile::new(&path).load().unwrap().as_ref(), Some(&t));
            }
        }
        let back = PoolFile::new(&path).load().unwrap().unwrap();
        assert_eq!(back, t);
        let lines = std::fs::read_to_string(d.path().join("pools.log"))
            .unwrap()
            .lines()
            .count();
        assert!(
            lines < MIN_LINES_BEFORE_REWRITE.max(t.pools.len()),
            "folded: {lines} lines"
        );
        assert!(lines > 0, "the last changes are in the log");
    }

    /// A crash between the table's rename and the log's emptying leaves
    /// lines the table holds: skipped. A last line cut short is dropped
    /// and cut from the file; a damaged line before it is an error.
    #[test]
    fn a_crash_leaves_the_table_as_committed_or_says_what_is_damaged() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("pools.json");
        let log = d.path().join("pools.log");
        let f = PoolFile::new(&path);
        let mut t = PoolTable::default();
        f.commit(&t, None).unwrap();
        for p in ["/a", "/b", "/c"] {
            create(&mut t, p);
            f.commit(&t, Some(p)).unwrap();
        }
        let lines = std::fs::read(&log).unwrap();
        // The table written whole with the log's changes in it, the log
        // not emptied yet.
        crate::store::write_atomically(&path, &serde_json::to_vec(&t).unwrap()).unwrap();
        assert_eq!(PoolFile::new(&path).load().unwrap().unwrap(), t);
        // A fourth change cut short.
        let mut torn = lines.clone();
        torn.extend_from_slice(br#"{"version":4,"path":"/d","po"#);
        std::fs::write(&log, &torn).unwrap();
        assert_eq!(PoolFile::new(&path).load().unwrap().unwrap(), t);
        assert_eq!(std::fs::read(&log).unwrap(), lines, "the torn line is cut");
        // Damage before the last line.
        let mut bad = b"{not json}\n".to_vec();
        bad.extend_from_slice(&lines);
        std::fs::write(&log, &bad).unwrap();
        let e = PoolFile::new(&path).load().unwrap_err().to_string();
        assert!(e.contains("pools.log") && e.contains("line 1"), "{e}");
    }
}
