//! `sluice fsck`: rendering of `sluice_server::fsck` (checks a stopped
//! node's logs; `--repair` fixes what it found, keeping evidence).

use anyhow::{bail, Result};
use sluice_server::fsck::{self, FileStatus, LogKind};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct FsckArgs {
    /// The node's data directory (the node must be stopped).
    #[arg(long, default_value = "./sluice-data")]
    data_dir: PathBuf,
    /// Repair what is damaged (the default is a dry run that only reports).
    #[arg(long)]
    repair: bool,
    /// With --repair on a cluster member: it was removed from each damaged
    /// shard first (`sluice cluster remove-member`), so setting the shard
    /// aside cannot make it vote with a forgotten log.
    #[arg(long)]
    member_removed: bool,
}

pub fn run(a: FsckArgs, json: bool) -> Result<()> {
    let (report, _lock) = fsck::check(&a.data_dir)?;
    let damaged = report.damaged().count();
    let repaired = if a.repair {
        Some(fsck::repair(&report, a.member_removed)?)
    } else {
        None
    };
    if json {
        let files: Vec<serde_json::Value> = report
            .files
            .iter()
            .map(|f| {
                let (status, offset, detail) = match &f.status {
                    FileStatus::Ok => ("ok", None, None),
                    FileStatus::TornTail { offset, bytes } => {
                        ("torn_tail", Some(*offset), Some(format!("{bytes} bytes")))
                    }
                    FileStatus::Corrupt { offset, reason } => {
                        ("corrupt", Some(*offset), Some(reason.clone()))
                    }
                };
                serde_json::json!({
                    "file": f.file, "kind": kind(f.kind), "records": f.records,
                    "bytes": f.bytes, "status": status, "offset": offset, "detail": detail,
                })
            })
            .collect();
        let repair = repaired
            .as_ref()
            .map(|r| serde_json::json!({"evidence_dir": r.evidence_dir, "actions": r.actions}));
        println!(
            "{}",
            serde_json::json!({"data_dir": report.data_dir, "files": files, "damaged": damaged, "repair": repair})
        );
    } else {
        println!("checking {}", report.data_dir.display());
        for f in &report.files {
            let what = match &f.status {
                FileStatus::Ok => "ok".to_string(),
                FileStatus::TornTail { offset, bytes } => format!(
                    "torn tail at offset {offset} ({bytes} bytes): an append that never finished; the node cuts it when it starts"
                ),
                FileStatus::Corrupt { offset, reason } => {
                    format!("CORRUPT at offset {offset}: {reason}")
                }
            };
            println!(
                "  {} {} ({} records, {} bytes): {what}",
                kind(f.kind),
                f.file.display(),
                f.records,
                f.bytes
            );
        }
        println!(
            "{} checked, {damaged} damaged (volatile logs live in RAM and are not checked)",
            crate::commands::counted(report.files.len() as u64, "file")
        );
        match &repaired {
            Some(r) => {
                for a in &r.actions {
                    println!("repair: {a}");
                }
                if let Some(d) = &r.evidence_dir {
                    println!("everything removed is kept in {}", d.display());
                }
            }
            None if damaged > 0 => println!(
                "dry run: nothing changed. `sluice fsck --data-dir {} --repair` repairs (see \"Corruption and repair\" in the README)",
                report.data_dir.display()
            ),
            None => {}
        }
    }
    if damaged > 0 && repaired.is_none() {
        bail!(
            "{damaged} damaged log files in {}",
            report.data_dir.display()
        );
    }
    Ok(())
}

fn kind(k: LogKind) -> &'static str {
    match k {
        LogKind::History => "history",
        LogKind::Consensus => "consensus log",
        LogKind::PoolTable => "pool table log",
    }
}
