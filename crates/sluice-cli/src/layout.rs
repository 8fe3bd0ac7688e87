//! `sluice layout import`: Cascade's layout.json as a Sluice layout file.

use anyhow::{Context, Result};
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum LayoutCmd {
    /// Convert Cascade's layout.json to a Sluice layout (TOML), saying what
    /// was mapped and how. `serve --cluster` and `dev --layout` also read
    /// layout.json directly (nodes at 127.0.0.1:7420 + id).
    Import {
        /// Cascade's layout.json.
        file: PathBuf,
        /// Node n listens on this address's port + n.
        #[arg(long, default_value = "127.0.0.1:7420")]
        base: SocketAddr,
        /// Write the layout here (default: standard output).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

pub fn run(cmd: LayoutCmd, json_out: bool) -> Result<()> {
    match cmd {
        LayoutCmd::Import { file, base, out } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let i = sluice_types::cascade_layout::import(&text, base)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let toml = format!(
                "# Imported by `sluice layout import` from {}.\n{}",
                file.display(),
                i.layout.to_toml().map_err(anyhow::Error::msg)?
            );
            match &out {
                Some(p) => {
                    std::fs::write(p, &toml).with_context(|| format!("writing {}", p.display()))?
                }
                None if !json_out => print!("{toml}"),
                None => {}
            }
            if json_out {
                println!(
                    "{}",
                    json!({"layout": toml, "notes": i.notes, "nodes": i.layout.nodes.len()})
                );
            } else {
                for n in &i.notes {
                    eprintln!("note: {n}");
                }
                if let Some(p) = &out {
                    eprintln!(
                        "wrote {} ({}); start node N with: sluice serve --cluster {} --node-id N",
                        p.display(),
                        crate::commands::counted(i.layout.nodes.len() as u64, "node"),
                        p.display()
                    );
                }
            }
            Ok(())
        }
    }
}
