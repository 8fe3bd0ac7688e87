//! `sluice plan`: model selection and worker assignment (JellyBean).

use anyhow::{Context, Result};
use sluice_plan::report::{render_dot, render_table, report_json};
use sluice_plan::{load, plan_all, PlanOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// A JellyBean input directory, or one of our .toml/.json files.
    path: PathBuf,
    /// Print the plan as Graphviz (dot) instead of a table.
    #[arg(long)]
    dot: bool,
    /// Write a Sluice layout and DFG deploying the plan into this directory.
    #[arg(long)]
    export: Option<PathBuf>,
    /// Also run the exhaustive search (small instances only).
    #[arg(long)]
    exhaustive: bool,
    /// Seed for the random topological orders.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

pub fn run(a: PlanArgs, json: bool) -> Result<()> {
    let p = load::load(&a.path)?;
    let report = plan_all(
        &p,
        &PlanOptions {
            seed: a.seed,
            exhaustive: a.exhaustive,
        },
    )?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&p, &report))?
        );
    } else if a.dot {
        print!("{}", render_dot(&p, &report.plan));
    } else {
        print!("{}", render_table(&p, &report));
    }
    if let Some(dir) = &a.export {
        sluice_plan::export::write(dir, &p, &report.plan)
            .with_context(|| format!("exporting to {}", dir.display()))?;
        eprintln!(
            "wrote {}/layout.toml, dfgs.json and pools.txt",
            dir.display()
        );
    }
    Ok(())
}
