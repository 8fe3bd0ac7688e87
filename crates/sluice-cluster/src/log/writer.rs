//! The writer thread of a synced log: group commit, and no write
//! acknowledged after a failed one.

use super::*;

/// Checks the injected faults before the writer touches the disk.
pub(super) fn injected(
    faults: &Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
    write_bytes: Option<usize>,
) -> std::io::Result<()> {
    let Some(faults) = faults else { return Ok(()) };
    let lock = || faults.lock().unwrap_or_else(|p| p.into_inner());
    let delay = lock().sync_delay.filter(|_| write_bytes.is_none());
    if let Some(d) = delay {
        // A slow disk: the fsync takes this long (the lock is not held).
        std::thread::sleep(d);
    }
    let mut f = lock();
    match write_bytes {
        None if f.fail_sync => Err(std::io::Error::other("injected fsync failure")),
        Some(n) => match f.space_left {
            Some(left) if n as u64 > left => Err(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(left) => {
                f.space_left = Some(left - n as u64);
                Ok(())
            }
            None => Ok(()),
        },
        None => Ok(()),
    }
}

/// What completes when a synced write is on disk.
pub(super) enum Done {
    /// A caller blocked until its record is durable (vote, truncation,
    /// purge).
    Wait(std::sync::mpsc::SyncSender<Result<(), String>>),
    /// Called once the records are durable (the raft-rs driver: it tells
    /// its task, which goes on meanwhile).
    Notify(Box<dyn FnOnce(Result<(), String>) + Send>),
}

impl Done {
    pub(super) fn complete(self, res: &Result<(), String>) {
        match self {
            Done::Wait(tx) => {
                let _ = tx.send(res.clone());
            }
            Done::Notify(f) => f(res.clone()),
        }
    }
}

/// Work for a synced log's writer thread, in log order.
pub(super) enum IoJob {
    /// Records encoded by `encode_parts`: written, then fsync'd.
    Write {
        file: Arc<File>,
        buf: Vec<u8>,
        parts: Vec<Part>,
        /// Highest entry index written to this segment so far.
        max_index: u64,
        done: Option<Done>,
    },
    /// The active segment was sealed at `old_len`; `new` starts with `head`.
    Roll {
        old: Arc<File>,
        old_len: u64,
        new: Arc<File>,
        head: Vec<u8>,
    },
}

/// The writer thread of a synced log (persistent shards). The driver's
/// append only encodes and queues: this thread writes the records, then
/// fsyncs once for everything queued meanwhile (group commit), then tells
/// the consensus driver. So the leader replicates an entry while its own copy is
/// written and synced, and no consensus task ever waits on the disk (a
/// write racing an fsync of the same file can stall for most of it).
pub(super) fn writer(
    rx: std::sync::mpsc::Receiver<IoJob>,
    written: Arc<std::sync::atomic::AtomicU64>,
    faults: Option<Arc<std::sync::Mutex<sluice_log::Faults>>>,
) {
    // After a failed write or fsync the kernel may have dropped the dirty
    // pages: a later fsync that succeeds proves nothing about them, so
    // nothing written after may be reported durable. Every later job
    // fails with the first error; the driver stops the group on it, and a
    // restart (which re-reads and checks the files) is the way back.
    let mut failed: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(j) = rx.try_recv() {
            batch.push(j);
        }
        let mut res: Result<(), String> = match &failed {
            Some(e) => Err(format!(
                "the consensus log stopped accepting writes after an I/O error ({e}); restart the node"
            )),
            None => Ok(()),
        };
        let mut dirty: Vec<Arc<File>> = Vec::new();
        let mut max_index = 0;
        let mut dones = Vec::new();
        for job in batch {
            if res.is_err() {
                if let IoJob::Write { done, .. } = job {
                    dones.extend(done);
                }
                continue;
            }
            let (r, file) = match job {
                IoJob::Write {
                    file,
                    buf,
                    parts,
                    max_index: m,
                    done,
                } => {
                    dones.extend(done);
                    max_index = max_index.max(m);
                    let mut slices = io_slices(&buf, &parts);
                    let len = slices.iter().map(|s| s.len()).sum();
                    let r = injected(&faults, Some(len))
                        .and_then(|()| write_all_vectored(&mut &*file, &mut slices));
                    (r, file)
                }
                IoJob::Roll {
                    old,
                    old_len,
                    new,
                    head,
                } => {
                    // A sealed segment ends exactly at its last record (a
                    // recycled file may hold stale bytes beyond it).
                    let r = old.set_len(old_len).and_then(|()| (&*new).write_all(&head));
                    (r, new)
                }
            };
            if !dirty.iter().any(|f| Arc::ptr_eq(f, &file)) {
                dirty.push(file);
            }
            if let Err(e) = r {
                res = Err(format!("writing the consensus log: {e}"));
            }
        }
        if res.is_ok() {
            for f in &dirty {
                if let Err(e) = injected(&faults, None).and_then(|()| f.sync_data()) {
                    res = Err(format!("fsync of the consensus log failed: {e}"));
                    break;
                }
            }
        }
        match &res {
            Ok(()) => {
                written.fetch_max(max_index, std::sync::atomic::Ordering::AcqRel);
            }
            Err(e) => {
                if failed.is_none() {
                    tracing::error!(error = %e, "consensus log I/O failed; this log accepts no more writes until the node restarts");
                    failed = Some(e.clone());
                }
            }
        }
        for d in dones {
            d.complete(&res);
        }
    }
}
