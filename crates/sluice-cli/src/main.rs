//! `sluice`: the one binary. `serve` runs a node; the client commands talk
//! to one; `shell` is an interactive prompt; `bench` measures; `demo` runs
//! the demo pipeline on an embedded node; `plan` plans deployments.

mod bench;
mod commands;
mod demo;
mod dev;
mod dump;
mod fsck;
mod layout;
mod place;
mod plan;
mod policy;
mod serve;
mod shell;
mod stream;
mod tls;
mod top;

use clap::{parser::ValueSource, ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Sluice: AI inference pipelines next to their data"
)]
struct Cli {
    /// Node(s) to talk to: host:port (a host alone: port 7420), or several comma-separated (tried in
    /// order; in a cluster any live one will do). Default: the addresses in
    /// ./sluice-dev/endpoints when `sluice dev` left one here, else
    /// 127.0.0.1:7420.
    #[arg(long, global = true, env = "SLUICE_ADDR")]
    addr: Option<String>,
    /// Print machine-readable JSON instead of human output.
    #[arg(long, global = true)]
    json: bool,
    /// Print values as they are, bytes and all (the default when standard
    /// output is not a terminal; on a terminal binary values are escaped).
    #[arg(long, global = true)]
    raw: bool,
    /// TLS: the CA that signed the nodes' certificates (nodes with `[tls]`
    /// accept nothing else).
    #[arg(long, global = true, env = "SLUICE_TLS_CA", value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// TLS: this client's certificate, for nodes that require one.
    #[arg(long, global = true, env = "SLUICE_TLS_CERT", value_name = "FILE")]
    tls_cert: Option<std::path::PathBuf>,
    /// TLS: the private key of --tls-cert.
    #[arg(long, global = true, env = "SLUICE_TLS_KEY", value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// A bearer token (`sluice auth create`): the principal this command
    /// acts as where nodes enforce policies.
    #[arg(
        long,
        global = true,
        env = "SLUICE_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Per-request timeout in milliseconds.
    #[arg(long, global = true, default_value_t = 10_000)]
    timeout_ms: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a node (defaults: 127.0.0.1:7420, ./sluice-data, pools /vol and /trig).
    Serve(serve::ServeArgs),
    /// Interactive prompt: type client commands without the `sluice` prefix.
    Shell,
    /// Benchmarks (core, memory, pipeline, persistent, plan, cluster,
    /// broadcast, python), each next to a baseline: runs the `sluice-bench`
    /// binary (see `sluice bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments for `sluice-bench`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Start a local cluster of N real node processes (Ctrl-C stops it).
    Dev(dev::DevArgs),
    /// Run the demo pipeline (ONNX filter -> classifier -> store) on an embedded node.
    Demo(demo::DemoArgs),
    /// Check a stopped node's logs for damage (dry run); --repair fixes it.
    Fsck(fsck::FsckArgs),
    /// Choose models and workers for an inference workflow at minimum cost.
    Plan(plan::PlanArgs),
    /// Place replicas of a model's parts to survive node failures (Lazarus).
    Place(place::PlaceArgs),
    /// Cluster layouts: import Cascade's layout.json.
    #[command(subcommand)]
    Layout(layout::LayoutCmd),
    /// Streams from the edge: publish items, subscribe to a topic.
    #[command(subcommand)]
    Stream(stream::StreamCmd),
    /// Live view of nodes from their metrics endpoints (`serve --metrics`):
    /// ops/s and p50/p99 per operation, busiest pools and lambdas, Raft lag.
    Top(top::TopArgs),
    /// Shared queues: competing consumers, each item to one of them.
    #[command(subcommand)]
    Queue(stream::QueueCmd),
    /// Write a pool's objects (`/`: every pool's) to a file that `sluice
    /// load` puts back: a logical backup, or a copy to another cluster.
    Dump(dump::DumpArgs),
    /// Put back what `sluice dump` wrote: the pools it names that are
    /// missing, then every object (new versions; a dump cut short is
    /// refused before anything is written).
    Load(dump::LoadArgs),
    #[command(flatten)]
    Client(commands::ClientCmd),
}

/// Where `sluice dev` (run in this directory with its default --dir)
/// leaves its nodes' addresses for client commands to find.
pub(crate) const DEV_ENDPOINTS: &str = "sluice-dev/endpoints";
/// ... and, with `--metrics-base`, their metrics addresses for `sluice top`.
pub(crate) const DEV_METRICS: &str = "sluice-dev/metrics";

fn default_addr() -> String {
    std::fs::read_to_string(DEV_ENDPOINTS)
        .ok()
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(","))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("127.0.0.1:{}", sluice_server::DEFAULT_PORT))
}

/// The options that say how to reach a node, by their flags.
const CLIENT_OPTIONS: [(&str, &str); 7] = [
    ("addr", "--addr"),
    ("tls_ca", "--tls-ca"),
    ("tls_cert", "--tls-cert"),
    ("tls_key", "--tls-key"),
    ("token", "--token"),
    ("timeout_ms", "--timeout-ms"),
    ("raw", "--raw"),
];

