//! `sluice-bench`: Sluice's benchmarks, each next to a baseline measured
//! in the same run (a raw loopback TCP exchange, redis-server, etcd).
//! Its own binary, so the product (`sluice`) carries no benchmark peers
//! (HTTP/2 for etcd's gRPC, RESP); `sluice bench ...` runs this binary.
//!
//! Modules: `harness` (node processes, histograms, drivers, report),
//! `peers` (what is measured and compared with), `procs` (a local
//! cluster), `etcd`, and the benchmarks: `single` (one node),
//! `cluster`, `broadcast` and `streams`. Each depends only on those before it in this
//! list.

mod broadcast;
mod children;
mod cluster;
mod etcd;
mod harness;
mod marks;
mod peers;
mod policy;
mod procs;
mod single;
mod streams;
mod tls;

use anyhow::Result;
use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "Sluice's benchmarks (HDR histograms, open and closed loop), each next to a baseline measured in the same run"
)]
struct Cli {
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    #[command(flatten)]
    pub core: CoreArgs,
}

#[derive(clap::Subcommand)]
pub enum BenchWhat {
    /// put/get/trigger_put latency and throughput (the default).
    Core(CoreArgs),
    /// RSS of a node holding many objects.
    Memory(MemoryArgs),
    /// Optimizer time of `sluice plan` on generated instances.
    Plan(PlanBenchArgs),
    /// No-op lambda pipelines of 1..4 relay stages (Cascade's Fig. 7).
    Pipeline(PipelineArgs),
    /// Persistent pools: durable puts, time reads, recovery, next to etcd.
    Persistent(PersistentArgs),
    /// Replicated shards of 1, 3 and 5 nodes (real processes) next to
    /// redis-server with two replicas and WAIT 2, and failover time.
    Cluster(cluster::ClusterBenchArgs),
    /// One object to 2..N node processes with every node's outgoing
    /// bandwidth limited: pipelined chain, binary tree and one-to-each,
    /// next to a single transfer.
    Broadcast(broadcast::BroadcastBenchArgs),
    /// Streams (EdgeServe): lazy vs eager working time with skipped
    /// frames, a bandwidth-limited broker link, publish latency vs size
    /// and the measured lazy/eager break-even (node processes).
    Streams(streams::StreamsBenchArgs),
    /// The Python client next to the Rust client (get latency, asyncio put
    /// throughput), one node, one run: runs `python -m sluice.bench`.
    Python(PythonBenchArgs),
    /// Python lambdas next to Rust's relay (no-op stage at 10 KB and 1 MB),
    /// worker scaling, and optionally a Ray actor call: runs `python -m
    /// sluice.bench_udl` against a node whose lambdas use that Python.
    PythonUdl(PythonUdlBenchArgs),
    /// Python lambdas on a GPU: a 1 MB object from a trigger put to a
    /// CUDA tensor next to pinned and pageable cudaMemcpy, and batch-1
    /// ResNet-18 in a lambda next to the model called directly: runs
    /// `python -m sluice.bench_gpu` (needs PyTorch and a CUDA device).
    PythonGpu(PythonGpuBenchArgs),
    /// TLS next to plaintext: put/get p50 with one client and throughput
    /// with many, two node processes measured in turns.
    Tls(tls::TlsArgs),
    /// Policies (issue #19): access rules and rate limits enabled but not
    /// triggered next to an open node; QoS (mRPC Table 3.4); a rate limit
    /// changed live under load on a 3-node cluster (Fig. 3.7).
    Policy(policy::PolicyArgs),
}

#[derive(clap::Args)]
pub struct PythonUdlBenchArgs {
    /// The Python with the `sluice` package (and, for --ray, ray).
    #[arg(long)]
    pub python: Option<String>,
    /// Calls per size and variant.
    #[arg(long, default_value_t = 2000)]
    pub n: usize,
    /// Also measure a Ray actor call carrying 10 KB.
    #[arg(long)]
    pub ray: bool,
}

