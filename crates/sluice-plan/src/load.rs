//! Reading inputs: the JellyBean directory format (`shared/fixtures/
//! jellybean-vqa/README.md`) and our single TOML/JSON file
//! (`examples/plan/*.toml`). Errors name the file, the line and the field.

use crate::error::{PlanError, Result};
use crate::problem::{
    AccRow, Edge, EndToEnd, OpKind, Operator, Problem, Settings, Tier, Variant, Worker,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Loads a problem from a JellyBean directory or a `.toml`/`.json` file.
pub fn load(path: &Path) -> Result<Problem> {
    if path.is_dir() {
        load_jellybean(path)
    } else {
        load_file(path)
    }
}

// ------------------------------------------------------------ JellyBean dir

struct Csv {
    file: String,
    rows: Vec<(usize, Vec<String>)>,
}

impl Csv {
    fn read(dir: &Path, name: &str, cols: usize, required: bool) -> Result<Csv> {
        let path = dir.join(name);
        let file = path.display().to_string();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(PlanError::File {
                    file,
                    reason: e.to_string(),
                })
            }
        };
        let mut rows = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<String> = line
                .trim_end_matches(',')
                .split(',')
                .map(|s| s.trim().to_string())
                .collect();
            if f.len() != cols {
                return Err(PlanError::Input {
                    file: file.clone(),
                    line: i + 1,
                    field: "row".into(),
                    reason: format!("expected {cols} columns, found {}", f.len()),
                });
            }
            rows.push((i + 1, f));
        }
        Ok(Csv { file, rows })
    }

    fn num(&self, line: usize, field: &str, s: &str) -> Result<f64> {
        s.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| PlanError::Input {
                file: self.file.clone(),
                line,
                field: field.into(),
                reason: format!("{s:?} is not a number"),
            })
    }

    fn err(&self, line: usize, field: &str, reason: String) -> PlanError {
        PlanError::Input {
            file: self.file.clone(),
            line,
            field: field.into(),
            reason,
        }
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, name: &str) -> Result<T> {
    let path = dir.join(name);
    let file = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| PlanError::File {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| PlanError::Input {
        file,
        line: e.line(),
        field: "json".into(),
        reason: e.to_string(),
    })
}

#[derive(Deserialize)]
struct AccReq {
    sink: String,
    threshold: f64,
}

#[derive(Deserialize)]
struct AccProfiles {
    end_to_end_profile: Option<E2eJson>,
    per_operator_profiles: Vec<OpProfile>,
}

#[derive(Deserialize)]
struct E2eJson {
    operators: Vec<String>,
    acc_profile: Vec<E2eRow>,
}

#[derive(Deserialize)]
struct E2eRow {
    variants: Vec<String>,
    accuracy: f64,
}

#[derive(Deserialize)]
struct OpProfile {
    op_name: String,
    inputs: Vec<String>,
    #[serde(default)]
    cost_profile: BTreeMap<String, f64>,
    acc_profile: BTreeMap<String, Vec<AccSample>>,
}

#[derive(Deserialize)]
struct AccSample {
    inputs_acc: Vec<f64>,
    output_acc: f64,
}

/// Reads `KEY: value` settings from config.yaml (flat keys are unique).
fn read_config(dir: &Path, s: &mut Settings) -> Result<()> {
    let path = dir.join("config.yaml");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(());
    };
    for (i, line) in text.lines().enumerate() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim().trim_matches(|c| c == '"' || c == '\''));
        let num = || {
            v.parse::<f64>().map_err(|_| PlanError::Input {
                file: path.display().to_string(),
                line: i + 1,
                field: k.to_string(),
                reason: format!("{v:?} is not a number"),
            })
        };
        match k {
            "BEST_K" => s.model_beam = num()? as usize,
            "MAX_NUM_ASSIGN_ORDERS" => s.assign_orders = num()? as usize,
            "BEST_K_ASSIGNMENTS" => s.assign_beam = num()? as usize,
            "COMM_COST_SCALING_FACTOR" => s.comm_scale = num()?,
            "LATENCY_OVERESTIMATE_RATIO" => s.latency_overestimate = num()?,
            _ => {}
        }
    }
    Ok(())
}

