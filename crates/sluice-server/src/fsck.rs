//! `sluice fsck`: checks every log file of a stopped node's data
//! directory (persistent histories, consensus logs and the pool table's
//! log) and, when asked, repairs what it found, keeping everything it
//! removes as evidence.
//!
//! What counts as a torn tail and what as damage is the logs' own rule
//! (`sluice_log::scan_segment`, `sluice_cluster::log::scan_segment`,
//! `sluice_store::scan_pool_log`): a torn tail is cut by the node itself
//! at its next start; damage makes the node refuse to start. Volatile shards' logs live in RAM (`/dev/shm`)
//! and are not checked.

use sluice_log::{DirLock, Problem};
use std::path::{Path, PathBuf};

/// Which log a file belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogKind {
    /// A persistent shard's history (`persistent/sg<g>-shard<s>`).
    History,
    /// A replication group's consensus log (`raft/<group>`).
    Consensus,
    /// The pool table's log of changes (`pools.log`).
    PoolTable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileStatus {
    Ok,
    /// An append that never finished; the node cuts it when it starts.
    TornTail {
        offset: u64,
        bytes: u64,
    },
    /// Damage: the node refuses to start until it is repaired.
    Corrupt {
        offset: u64,
        reason: String,
    },
}

#[derive(Clone, Debug)]
pub struct FileReport {
    pub file: PathBuf,
    /// The log's directory (a shard's history or a group's log).
    pub log_dir: PathBuf,
    pub kind: LogKind,
    pub records: usize,
    pub bytes: u64,
    pub status: FileStatus,
}

#[derive(Debug)]
pub struct Report {
    pub data_dir: PathBuf,
    /// A cluster member's directory (it holds consensus logs).
    pub cluster: bool,
    pub files: Vec<FileReport>,
}

impl Report {
    pub fn damaged(&self) -> impl Iterator<Item = &FileReport> {
        self.files
            .iter()
            .filter(|f| matches!(f.status, FileStatus::Corrupt { .. }))
    }
}

impl From<sluice_log::LockError> for FsckError {
    fn from(e: sluice_log::LockError) -> Self {
        FsckError::Locked(e)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FsckError {
    // Not `#[from]`: that would make the lock error a `source` too, and
    // printed with its chain it would appear twice.
    #[error("{0}; fsck needs the node stopped")]
    Locked(sluice_log::LockError),
    #[error("{0} is not a Sluice data directory (no pools.json); pass the node's --data-dir")]
    NotADataDir(String),
    #[error("{what} {path}: {error}")]
    Io {
        what: &'static str,
        path: String,
        error: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FsckError {
    let path = path.display().to_string();
    move |error| FsckError::Io { what, path, error }
}

fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, FsckError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io("listing", dir))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    Ok(out)
}

/// Locks `data_dir` (refused while a node runs on it) and checks it.
pub fn check(data_dir: &Path) -> Result<(Report, DirLock), FsckError> {
    if !data_dir.join("pools.json").is_file() {
        return Err(FsckError::NotADataDir(data_dir.display().to_string()));
    }
    let lock = DirLock::acquire(data_dir, "sluice fsck")?;
    let mut files = Vec::new();
    for dir in subdirs(&data_dir.join("persistent"))? {
        let segs = sluice_log::segment_files(&dir).map_err(io("listing", &dir))?;
        for (i, (id, path)) in segs.iter().enumerate() {
            let data = bytes::Bytes::from(std::fs::read(path).map_err(io("reading", path))?);
            let scan = sluice_log::scan_segment(&data, *id, i + 1 == segs.len());
            files.push(FileReport {
                file: path.clone(),
                log_dir: dir.clone(),
                kind: LogKind::History,
                records: scan.records.len(),
                bytes: data.len() as u64,
                status: match scan.problem {
                    None => FileStatus::Ok,
                    Some(Problem::Torn { offset, bytes }) => FileStatus::TornTail { offset, bytes },
                    Some(Problem::Corrupt { offset, reason }) => {
                        FileStatus::Corrupt { offset, reason }
                    }
                },
            });
        }
    }
    let raft = data_dir.join("raft");
    for dir in subdirs(&raft)? {
        // Persistent groups and the metadata group fsync their log
        // (preallocated, never recycled: `sluice_cluster`'s
        // `node::groups::synced`), so only they can tell damage from a
        // torn append at the tail.
        let synced = dir.file_name().is_some_and(|n| {
            let n = n.to_string_lossy();
            n.starts_with("persistent-") || n == "meta"
        });
        let segs = sluice_cluster::log::segment_files(&dir).map_err(io("listing", &dir))?;
        let newest = segs
            .iter()
            .filter(|(_, p)| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("seg-"))
            })
            .map(|(s, _)| *s)
            .max();
        for (seq, path) in &segs {
            let data = std::fs::read(path).map_err(io("reading", path))?;
            let last = Some(*seq) == newest
                && path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("seg-"));
            let scan = sluice_cluster::log::scan_segment(&data, *seq, synced, last, path);
            let (records, status) = match scan {
                Err(e) => (
                    0,
                    FileStatus::Corrupt {
                        offset: 0,
                        reason: e.to_string(),
                    },
                ),
                Ok(s) => (
                    s.records(),
                    match s.tail {
                        sluice_cluster::log::Tail::Clean => FileStatus::Ok,
                        // A synced segment is preallocated with zeros:
                        // zeros alone past its last record are room not
                        // written yet (every live segment has it), not an
                        // append; the node cuts nothing there.
                        sluice_cluster::log::Tail::Cut
                            if synced && data[s.good..].iter().all(|&b| b == 0) =>
                        {
                            FileStatus::Ok
                        }
                        sluice_cluster::log::Tail::Cut => FileStatus::TornTail {
                            offset: s.good as u64,
                            bytes: (data.len() - s.good) as u64,
                        },
                        sluice_cluster::log::Tail::Corrupt(reason) => FileStatus::Corrupt {
                            offset: s.good as u64,
                            reason,
                        },
                    },
                ),
            };
            files.push(FileReport {
                file: path.clone(),
                log_dir: dir.clone(),
                kind: LogKind::Consensus,
                records,
                bytes: data.len() as u64,
                status,
            });
        }
    }
    files.extend(check_pool_log(data_dir)?);
    Ok((
        Report {
            data_dir: data_dir.to_path_buf(),
            cluster: raft.is_dir(),
            files,
        },
        lock,
    ))
}