#[derive(clap::Args)]
pub struct PythonGpuBenchArgs {
    /// The Python with the `sluice` package, PyTorch and torchvision.
    #[arg(long)]
    pub python: Option<String>,
    /// Calls per variant.
    #[arg(long, default_value_t = 1000)]
    pub n: usize,
    /// The torch device (default: cuda; `cpu` tries the benchmark
    /// without a GPU, its figures mean nothing).
    #[arg(long)]
    pub device: Option<String>,
}

#[derive(clap::Args)]
pub struct PythonBenchArgs {
    /// The Python with the `sluice` package installed (`pip install
    /// ./crates/sluice-py`); default $SLUICE_PYTHON, else python3.
    #[arg(long)]
    pub python: Option<String>,
    /// Benchmark this running node instead of starting one.
    #[arg(long)]
    pub server: Option<String>,
    /// Gets per client.
    #[arg(long, default_value_t = 20000)]
    pub gets: usize,
    /// Seconds of puts per client.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
}

/// The Python that runs the Python benchmarks (and their lambdas).
fn python_of(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("SLUICE_PYTHON").ok())
        .unwrap_or_else(|| "python3".into())
}

/// Runs `python -m module args...` (with `--json` when asked).
fn run_python_bench(python: &str, module: &str, args: &[String], json: bool) -> Result<()> {
    let mut cmd = children::command(python);
    cmd.args(["-m", module]).args(args);
    if json {
        cmd.arg("--json");
    }
    let status = cmd
        .status()
        .map_err(|e| anyhow::anyhow!("running {python}: {e}"))?;
    anyhow::ensure!(
        status.success(),
        "{python} -m {module} failed ({status}); is the package installed in that Python (`pip install ./crates/sluice-py`)?"
    );
    Ok(())
}

/// `sluice bench python`: a node, then the Python side's own benchmark
/// (it measures the Rust client from the same process).
fn python_bench(a: PythonBenchArgs, json: bool) -> Result<()> {
    let node = match &a.server {
        Some(_) => None,
        None => Some(harness::ChildNode::start(&[])?),
    };
    let addr = a
        .server
        .clone()
        .or_else(|| node.as_ref().map(|n| n.addr.clone()))
        .unwrap_or_default();
    let args = [
        "--addr".to_string(),
        addr,
        "--gets".into(),
        a.gets.to_string(),
        "--seconds".into(),
        a.seconds.to_string(),
    ];
    run_python_bench(&python_of(a.python), "sluice.bench", &args, json)
}

/// `sluice bench python-udl`: a node running lambdas in `python`, then
/// the Python side's benchmark.
fn python_udl_bench(a: PythonUdlBenchArgs, json: bool) -> Result<()> {
    let mut args = vec!["--n".to_string(), a.n.to_string()];
    if a.ray {
        args.push("--ray".into());
    }
    python_lambda_bench(a.python, "sluice.bench_udl", args, json)
}

/// `sluice bench python-gpu`: as `python-udl`, with the GPU benchmark.
fn python_gpu_bench(a: PythonGpuBenchArgs, json: bool) -> Result<()> {
    let mut args = vec!["--n".to_string(), a.n.to_string()];
    if let Some(d) = a.device {
        args.extend(["--device".to_string(), d]);
    }
    python_lambda_bench(a.python, "sluice.bench_gpu", args, json)
}

/// A node whose lambdas run in `python`, then `python -m module --addr
/// <node> args...`.
fn python_lambda_bench(
    python: Option<String>,
    module: &str,
    args: Vec<String>,
    json: bool,
) -> Result<()> {
    let python = python_of(python);
    // The node's lambdas run in the same Python (SLUICE_PYTHON).
    std::env::set_var("SLUICE_PYTHON", &python);
    let node = harness::ChildNode::start(&[])?;
    let mut all = vec!["--addr".to_string(), node.addr.clone()];
    all.extend(args);
    run_python_bench(&python, module, &all, json)
}

