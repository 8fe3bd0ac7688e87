//! `sluice bench`: runs the `sluice-bench` binary (crate `sluice-bench`),
//! which holds the benchmarks and their peers, so this binary carries
//! none of them.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Runs `sluice-bench` (next to this binary, else on the PATH) with
/// `args`, telling it to start nodes with this very `sluice`; returns
/// only if it could not be started.
pub fn run(args: &[String], json: bool) -> Result<()> {
    let me = std::env::current_exe().context("finding the sluice binary")?;
    let sibling = me.with_file_name("sluice-bench");
    let bench = if sibling.exists() {
        sibling
    } else {
        "sluice-bench".into()
    };
    let mut cmd = Command::new(&bench);
    cmd.args(args).env("SLUICE_BIN", &me);
    if json {
        cmd.arg("--json");
    }
    // This process becomes the benchmark (Unix): a signal meant for
    // `sluice bench` reaches it, and its exit status is this command's.
    #[cfg(unix)]
    let err = {
        use std::os::unix::process::CommandExt;
        // Its help and usage lines then read `sluice bench ...`, the
        // command the user typed (clap names itself after argv[0]).
        cmd.arg0("sluice bench").exec()
    };
    #[cfg(not(unix))]
    let err = match cmd.status() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(e) => e,
    };
    if err.kind() == std::io::ErrorKind::NotFound {
        bail!(
            "the benchmarks are their own binary, `sluice-bench`, and it is not installed next to {} or on the PATH: build it with `cargo build --release -p sluice-bench` (or `cargo install --path crates/sluice-bench`)",
            me.display()
        );
    }
    Err(err).with_context(|| format!("running {}", bench.display()))
}