/// The pool table's log (`pools.log`), if there is one, read as the
/// node reads it at start.
fn check_pool_log(data_dir: &Path) -> Result<Option<FileReport>, FsckError> {
    let pool_log = data_dir.join("pools.log");
    if !pool_log.is_file() {
        return Ok(None);
    }
    let data = std::fs::read(&pool_log).map_err(io("reading", &pool_log))?;
    let scan = sluice_store::scan_pool_log(&data);
    Ok(Some(FileReport {
        file: pool_log,
        log_dir: data_dir.to_path_buf(),
        kind: LogKind::PoolTable,
        records: scan.lines,
        bytes: data.len() as u64,
        status: match scan.problem {
            None => FileStatus::Ok,
            Some(sluice_store::PoolLogProblem::Torn { bytes }) => FileStatus::TornTail {
                offset: scan.good as u64,
                bytes: bytes as u64,
            },
            Some(sluice_store::PoolLogProblem::Corrupt {
                line,
                offset,
                reason,
            }) => FileStatus::Corrupt {
                offset: offset as u64,
                reason: format!("line {line}: {reason}"),
            },
        },
    }))
}

/// Keeps `data` (the contents of `file`) from `offset` on in `dir` as
/// `<file name>.from-<offset>`, synced; returns where.
fn keep_from(file: &Path, data: &[u8], offset: u64, dir: &Path) -> Result<PathBuf, FsckError> {
    use std::io::Write;
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let kept = dir.join(format!("{name}.from-{offset}"));
    let mut w = std::fs::File::create(&kept).map_err(io("creating", &kept))?;
    w.write_all(&data[offset as usize..])
        .and_then(|()| w.sync_all())
        .map_err(io("writing", &kept))?;
    Ok(kept)
}

/// Cuts `file` to its first `len` bytes, synced.
fn truncate(file: &Path, len: u64) -> Result<(), FsckError> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .map_err(io("opening", file))?;
    f.set_len(len)
        .and_then(|()| f.sync_all())
        .map_err(io("truncating", file))
}

/// What a repair did.
#[derive(Debug, Default)]
pub struct Repair {
    /// Where everything removed was put.
    pub evidence_dir: Option<PathBuf>,
    /// One line per action.
    pub actions: Vec<String>,
}

