//! Where a replicated write's time goes: marks at the points an entry
//! passes on its way through a shard (the leader's proposal, each log
//! append, each AppendEntries sent, received and answered, the apply and
//! the leader's answer), for `sluice bench cluster --breakdown`. The
//! points and the file format are `sluice_types::marks`.
//!
//! Off unless the environment variable `SLUICE_MARKS` names a directory
//! when the process first asks ([`on`]: one atomic load after that). Then
//! a mark costs a clock read and a push under an uncontended lock, and a
//! thread of its own appends the marks to `<dir>/marks-<pid>.txt` every
//! [`FLUSH`]. Nothing here changes what a node does.

use sluice_types::marks::{Mark, Point, ENV};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How often the marks are written out.
pub const FLUSH: Duration = Duration::from_millis(100);

/// The most marks one process writes (a bound on the file's size: minutes
/// of a one-client benchmark).
const MAX_MARKS: u64 = 4_000_000;

/// The marks not yet written out, shared with the thread that writes
/// them.
type Pending = Arc<Mutex<Vec<Mark>>>;

static RECORDER: OnceLock<Option<Pending>> = OnceLock::new();

fn recorder() -> Option<&'static Pending> {
    RECORDER
        .get_or_init(|| start_in(std::env::var_os(ENV)?.into()))
        .as_ref()
}

/// Starts recording into `<dir>/marks-<pid>.txt`: the marks to push to,
/// or None (with a warning) where the file or its thread cannot be had.
fn start_in(dir: PathBuf) -> Option<Pending> {
    let path = dir.join(format!("marks-{}.txt", std::process::id()));
    let opened = std::fs::create_dir_all(&dir).and_then(|_| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
    });
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "{ENV}: cannot write the marks there; recording none");
            return None;
        }
    };
    let pending = Pending::default();
    let theirs = pending.clone();
    let spawned = std::thread::Builder::new()
        .name("sluice-marks".into())
        .spawn(move || flush_forever(&theirs, file));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "{ENV}: no thread to write the marks; recording none");
        return None;
    }
    tracing::info!(path = %path.display(), "recording where replicated writes spend their time");
    Some(pending)
}

fn flush_forever(pending: &Mutex<Vec<Mark>>, file: std::fs::File) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut taken = Vec::new();
    let mut written = 0u64;
    loop {
        std::thread::sleep(FLUSH);
        std::mem::swap(&mut *lock(pending), &mut taken);
        for m in taken.drain(..) {
            if written < MAX_MARKS {
                written += 1;
                let _ = writeln!(out, "{}", m.line());
            }
        }
        let _ = out.flush();
    }
}

fn lock(pending: &Mutex<Vec<Mark>>) -> std::sync::MutexGuard<'_, Vec<Mark>> {
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether marks are being recorded.
pub fn on() -> bool {
    recorder().is_some()
}

/// The clock marks are dated by: the wall clock, in nanoseconds.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Marks `point` for the entries `indexes` of `group`, all now.
pub fn mark_all(point: Point, group: u64, indexes: impl IntoIterator<Item = u64>, node: u64) {
    if let Some(r) = recorder() {
        let ns = now_ns();
        lock(r).extend(indexes.into_iter().map(|index| Mark {
            ns,
            point,
            group,
            index,
            node,
        }));
    }
}

/// Marks `point` for the entry `index` of `group`, dated `ns` (a time
/// taken before the index was known).
pub fn mark_at(ns: u64, point: Point, group: u64, index: u64) {
    if let Some(r) = recorder() {
        lock(r).push(Mark {
            ns,
            point,
            group,
            index,
            node: 0,
        });
    }
}

/// Marks `point` for the entry `index` of `group`, now.
pub fn mark(point: Point, group: u64, index: u64) {
    mark_all(point, group, [index], 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_pushed_reach_the_file_as_lines_that_read_back() {
        let d = tempfile::tempdir().unwrap();
        let pending = start_in(d.path().join("marks")).unwrap();
        let sent: Vec<Mark> = (0..3)
            .map(|i| Mark {
                ns: 1_000 + i,
                point: Point::ALL[i as usize],
                group: 9,
                index: i,
                node: 2,
            })
            .collect();
        lock(&pending).extend(sent.iter().copied());
        let path = d
            .path()
            .join("marks")
            .join(format!("marks-{}.txt", std::process::id()));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let read: Vec<Mark> = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .filter_map(Mark::parse)
                .collect();
            if read.len() >= sent.len() {
                assert_eq!(read, sent);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{read:?} written");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_directory_that_cannot_be_made_records_nothing() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        assert!(start_in(file.join("marks")).is_none());
    }
}