pub fn load_jellybean(dir: &Path) -> Result<Problem> {
    let graph = Csv::read(dir, "logical_graph.csv", 2, true)?;
    let rates = Csv::read(dir, "input_injection_rates.csv", 2, true)?;
    let ratios = Csv::read(dir, "throughput_normalization_ratios.csv", 3, false)?;
    let exec = Csv::read(dir, "execution_profile.csv", 4, true)?;
    let msgs = Csv::read(dir, "message_sizes.csv", 5, true)?;
    let specs = Csv::read(dir, "workers_specs.csv", 2, true)?;
    let wlinks = Csv::read(dir, "workers_workers_link.csv", 3, false)?;
    let slinks = Csv::read(dir, "sources_workers_link.csv", 3, false)?;
    let tiers_json: Vec<Vec<String>> = read_json(dir, "workers_partition.json")?;
    let req: AccReq = read_json(dir, "accuracy_requirement.json")?;
    let profiles: AccProfiles = read_json(dir, "nodes_accuracy_profiles.json")?;
    let mut settings = Settings::default();
    read_config(dir, &mut settings)?;

    let mut b = Builder::default();
    for (line, r) in &specs.rows {
        let cost = specs.num(*line, "cost", &r[1])?;
        b.workers.push((r[0].clone(), cost, None));
    }
    for (t, names) in tiers_json.iter().enumerate() {
        b.tiers.push(Tier {
            name: format!("tier{t}"),
            locations: 1,
        });
        for n in names {
            let w = b
                .workers
                .iter_mut()
                .find(|w| &w.0 == n)
                .ok_or_else(|| PlanError::Field {
                    file: dir.join("workers_partition.json").display().to_string(),
                    field: format!("[{t}]"),
                    reason: format!("worker {n:?} is not in workers_specs.csv"),
                })?;
            w.2 = Some(t);
        }
    }
    for (line, r) in &rates.rows {
        let rate = rates.num(*line, "rate", &r[1])?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(PlanError::Input {
                file: dir.join("input_injection_rates.csv").display().to_string(),
                line: *line,
                field: "rate".into(),
                reason: format!(
                    "source {:?}: rate {rate} is not a positive number of inputs per second",
                    r[0]
                ),
            });
        }
        b.op(&r[0], Some(rate));
    }
    for (_, r) in &graph.rows {
        b.op(&r[0], None);
        b.op(&r[1], None);
        b.edges.push((r[0].clone(), r[1].clone(), 1.0));
    }
    for (line, r) in &ratios.rows {
        let ratio = ratios.num(*line, "ratio", &r[2])?;
        match b.edges.iter_mut().find(|e| e.0 == r[0] && e.1 == r[1]) {
            Some(e) => e.2 = ratio,
            None => {
                return Err(ratios.err(
                    *line,
                    "u,v",
                    format!("{}→{} is not an edge of logical_graph.csv", r[0], r[1]),
                ))
            }
        }
    }
    for (line, r) in &exec.rows {
        let lat = exec.num(*line, "latency_ms", &r[3])?;
        if b.worker(&r[1]).is_none() {
            return Err(exec.err(*line, "worker", format!("unknown worker {:?}", r[1])));
        }
        if !b.ops.iter().any(|o| o.0 == r[0]) {
            return Err(exec.err(
                *line,
                "node",
                format!("{:?} is not in logical_graph.csv", r[0]),
            ));
        }
        b.latency
            .push((r[0].clone(), r[2].clone(), r[1].clone(), lat));
    }
    for (line, r) in &msgs.rows {
        let kb = msgs.num(*line, "size_kb", &r[4])?;
        if !b.edges.iter().any(|e| e.0 == r[0] && e.1 == r[1]) {
            return Err(msgs.err(
                *line,
                "u,v",
                format!("{}→{} is not an edge of logical_graph.csv", r[0], r[1]),
            ));
        }
        b.messages
            .push((r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone(), kb));
    }
    for (csv, is_src) in [(&wlinks, false), (&slinks, true)] {
        for (line, r) in &csv.rows {
            let c = csv.num(*line, "cost", &r[2])?;
            if b.worker(&r[1]).is_none() {
                return Err(csv.err(*line, "worker", format!("unknown worker {:?}", r[1])));
            }
            if !is_src && b.worker(&r[0]).is_none() {
                return Err(csv.err(*line, "worker_a", format!("unknown worker {:?}", r[0])));
            }
            b.links.push((r[0].clone(), r[1].clone(), c, is_src));
        }
    }
    let pfile = dir
        .join("nodes_accuracy_profiles.json")
        .display()
        .to_string();
    for (i, op) in profiles.per_operator_profiles.iter().enumerate() {
        let field = format!("per_operator_profiles[{i}]");
        if !b.ops.iter().any(|o| o.0 == op.op_name) {
            return Err(PlanError::Field {
                file: pfile.clone(),
                field,
                reason: format!("operator {:?} is not in logical_graph.csv", op.op_name),
            });
        }
        b.acc_inputs.push((op.op_name.clone(), op.inputs.clone()));
        for (var, rows) in &op.acc_profile {
            let rows = rows
                .iter()
                .map(|s| AccRow {
                    inputs: s.inputs_acc.clone(),
                    output: s.output_acc,
                })
                .collect();
            b.acc.push((op.op_name.clone(), var.clone(), rows));
        }
        for (var, c) in &op.cost_profile {
            b.cost_proxy.push((op.op_name.clone(), var.clone(), *c));
        }
    }
    let e2e = profiles.end_to_end_profile.map(|e| {
        (
            e.operators,
            e.acc_profile
                .into_iter()
                .map(|r| (r.variants, r.accuracy))
                .collect(),
        )
    });
    b.build(
        dir.display().to_string(),
        &req.sink,
        req.threshold,
        settings,
        e2e,
        &pfile,
    )
}

