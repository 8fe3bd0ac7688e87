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
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// How often the marks are written out.
pub const FLUSH: Duration = Duration::from_millis(100);

/// The most marks one process writes (a bound on the file's size: minutes
/// of a one-client benchmark).
const MAX_MARKS: u64 = 4_000_000;

struct Recorder {
    marks: Mutex<Vec<Mark>>,
}

static RECORDER: OnceLock<Option<Recorder>> = OnceLock::new();

fn recorder() -> Option<&'static Recorder> {
    RECORDER.get_or_init(start).as_ref()
}

fn start() -> Option<Recorder> {
    let dir = std::path::PathBuf::from(std::env::var_os(ENV)?);
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
    let spawned = std::thread::Builder::new()
        .name("sluice-marks".into())
        .spawn(move || flush_forever(file));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "{ENV}: no thread to write the marks; recording none");
        return None;
    }
    tracing::info!(path = %path.display(), "recording where replicated writes spend their time");
    Some(Recorder {
        marks: Mutex::new(Vec::with_capacity(64 * 1024)),
    })
}

fn flush_forever(file: std::fs::File) {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut taken = Vec::new();
    let mut written = 0u64;
    loop {
        std::thread::sleep(FLUSH);
        // None until `start` has returned.
        let Some(r) = RECORDER.get().and_then(Option::as_ref) else {
            continue;
        };
        std::mem::swap(
            &mut *r.marks.lock().unwrap_or_else(|p| p.into_inner()),
            &mut taken,
        );
        for m in taken.drain(..) {
            if written < MAX_MARKS {
                written += 1;
                let _ = writeln!(out, "{}", m.line());
            }
        }
        let _ = out.flush();
    }
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
        let mut marks = r.marks.lock().unwrap_or_else(|p| p.into_inner());
        marks.extend(indexes.into_iter().map(|index| Mark {
            ns,
            point,
            group,
            index,
            node,
        }));
    }
}

/// Marks `point` for the entry `index` of `group`, dated `ns` (now, or a
/// time taken before the index was known).
pub fn mark_at(ns: u64, point: Point, group: u64, index: u64) {
    if let Some(r) = recorder() {
        r.marks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Mark {
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
    if on() {
        mark_at(now_ns(), point, group, index);
    }
}