#[derive(clap::Args, Clone)]
pub struct PersistentArgs {
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "10240,1048576")]
    pub sizes: Vec<usize>,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    pub duration_ms: u64,
    /// Concurrent clients in the throughput phase.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Size of the log written for the recovery measurement, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub recovery_mib: u64,
    /// Shard sizes: 1 is a standalone node (every sync policy), 3 a
    /// cluster of three node processes replicating one persistent shard.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub shard_sizes: Vec<u32>,
    /// `[persistent] sync` of the 3-node cluster (in a cluster, `always`
    /// and `batch` both fsync the consensus log through its group-commit
    /// thread; `never` leaves it to the OS).
    #[arg(long, default_value = "always")]
    pub cluster_sync: String,
    /// Skip the 3-member etcd comparison.
    #[arg(long)]
    pub no_etcd: bool,
    /// Tokio worker threads per cluster node (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub node_threads: usize,
    /// TOML lines added to every cluster node's `[cluster]` section (e.g.
    /// "peer_bulk_bytes = 0"), to measure a setting.
    #[arg(long, default_value = "")]
    pub cluster_config: String,
}

#[derive(clap::Args, Clone)]
pub struct PipelineArgs {
    /// Benchmark this running node instead of starting one.
    #[arg(long)]
    pub server: Option<String>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "10240,1048576")]
    pub sizes: Vec<usize>,
    /// Most relay stages.
    #[arg(long, default_value_t = 4)]
    pub max_stages: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 1500)]
    pub duration_ms: u64,
    /// Requests in flight in the throughput phase.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
}

#[derive(clap::Args, Clone)]
pub struct PlanBenchArgs {
    /// Worker counts to generate (the paper's small..xlarge).
    #[arg(long, value_delimiter = ',', default_value = "5,9,15,30")]
    pub workers: Vec<usize>,
    /// Instances per size.
    #[arg(long, default_value_t = 20)]
    pub instances: u64,
    /// Run the exhaustive search up to this many workers, for the optimality gap.
    #[arg(long, default_value_t = 9)]
    pub exhaustive_max_workers: usize,
}

#[derive(clap::Args, Clone)]
pub struct CoreArgs {
    /// Benchmark this running node instead of starting one.
    #[arg(long)]
    pub server: Option<String>,
    /// Value sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "1024,10240,1048576")]
    pub sizes: Vec<usize>,
    /// Operations to measure: put, get, trigger.
    #[arg(long, value_delimiter = ',', default_value = "put,get,trigger")]
    pub ops: Vec<String>,
    /// Concurrent clients (one connection each) in the throughput phase.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Length of each measurement phase.
    #[arg(long, default_value_t = 2000)]
    pub duration_ms: u64,
    /// Open-loop rate in ops/s (0: half the closed-loop single-client rate).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Also measure redis-server at this address (SET/GET) with the same harness.
    #[arg(long)]
    pub redis: Option<String>,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

#[derive(clap::Args, Clone)]
pub struct MemoryArgs {
    #[arg(long, default_value_t = 1_000_000)]
    pub objects: u64,
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Then put this many new values per object to random keys (as a
    /// cache is written) and measure again (0: skip).
    #[arg(long, default_value_t = 0.0)]
    pub overwrites: f64,
    /// A volatile shard replicated on this many node processes (1: a
    /// standalone node); the RSS reported is the largest member's.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
}

pub fn run(a: BenchArgs, json: bool) -> Result<()> {
    match a.what {
        Some(BenchWhat::Memory(m)) => single::memory(m, json),
        Some(BenchWhat::Plan(p)) => single::plan_bench(p, json),
        Some(BenchWhat::Pipeline(p)) => single::pipeline_bench(p, json),
        Some(BenchWhat::Persistent(p)) => single::persistent_bench(p, json),
        Some(BenchWhat::Cluster(c)) => cluster::run(c, json),
        Some(BenchWhat::Broadcast(b)) => broadcast::run(b, json),
        Some(BenchWhat::Streams(s)) => streams::run(s, json),
        Some(BenchWhat::Core(c)) => single::core(c, json),
        Some(BenchWhat::Python(p)) => python_bench(p, json),
        Some(BenchWhat::PythonUdl(p)) => python_udl_bench(p, json),
        Some(BenchWhat::PythonGpu(p)) => python_gpu_bench(p, json),
        Some(BenchWhat::Tls(t)) => tls::run(t, json),
        Some(BenchWhat::Policy(p)) => policy::run(p, json),
        None => single::core(a.core, json),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    children::sweep_stale();
    match run(cli.bench, cli.json) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