// ------------------------------------------------------------ our file format

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    name: String,
    sink: String,
    accuracy_target: f64,
    #[serde(default)]
    settings: Option<SettingsSpec>,
    tiers: Vec<TierSpec>,
    sources: Vec<SourceSpec>,
    operators: Vec<OperatorSpec>,
    #[serde(default)]
    messages: Vec<MessageSpec>,
    #[serde(default)]
    links: Vec<LinkSpec>,
    #[serde(default)]
    end_to_end: Option<E2eSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsSpec {
    model_beam: Option<usize>,
    assign_orders: Option<usize>,
    assign_beam: Option<usize>,
    comm_scale: Option<f64>,
    latency_overestimate: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TierSpec {
    name: String,
    #[serde(default = "one")]
    locations: u32,
    workers: Vec<WorkerSpec>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkerSpec {
    name: String,
    cost_per_hour: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceSpec {
    name: String,
    rate: f64,
    /// Cost per GB from this source to a worker; absent = free.
    #[serde(default)]
    links: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorSpec {
    name: String,
    inputs: Vec<String>,
    #[serde(default)]
    ratios: BTreeMap<String, f64>,
    /// Operators whose accuracies the profile rows take, in order
    /// (default: the inputs that are operators).
    accuracy_inputs: Option<Vec<String>>,
    variants: Vec<VariantSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VariantSpec {
    name: String,
    #[serde(default)]
    cost_proxy: f64,
    latency_ms: BTreeMap<String, f64>,
    #[serde(default)]
    accuracy: Vec<AccSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccSpec {
    #[serde(default)]
    inputs: Vec<f64>,
    output: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageSpec {
    from: String,
    to: String,
    #[serde(default = "default_str")]
    from_variant: String,
    #[serde(default = "default_str")]
    to_variant: String,
    size_kb: f64,
}

fn default_str() -> String {
    "default".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkSpec {
    from: String,
    to: String,
    cost_per_gb: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct E2eSpec {
    operators: Vec<String>,
    rows: Vec<E2eRowSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct E2eRowSpec {
    variants: Vec<String>,
    accuracy: f64,
}

pub fn load_file(path: &Path) -> Result<Problem> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::File {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    let spec: FileSpec = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| PlanError::Input {
            file: file.clone(),
            line: e.line(),
            field: "json".into(),
            reason: e.to_string(),
        })?
    } else {
        toml::from_str(&text).map_err(|e| {
            let line = e.span().map_or(0, |s| {
                text[..s.start.min(text.len())].matches('\n').count() + 1
            });
            PlanError::Input {
                file: file.clone(),
                line,
                field: "toml".into(),
                reason: e.message().to_string(),
            }
        })?
    };
    let mut settings = Settings::default();
    if let Some(s) = &spec.settings {
        settings.model_beam = s.model_beam.unwrap_or(settings.model_beam);
        settings.assign_orders = s.assign_orders.unwrap_or(settings.assign_orders);
        settings.assign_beam = s.assign_beam.unwrap_or(settings.assign_beam);
        settings.comm_scale = s.comm_scale.unwrap_or(settings.comm_scale);
        settings.latency_overestimate = s
            .latency_overestimate
            .unwrap_or(settings.latency_overestimate);
    }
    let mut b = Builder::default();
    for (t, tier) in spec.tiers.iter().enumerate() {
        b.tiers.push(Tier {
            name: tier.name.clone(),
            locations: tier.locations,
        });
        for w in &tier.workers {
            b.workers.push((w.name.clone(), w.cost_per_hour, Some(t)));
        }
    }
    for (i, s) in spec.sources.iter().enumerate() {
        if !(s.rate.is_finite() && s.rate > 0.0) {
            return Err(with_line(
                PlanError::Field {
                    file: file.clone(),
                    field: format!("sources[{i}].rate"),
                    reason: format!(
                        "source {:?}: rate {} is not a positive number of inputs per second",
                        s.name, s.rate
                    ),
                },
                &text,
            ));
        }
        b.op(&s.name, Some(s.rate));
        for (w, c) in &s.links {
            b.links.push((s.name.clone(), w.clone(), *c, true));
        }
    }
    for o in &spec.operators {
        b.op(&o.name, None);
    }
    for (i, o) in spec.operators.iter().enumerate() {
        for inp in &o.inputs {
            if !b.ops.iter().any(|x| &x.0 == inp) {
                return Err(with_line(
                    PlanError::Field {
                        file: file.clone(),
                        field: format!("operators[{i}].inputs"),
                        reason: format!("unknown operator {inp:?} (not a source or an operator)"),
                    },
                    &text,
                ));
            }
            let ratio = o.ratios.get(inp).copied().unwrap_or(1.0);
            b.edges.push((inp.clone(), o.name.clone(), ratio));
        }
        let acc_inputs = o.accuracy_inputs.clone().unwrap_or_else(|| {
            o.inputs
                .iter()
                .filter(|n| spec.operators.iter().any(|x| &x.name == *n))
                .cloned()
                .collect()
        });
        b.acc_inputs.push((o.name.clone(), acc_inputs));
        for (j, v) in o.variants.iter().enumerate() {
            for (w, l) in &v.latency_ms {
                if b.worker(w).is_none() {
                    return Err(with_line(
                        PlanError::Field {
                            file: file.clone(),
                            field: format!("operators[{i}].variants[{j}].latency_ms"),
                            reason: format!("unknown worker {w:?}"),
                        },
                        &text,
                    ));
                }
                b.latency
                    .push((o.name.clone(), v.name.clone(), w.clone(), *l));
            }
            b.cost_proxy
                .push((o.name.clone(), v.name.clone(), v.cost_proxy));
            b.acc.push((
                o.name.clone(),
                v.name.clone(),
                v.accuracy
                    .iter()
                    .map(|a| AccRow {
                        inputs: a.inputs.clone(),
                        output: a.output,
                    })
                    .collect(),
            ));
        }
    }
    for m in &spec.messages {
        b.messages.push((
            m.from.clone(),
            m.to.clone(),
            m.from_variant.clone(),
            m.to_variant.clone(),
            m.size_kb,
        ));
    }
    for l in &spec.links {
        b.links
            .push((l.from.clone(), l.to.clone(), l.cost_per_gb, false));
    }
    let e2e = spec.end_to_end.map(|e| {
        (
            e.operators,
            e.rows
                .into_iter()
                .map(|r| (r.variants, r.accuracy))
                .collect(),
        )
    });
    let mut p = b
        .build(
            file.clone(),
            &spec.sink,
            spec.accuracy_target,
            settings,
            e2e,
            &file,
        )
        .map_err(|e| with_line(e, &text))?;
    p.name = if spec.name.is_empty() {
        file
    } else {
        spec.name
    };
    Ok(p)
}

/// Semantic errors in our file format name a field path; add the line
/// where the offending (quoted) name first appears, so an editor can jump there.
fn with_line(e: PlanError, text: &str) -> PlanError {
    match e {
        PlanError::Field {
            file,
            field,
            reason,
        } => {
            let needle = reason.split('"').nth(1).map(|n| format!("\"{n}\""));
            match needle.and_then(|n| text.lines().position(|l| l.contains(&n))) {
                Some(i) => PlanError::Input {
                    file,
                    line: i + 1,
                    field,
                    reason,
                },
                None => PlanError::Field {
                    file,
                    field,
                    reason,
                },
            }
        }
        other => other,
    }
}

// ------------------------------------------------------------ shared builder

type E2eRaw = (Vec<String>, Vec<(Vec<String>, f64)>);

#[derive(Default)]
struct Builder {
    workers: Vec<(String, f64, Option<usize>)>,
    tiers: Vec<Tier>,
    ops: Vec<(String, Option<f64>)>,
    edges: Vec<(String, String, f64)>,
    /// (op, variant, worker, latency)
    latency: Vec<(String, String, String, f64)>,
    messages: Vec<(String, String, String, String, f64)>,
    /// (from, to, cost per GB, from is a source)
    links: Vec<(String, String, f64, bool)>,
    acc_inputs: Vec<(String, Vec<String>)>,
    acc: Vec<(String, String, Vec<AccRow>)>,
    cost_proxy: Vec<(String, String, f64)>,
}

impl Builder {
    fn op(&mut self, name: &str, rate: Option<f64>) {
        match self.ops.iter_mut().find(|o| o.0 == name) {
            Some(o) => o.1 = o.1.or(rate),
            None => self.ops.push((name.to_string(), rate)),
        }
    }

    fn worker(&self, name: &str) -> Option<usize> {
        self.workers.iter().position(|w| w.0 == name)
    }

    fn build(
        self,
        file: String,
        sink: &str,
        target: f64,
        settings: Settings,
        e2e: Option<E2eRaw>,
        profile_file: &str,
    ) -> Result<Problem> {
        let invalid = |field: &str, reason: String| PlanError::Field {
            file: file.clone(),
            field: field.into(),
            reason,
        };
        let mut workers = Vec::new();
        for (name, cost, tier) in &self.workers {
            let tier = tier
                .ok_or_else(|| invalid("tiers", format!("worker {name:?} belongs to no tier")))?;
            if cost.is_nan() || *cost < 0.0 {
                return Err(invalid(
                    "workers",
                    format!("worker {name:?} has a negative cost"),
                ));
            }
            workers.push(Worker {
                name: name.clone(),
                tier,
                cost_per_hour: *cost,
            });
        }
        let op_idx = |n: &str| self.ops.iter().position(|o| o.0 == n);
        let mut operators: Vec<Operator> = Vec::new();
        for (name, rate) in &self.ops {
            let kind = if rate.is_some() {
                OpKind::Source
            } else {
                OpKind::Compute
            };
            let mut variants: Vec<Variant> = Vec::new();
            if kind == OpKind::Compute {
                for (_, var, _, _) in self.latency.iter().filter(|l| &l.0 == name) {
                    if !variants.iter().any(|v| &v.name == var) {
                        variants.push(Variant {
                            name: var.clone(),
                            cost_proxy: 0.0,
                            latency_ms: vec![None; workers.len()],
                            acc: Vec::new(),
                        });
                    }
                }
                if variants.is_empty() {
                    return Err(invalid(
                        "execution profile",
                        format!("operator {name:?} has no latency profile on any worker"),
                    ));
                }
                for (_, var, w, l) in self.latency.iter().filter(|l| &l.0 == name) {
                    let v = variants
                        .iter_mut()
                        .find(|v| &v.name == var)
                        .expect("variant inserted above");
                    let wi = workers
                        .iter()
                        .position(|x| &x.name == w)
                        .expect("workers checked while reading");
                    if l.is_nan() || *l <= 0.0 {
                        return Err(invalid(
                            "latency_ms",
                            format!("{name}/{var} on {w}: latency must be positive"),
                        ));
                    }
                    v.latency_ms[wi] = Some(*l);
                }
                for (_, var, c) in self.cost_proxy.iter().filter(|c| &c.0 == name) {
                    if let Some(v) = variants.iter_mut().find(|v| &v.name == var) {
                        v.cost_proxy = *c;
                    }
                }
                for (_, var, rows) in self.acc.iter().filter(|a| &a.0 == name) {
                    match variants.iter_mut().find(|v| &v.name == var) {
                        Some(v) => v.acc = rows.clone(),
                        None => {
                            return Err(PlanError::Field {
                                file: profile_file.to_string(),
                                field: format!("{name}.acc_profile.{var}"),
                                reason: format!("variant {var:?} has no latency profile"),
                            })
                        }
                    }
                }
            }
            operators.push(Operator {
                name: name.clone(),
                kind,
                rate: *rate,
                variants,
                acc_inputs: Vec::new(),
            });
        }
        for (name, inputs) in &self.acc_inputs {
            let v = op_idx(name).expect("operator exists");
            let mut idx = Vec::new();
            for i in inputs {
                let u = op_idx(i).ok_or_else(|| {
                    invalid(&format!("{name}.inputs"), format!("unknown operator {i:?}"))
                })?;
                idx.push(u);
            }
            for var in &operators[v].variants {
                if let Some(r) = var.acc.iter().find(|r| r.inputs.len() != idx.len()) {
                    return Err(PlanError::Field {
                        file: profile_file.to_string(),
                        field: format!("{name}.acc_profile.{}", var.name),
                        reason: format!(
                            "a row has {} input accuracies but the operator has {} accuracy inputs",
                            r.inputs.len(),
                            idx.len()
                        ),
                    });
                }
            }
            operators[v].acc_inputs = idx;
        }
        let mut edges = Vec::new();
        for (u, v, ratio) in &self.edges {
            let from =
                op_idx(u).ok_or_else(|| invalid("edges", format!("unknown operator {u:?}")))?;
            let to =
                op_idx(v).ok_or_else(|| invalid("edges", format!("unknown operator {v:?}")))?;
            if operators[to].kind == OpKind::Source {
                return Err(invalid("edges", format!("source {v:?} cannot have inputs")));
            }
            edges.push(Edge {
                from,
                to,
                ratio: *ratio,
            });
        }
        let mut message_kb = HashMap::new();
        for (u, v, uv, vv, kb) in &self.messages {
            let e = edges
                .iter()
                .position(|e| operators[e.from].name == *u && operators[e.to].name == *v)
                .ok_or_else(|| invalid("messages", format!("{u}→{v} is not an edge")))?;
            message_kb.insert((e, uv.clone(), vv.clone()), *kb);
        }
        let mut source_links = HashMap::new();
        let mut worker_links = HashMap::new();
        for (a, b, c, is_src) in &self.links {
            let w = workers
                .iter()
                .position(|x| &x.name == b)
                .ok_or_else(|| invalid("links", format!("unknown worker {b:?}")))?;
            if *is_src {
                let s = op_idx(a)
                    .filter(|&s| operators[s].kind == OpKind::Source)
                    .ok_or_else(|| invalid("links", format!("{a:?} is not a source")))?;
                source_links.insert((s, w), *c);
            } else {
                let x = workers
                    .iter()
                    .position(|x| &x.name == a)
                    .ok_or_else(|| invalid("links", format!("unknown worker {a:?}")))?;
                worker_links.insert((x, w), *c);
            }
        }
        let sink =
            op_idx(sink).ok_or_else(|| invalid("sink", format!("unknown operator {sink:?}")))?;
        let end_to_end = match e2e {
            None => None,
            Some((ops, rows)) => {
                let idx: Vec<usize> = ops
                    .iter()
                    .map(|o| {
                        op_idx(o).ok_or_else(|| {
                            invalid("end_to_end.operators", format!("unknown operator {o:?}"))
                        })
                    })
                    .collect::<Result<_>>()?;
                let mut out = Vec::new();
                for (vars, acc) in rows {
                    if vars.len() != idx.len() {
                        return Err(invalid(
                            "end_to_end",
                            format!(
                                "row {vars:?} has {} variants for {} operators",
                                vars.len(),
                                idx.len()
                            ),
                        ));
                    }
                    let mut vi = Vec::new();
                    for (o, name) in idx.iter().zip(&vars) {
                        let m = operators[*o]
                            .variants
                            .iter()
                            .position(|v| &v.name == name)
                            .ok_or_else(|| {
                                invalid(
                                    "end_to_end",
                                    format!(
                                        "operator {} has no variant {name:?}",
                                        operators[*o].name
                                    ),
                                )
                            })?;
                        vi.push(m);
                    }
                    out.push((vi, acc));
                }
                Some(EndToEnd {
                    ops: idx,
                    rows: out,
                })
            }
        };
        let p = Problem {
            name: file.clone(),
            operators,
            edges,
            workers,
            tiers: self.tiers,
            sink,
            accuracy_target: target,
            source_links,
            worker_links,
            message_kb,
            end_to_end,
            settings,
            rates_cache: Default::default(),
        };
        if p.topo_order().len() != p.operators.len() {
            return Err(invalid("edges", "the workflow graph has a cycle".into()));
        }
        if p.tiers.is_empty() || p.workers.is_empty() {
            return Err(invalid("tiers", "no workers".into()));
        }
        Ok(p)
    }
}
