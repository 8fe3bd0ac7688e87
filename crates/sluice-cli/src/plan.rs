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
    /// Time for the exact search after the heuristics, in milliseconds
    /// (0: heuristics only). The plan is optimal when it finishes;
    /// otherwise the report gives the gap to a lower bound.
    #[arg(long, default_value_t = 2000)]
    exact_budget_ms: u64,
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
            exact_budget: (a.exact_budget_ms > 0)
                .then(|| std::time::Duration::from_millis(a.exact_budget_ms)),
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