/// Repairs what `check` found damaged, moving everything it removes into
/// `<data_dir>/fsck-evidence-<unix seconds>/`:
/// - a standalone node's history is cut at its first damaged record: that
///   record and every later one (the rest of its segment, later segments)
///   are moved aside, so the shard's newest versions from there on are
///   lost; the report says from which version;
/// - a cluster member's damaged shard (its history or its consensus log)
///   is set aside whole, to be restored from its peers. That is only safe
///   once the member was removed from the shard (`sluice cluster
///   remove-member`): a member that forgot its log could otherwise vote a
///   stale leader in and lose acknowledged writes, so `member_removed`
///   must say it was;
/// - the pool table's log is cut before its damaged line (the pool
///   changes from there on are lost to a standalone node; a cluster member
///   rebuilds its pool table from the metadata group when it starts, so it
///   needs no `member_removed` for it).
pub fn repair(report: &Report, member_removed: bool) -> Result<Repair, FsckError> {
    let damaged: Vec<&FileReport> = report.damaged().collect();
    let mut out = Repair::default();
    if damaged.is_empty() {
        return Ok(out);
    }
    let shards_damaged = damaged.iter().any(|f| f.kind != LogKind::PoolTable);
    if report.cluster && !member_removed && shards_damaged {
        return Err(FsckError::Refused(
            "this node is a cluster member: its damaged shards must be restored from their peers. First remove it from each damaged shard on a running node (sluice cluster remove-member <shard> <node>), then run fsck --repair --member-removed, start the node, and add it back (sluice cluster add-member <shard> <node>)".into(),
        ));
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let evidence = report.data_dir.join(format!("fsck-evidence-{stamp}"));
    std::fs::create_dir_all(&evidence).map_err(io("creating", &evidence))?;
    out.evidence_dir = Some(evidence.clone());
    let mut done: Vec<&Path> = Vec::new();
    for f in damaged {
        if f.kind == LogKind::PoolTable {
            cut_pool_log(report, f, &evidence, &mut out)?;
            continue;
        }
        if done.contains(&f.log_dir.as_path()) {
            continue;
        }
        done.push(&f.log_dir);
        if report.cluster {
            for dir in shard_dirs(report, &f.log_dir) {
                let to = evidence.join(dir.file_name().unwrap_or_default());
                std::fs::rename(&dir, &to).map_err(io("moving", &dir))?;
                out.actions
                    .push(format!("moved {} to {}", dir.display(), to.display()));
            }
            continue;
        }
        let FileStatus::Corrupt { offset, .. } = f.status else {
            continue;
        };
        cut_history(report, f, offset, &evidence, &mut out)?;
    }
    Ok(out)
}

/// The directories of the shard a damaged log belongs to: its history and
/// its consensus log (`persistent/sg<g>-shard<s>`, `raft/persistent-<g>-<s>`).
fn shard_dirs(report: &Report, log_dir: &Path) -> Vec<PathBuf> {
    let name = log_dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (history, consensus) = if let Some(rest) = name.strip_prefix("persistent-") {
        let (g, s) = rest.split_once('-').unwrap_or((rest, ""));
        (format!("sg{g}-shard{s}"), name.clone())
    } else if let Some(rest) = name.strip_prefix("sg") {
        let (g, s) = rest.split_once("-shard").unwrap_or((rest, ""));
        (name.clone(), format!("persistent-{g}-{s}"))
    } else {
        return vec![log_dir.to_path_buf()];
    };
    [
        report.data_dir.join("persistent").join(history),
        report.data_dir.join("raft").join(consensus),
    ]
    .into_iter()
    .filter(|d| d.is_dir())
    .collect()
}

/// Cuts the pool table's log before its damaged line, the rest kept in
/// `evidence`. A cluster member loses nothing by it: its pool table is
/// rebuilt from the metadata group's snapshot and log when it starts.
fn cut_pool_log(
    report: &Report,
    f: &FileReport,
    evidence: &Path,
    out: &mut Repair,
) -> Result<(), FsckError> {
    let FileStatus::Corrupt { offset, .. } = f.status else {
        return Ok(());
    };
    let data = std::fs::read(&f.file).map_err(io("reading", &f.file))?;
    let cut = keep_from(&f.file, &data, offset, evidence)?;
    truncate(&f.file, offset)?;
    let lost = if report.cluster {
        "this member gets those changes back from the metadata group when it starts"
    } else {
        "the pool changes from there on (pools created, removed or purged then) are lost: check `sluice pools ls` once the node runs"
    };
    out.actions.push(format!(
        "cut {} after its first {} lines ({} bytes moved to {}); {lost}",
        f.file.display(),
        f.records,
        data.len() as u64 - offset,
        cut.display()
    ));
    Ok(())
}

/// Cuts a standalone history at `offset` of the damaged file: the bytes
/// from there and every later segment go to `evidence`.
fn cut_history(
    report: &Report,
    f: &FileReport,
    offset: u64,
    evidence: &Path,
    out: &mut Repair,
) -> Result<(), FsckError> {
    let data = std::fs::read(&f.file).map_err(io("reading", &f.file))?;
    let sub = evidence.join(f.log_dir.file_name().unwrap_or_default());
    std::fs::create_dir_all(&sub).map_err(io("creating", &sub))?;
    let cut = keep_from(&f.file, &data, offset, &sub)?;
    let last_good = report
        .files
        .iter()
        .filter(|o| o.log_dir == f.log_dir && o.file <= f.file)
        .map(|o| o.records)
        .sum::<usize>();
    if offset < 24 {
        // Not even the header is intact: the segment goes whole.
        std::fs::remove_file(&f.file).map_err(io("removing", &f.file))?;
    } else {
        truncate(&f.file, offset)?;
    }
    out.actions.push(format!(
        "cut {} at offset {offset} ({} bytes moved to {}); the shard keeps its first {last_good} records, later ones are lost",
        f.file.display(),
        data.len() as u64 - offset,
        cut.display()
    ));
    for later in report
        .files
        .iter()
        .filter(|o| o.log_dir == f.log_dir && o.file > f.file)
    {
        let to = sub.join(later.file.file_name().unwrap_or_default());
        std::fs::rename(&later.file, &to).map_err(io("moving", &later.file))?;
        out.actions.push(format!(
            "moved {} to {}",
            later.file.display(),
            to.display()
        ));
    }
    Ok(())
}