/// Client options typed on the command line of a command that runs or
/// reads a node itself, where a user may take them for its own settings
/// (they would be ignored: `serve --addr` listened on the default port,
/// `serve --tls-cert` served plaintext, `dev --addr` started its nodes on
/// the default ports, `fsck --addr` checked the local data directory). What is set in the environment (`SLUICE_ADDR`, ...)
/// is for the client commands and is left alone.
fn misplaced_client_option(cmd: &Cmd, m: &ArgMatches) -> Option<String> {
    let name = match cmd {
        Cmd::Serve(_) => "serve",
        Cmd::Dev(_) => "dev",
        Cmd::Demo(_) => "demo",
        Cmd::Fsck(_) => "fsck",
        Cmd::Top(_) => "top",
        Cmd::Layout(_) => "layout",
        Cmd::Place(_) => "place",
        _ => return None,
    };
    let (_, instead) = NODE_COMMANDS.iter().find(|(n, _)| *n == name)?;
    let given: Vec<&str> = CLIENT_OPTIONS
        .iter()
        .filter(|(id, _)| m.value_source(id) == Some(ValueSource::CommandLine))
        .map(|(_, flag)| *flag)
        .collect();
    (!given.is_empty()).then(|| {
        format!(
            "`sluice {name}` takes no {} (options of the commands that talk to a node): {instead}",
            given.join(", ")
        )
    })
}

/// The commands that run or read a node themselves, read its metrics
/// endpoint or talk to no node, and refuse the client's options (`misplaced_client_option`):
/// each with where its own settings go instead.
const NODE_COMMANDS: [(&str, &str); 7] = [
    (
        "serve",
        "a node listens where --listen (or the config's `listen`) says, serves TLS from its config's [tls] section and is policed by `sluice policy`",
    ),
    (
        "dev",
        "its nodes listen on --base-port and the ports after it (or at its --layout's addresses), and with --tls it makes its own CA and certificates",
    ),
    ("demo", "the demo runs its own embedded node"),
    ("fsck", "fsck reads a stopped node's files (--data-dir)"),
    (
        "top",
        "top reads the nodes' metrics endpoints (--metrics; by itself where `sluice dev --metrics-base` runs)",
    ),
    (
        "layout",
        "layout converts files and talks to no node",
    ),
    (
        "place",
        "place computes placements from its input file and talks to no node",
    ),
];

/// The command line: `Cli` with the client's options (global, so every
/// command's help listed them) hidden from the help of the commands that
/// refuse them.
fn command() -> clap::Command {
    let mut cmd = Cli::command();
    let client: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| CLIENT_OPTIONS.iter().any(|(id, _)| a.get_id() == *id))
        .cloned()
        .collect();
    for (name, _) in NODE_COMMANDS {
        // A hidden copy in the subcommand: the global option is then not
        // added to it, and a value given there still reaches the top
        // level's matches, where it is refused.
        cmd = cmd.mut_subcommand(name, |sub| with_hidden(sub, &client));
    }
    cmd
}

