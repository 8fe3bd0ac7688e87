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
    /// Write a Sluice layout and DFG deploying the plan into this directory
    /// (layout.toml, dfgs.json, pools.txt, models.txt).
    #[arg(long)]
    export: Option<PathBuf>,
    /// In the exported layout, node i listens on this address's port + i.
    #[arg(long, default_value = "127.0.0.1:7420")]
    base_addr: std::net::SocketAddr,
    /// Deploy the plan onto the running cluster at --addr (started from
    /// the exported layout): create its pools and apply its graph, then
    /// say which models are still to be put.
    #[arg(long)]
    apply: bool,
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

pub fn run(a: PlanArgs, addr: &str, timeout_ms: u64, json: bool) -> Result<()> {
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
        sluice_plan::export::write(dir, &p, &report.plan, a.base_addr)
            .with_context(|| format!("exporting to {}", dir.display()))?;
        let layout = dir.join("layout.toml");
        eprintln!(
            "wrote {}, dfgs.json, pools.txt and models.txt; start it with: sluice dev --layout {}",
            layout.display(),
            layout.display()
        );
    }
    if a.apply {
        apply(&p, &report.plan, addr, timeout_ms)?;
    }
    Ok(())
}

/// `--apply`: the plan's pools and graph onto a running cluster.
fn apply(
    p: &sluice_plan::Problem,
    plan: &sluice_plan::Plan,
    addr: &str,
    timeout_ms: u64,
) -> Result<()> {
    use sluice_client::{BlockingClient, ClientConfig, PoolSpec, SluiceError};
    let c = BlockingClient::connect_with(ClientConfig {
        addr: addr.to_string(),
        request_timeout: std::time::Duration::from_millis(timeout_ms),
        tls: crate::tls::client(),
        token: crate::tls::token(),
        ..Default::default()
    })
    .with_context(|| format!("connecting to {addr}"))?;
    sluice_plan::export::check_names(p)?;
    for (path, t, sg) in sluice_plan::export::pools(p) {
        let spec = PoolSpec {
            pathname: path.clone(),
            pool_type: Some(spec_type(t)),
            subgroup_index: sg as u32,
            ..Default::default()
        };
        match c.create_pool(spec) {
            Ok(_) => eprintln!("plan --apply: created pool {path} ({t}, subgroup {sg})"),
            Err(SluiceError::PoolExists { .. }) => {
                let have = c.get_pool(&path)?;
                if have.pool_type != spec_type(t) || have.subgroup_index != sg as u32 {
                    anyhow::bail!(
                        "pool {path} exists as {:?} subgroup {}, the plan needs {t} subgroup {sg}",
                        have.pool_type,
                        have.subgroup_index
                    );
                }
                eprintln!("plan --apply: pool {path} exists");
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "creating pool {path} ({t}, subgroup {sg}); was the cluster started from the plan's layout (sluice dev --layout DIR/layout.toml)?"
                )))
            }
        }
    }
    let dfg = sluice_plan::export::dfg_json(p, plan).to_string();
    let r = c.dfg_apply(&dfg).context("applying the plan's graph")?;
    eprintln!("plan --apply: applied graph {}", r["applied"]);
    for v in p.compute_ops() {
        if let Some(key) = sluice_plan::export::model_key(p, plan, v) {
            if c.get(&key).is_err() {
                eprintln!(
                    "plan --apply: model {key} is not stored yet; put it (sluice put {key} --file MODEL.onnx) and operator {} picks it up",
                    p.operators[v].name
                );
            }
        }
    }
    Ok(())
}

fn spec_type(t: &str) -> sluice_client::PoolType {
    if t == "trigger" {
        sluice_client::PoolType::Trigger
    } else {
        sluice_client::PoolType::Volatile
    }
}