/// `cmd` and each of its subcommands (`layout import`) with hidden copies
/// of `args`.
fn with_hidden(mut cmd: clap::Command, args: &[clap::Arg]) -> clap::Command {
    for a in args {
        cmd = cmd.arg(a.clone().global(false).hide(true));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for n in names {
        cmd = cmd.mut_subcommand(n, |sub| with_hidden(sub, args));
    }
    cmd
}

fn main() -> ExitCode {
    let matches = command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(e) = misplaced_client_option(&cli.cmd, &matches) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    // `sluice dev`'s TLS files serve commands aimed at its nodes: no
    // --addr, or one of the addresses it listed.
    let dev_default = std::fs::read_to_string(DEV_ENDPOINTS).is_ok_and(|eps| {
        cli.addr.as_deref().is_none_or(|a| {
            a.split(',')
                .all(|x| eps.split_whitespace().any(|e| e == x.trim()))
        })
    });
    let addr = cli.addr.take().unwrap_or_else(default_addr);
    if let Err(e) = tls::init(
        cli.tls_ca.take(),
        cli.tls_cert.take(),
        cli.tls_key.take(),
        dev_default,
    ) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    tls::init_token(cli.token.take());
    commands::escape_values(!cli.raw && std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let result = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Bench { args } => bench::run(&args, cli.json),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Dev(a) => dev::run(a),
        Cmd::Plan(a) => plan::run(a, &addr, cli.timeout_ms, cli.json),
        Cmd::Layout(c) => layout::run(c, cli.json),
        Cmd::Place(a) => place::run(a, cli.json),
        Cmd::Fsck(a) => fsck::run(a, cli.json),
        Cmd::Stream(c) => stream::run_stream(&addr, cli.timeout_ms, cli.json, c),
        Cmd::Queue(c) => stream::run_queue(&addr, cli.timeout_ms, c),
        Cmd::Dump(a) => commands::connect(&addr, cli.timeout_ms)
            .and_then(|c| dump::dump(&c, &addr, a, cli.json)),
        Cmd::Load(a) => {
            commands::connect(&addr, cli.timeout_ms).and_then(|c| dump::load(&c, a, cli.json))
        }
        Cmd::Top(a) => top::run(a, cli.json),
        Cmd::Shell => shell::run(&addr, cli.timeout_ms, cli.json),
        Cmd::Client(c) => commands::run_once(&addr, cli.timeout_ms, cli.json, c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`sluice history K | head`):
        // nothing to say, as `cat` says nothing; the shell's status for a
        // pipe's writer ended by it.
        Err(e) if broken_pipe(&e) => ExitCode::from(141),
        // Under --json an error is JSON too (on standard error): the
        // message, and the typed error when there is one (its `error`
        // field names the kind, e.g. "not_found").
        Err(e) if cli.json => {
            let typed = e
                .chain()
                .find_map(|c| c.downcast_ref::<sluice_client::SluiceError>());
            let j = serde_json::json!({
                "message": format!("{e:#}"),
                "error": typed.and_then(|t| serde_json::to_value(t).ok()),
            });
            eprintln!("{j}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `e` is a write to a pipe whose reader has gone.
fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `sluice ...` command line in the README's and ARCHITECTURE's
    /// shell blocks parses as written (a renamed flag or command takes
    /// the docs along), and none gives a command an option it refuses.
    #[test]
    fn the_docs_command_lines_parse() {
        let mut checked = 0;
        let mut wrong = Vec::new();
        for (doc, text) in [
            ("README.md", include_str!("../../../README.md")),
            ("ARCHITECTURE.md", include_str!("../../../ARCHITECTURE.md")),
        ] {
            for block in text.split("```sh\n").skip(1) {
                let block = block.split("```").next().unwrap();
                let commands = block
                    .lines()
                    .flat_map(|l| l.split(" #").next().unwrap().split(';'));
                for cmd in commands {
                    // The command, without a trailing comment or `&`.
                    let cmd = cmd.trim().trim_end_matches('&').trim();
                    let Some(args) = cmd.strip_prefix("sluice ") else {
                        continue;
                    };
                    // Lines that need a shell (variables, pipes,
                    // redirections, placeholders) are left out.
                    if args.contains(['$', '|', '<', '>', '`', '\\']) || args.contains("...") {
                        continue;
                    }
                    let words = shell::split_words(args).unwrap();
                    let m = command()
                        .try_get_matches_from(std::iter::once("sluice".to_string()).chain(words));
                    let m = match m {
                        Ok(m) => m,
                        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => continue,
                        Err(e) => {
                            let e = e.to_string();
                            wrong.push(format!("{doc}: `{cmd}`: {}", e.lines().next().unwrap()));
                            continue;
                        }
                    };
                    let cli = Cli::from_arg_matches(&m).unwrap();
                    if misplaced_client_option(&cli.cmd, &m).is_some() {
                        wrong.push(format!(
                            "{doc}: `{cmd}` gives a command an option it refuses"
                        ));
                    }
                    checked += 1;
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(checked > 80, "only {checked} command lines found");
    }

    /// `serve --help` (and dev's, demo's, fsck's) listed --addr, --tls-*
    /// and --token, which those commands refuse: hidden there, shown on
    /// the client commands.
    #[test]
    fn node_commands_do_not_offer_the_client_options() {
        let mut cmd = command();
        // As parsing does: the globals reach the subcommands.
        cmd.build();
        for (name, _) in NODE_COMMANDS {
            let help = cmd
                .find_subcommand_mut(name)
                .unwrap()
                .render_long_help()
                .to_string();
            for (_, flag) in CLIENT_OPTIONS {
                assert!(!help.contains(flag), "{name} --help offers {flag}:\n{help}");
            }
        }
        let help = cmd
            .find_subcommand_mut("get")
            .unwrap()
            .render_long_help()
            .to_string();
        for (_, flag) in CLIENT_OPTIONS {
            assert!(help.contains(flag), "get --help lacks {flag}:\n{help}");
        }
    }

    /// Every option and argument of every command says what it takes in
    /// `--help` (`history --from-time`, `get --at`, `ls --prefix`, `serve
    /// --node-id` and others printed a bare flag: was `--at` µs or
    /// seconds, `--to-version` inclusive?; `pools create`'s `<PATH>`,
    /// `get-by-time`'s `<TIMESTAMP_US>` and 40 other arguments were a
    /// bare name under "Arguments:").
    #[test]
    fn every_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, bare: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    match a.get_long() {
                        Some(long) => bare.push(format!("{path} --{long}")),
                        None => bare.push(format!("{path} <{}>", a.get_id())),
                    }
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), bare);
            }
        }
        let mut bare = Vec::new();
        walk(&command(), "sluice", &mut bare);
        walk(&shell::command(), "sluice shell:", &mut bare);
        assert!(bare.is_empty(), "options without help: {bare:#?}");
    }
}
