//! `sluice dump` and `sluice load`: a pool's objects to a file and back,
//! through the client (so from any node of a cluster, as any principal
//! allowed to read, then to create pools and write).
//!
//! The format (version 1) is a line of JSON per record; an object's line
//! is followed by its value's bytes as they are and a newline, so text
//! stays readable and binary values (models, tensors) take no more room
//! than they hold:
//!
//! ```text
//! {"sluice_dump":1,"from":"127.0.0.1:7420","created_us":...}
//! {"pool":{"pathname":"/p","pool_type":"persistent",...}}       a PoolSpec
//! {"key":"/p/a","version":3,"timestamp_us":...,"size":5}
//! hello
//! {"key":"/p/a","version":4,"timestamp_us":...,"removed":true}  a remove (--history)
//! {"end":{"pools":1,"objects":2,"bytes":5}}
//! ```
//!
//! The last line counts what came before it: a dump cut short (a full
//! disk, a killed process) is refused as such, before anything is loaded
//! from a file. Versions and timestamps are the dumped ones, for
//! reference: a load's puts get new ones from the shards they land on.

use crate::commands::counted;
use anyhow::{bail, Context, Result};
use serde_json::json;
use sluice_client::{BlockingClient, PoolMeta, PoolSpec, PoolType};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The format's version, in the first line.
const FORMAT: u64 = 1;

#[derive(clap::Args)]
pub struct DumpArgs {
    /// The pool to dump (`/vol`), or `/` for every pool.
    pool: String,
    /// Write the dump to this file (default: standard output).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Persistent pools: every version each key keeps, oldest first,
    /// removes included (a load replays them in order). Default: the
    /// latest version of each key.
    #[arg(long)]
    history: bool,
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// A file `sluice dump` wrote, or `-` for standard input.
    file: String,
}

/// What a dump or a load went through.
#[derive(Default, serde::Serialize)]
struct Counts {
    pools: u64,
    objects: u64,
    bytes: u64,
}

/// Progress on standard error once a second, for long runs.
struct Progress {
    what: &'static str,
    next: Instant,
}

impl Progress {
    fn new(what: &'static str) -> Self {
        Progress {
            what,
            next: Instant::now() + Duration::from_secs(1),
        }
    }

    fn tick(&mut self, n: &Counts) {
        if Instant::now() >= self.next {
            eprintln!(
                "{} {} objects ({} bytes) ...",
                self.what, n.objects, n.bytes
            );
            self.next = Instant::now() + Duration::from_secs(1);
        }
    }
}

fn spec_of(p: &PoolMeta) -> PoolSpec {
    PoolSpec {
        pathname: p.pathname.clone(),
        pool_type: Some(p.pool_type),
        subgroup_index: p.subgroup_index,
        affinity_set_regex: p.affinity_set_regex.clone(),
        object_locations: p.object_locations.clone(),
        retention: p.retention.clone(),
        ..Default::default()
    }
}

/// Versions per history request (and values held in memory at once).
const PAGE: u32 = 64;
/// Value bytes held in memory at once (a node's replies are cut at
/// 64 MiB of values too).
const WINDOW_BYTES: usize = 64 << 20;

/// Every version of `key`, oldest first, with a window of values in
/// memory at a time: the key's versions and their sizes first (pages come
/// newest first), then the values in windows of at most a page or
/// `WINDOW_BYTES` each, oldest first. A page or window the node cut short
/// is asked for again below its oldest version: none is left out (pages
/// shorter than asked for ended the walk, and would have lost versions
/// once replies were cut by size).
fn dump_history(
    c: &BlockingClient,
    key: &str,
    w: &mut dyn Write,
    n: &mut Counts,
    progress: &mut Progress,
) -> Result<()> {
    let mut versions = Vec::new();
    let mut to = u64::MAX;
    loop {
        let (page, more) = c.history_page(key, false, 0, to, PAGE)?;
        versions.extend(page.iter().map(|o| (o.meta.version, o.value.len())));
        match page.last() {
            Some(o) if more && o.meta.version > 0 => to = o.meta.version - 1,
            _ => break,
        }
    }
    versions.reverse();
    let mut start = 0;
    while start < versions.len() {
        // A window: up to a page of versions, within the byte budget.
        let mut end = start + 1;
        let mut bytes = versions[start].1;
        while end < versions.len()
            && end - start < PAGE as usize
            && bytes + versions[end].1 <= WINDOW_BYTES
        {
            bytes += versions[end].1;
            end += 1;
        }
        let (from, mut to) = (versions[start].0, versions[end - 1].0);
        let mut window = Vec::new();
        loop {
            let (page, more) = c.history_page(key, false, from, to, PAGE)?;
            let oldest = page.last().map(|o| o.meta.version);
            window.extend(page);
            match oldest {
                Some(v) if more && v > from => to = v - 1,
                _ => break,
            }
        }
        window.reverse();
        for o in &window {
            write_object(w, o, n)?;
            progress.tick(n);
        }
        start = end;
    }
    Ok(())
}

/// An object's record: its line, then its value's bytes and a newline
/// (a remove: the line alone).
fn write_object(w: &mut dyn Write, o: &sluice_client::Object, n: &mut Counts) -> Result<()> {
    let mut head = json!({
        "key": &*o.key,
        "version": o.meta.version,
        "timestamp_us": o.meta.timestamp_us,
    });
    if o.meta.tombstone {
        head["removed"] = true.into();
        line(w, &head)?;
    } else {
        head["size"] = o.value.len().into();
        line(w, &head)?;
        w.write_all(&o.value)?;
        w.write_all(b"\n")?;
        n.bytes += o.value.len() as u64;
    }
    n.objects += 1;
    Ok(())
}

fn line(w: &mut dyn Write, j: &serde_json::Value) -> Result<()> {
    serde_json::to_writer(&mut *w, j)?;
    w.write_all(b"\n")?;
    Ok(())
}

pub fn dump(c: &BlockingClient, addr: &str, a: DumpArgs, json_out: bool) -> Result<()> {
    let pools: Vec<PoolMeta> = if a.pool == "/" {
        c.list_pools(false)?
    } else {
        vec![c.get_pool(&a.pool)?]
    };
    let (mut w, to): (Box<dyn Write>, String) = match &a.out {
        Some(p) => (
            Box::new(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            )),
            p.display().to_string(),
        ),
        None => {
            if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                bail!("the dump is binary-safe data, not for a terminal: give --out FILE or redirect standard output");
            }
            (
                Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
                "standard output".into(),
            )
        }
    };
    line(
        &mut w,
        &json!({"sluice_dump": FORMAT, "from": addr, "created_us": sluice_client::wall_us()}),
    )?;
    let mut n = Counts::default();
    let mut progress = Progress::new("dumped");
    for p in &pools {
        line(&mut w, &json!({ "pool": spec_of(p) }))?;
        n.pools += 1;
        if p.pool_type == PoolType::Trigger {
            continue; // stores nothing
        }
        let keys = c.list_keys(&p.pathname, None)?;
        if a.history && p.pool_type == PoolType::Persistent {
            for key in keys {
                dump_history(c, &key, &mut w, &mut n, &mut progress)?;
            }
            continue;
        }
        // The latest version of each key: `WINDOW` gets in flight, written
        // in the order the keys were listed.
        let (h, client) = (c.handle(), c.async_client().clone());
        let mut gets = std::collections::VecDeque::new();
        let mut keys = keys.into_iter();
        loop {
            while gets.len() < WINDOW {
                let Some(key) = keys.next() else { break };
                let client = client.clone();
                gets.push_back(h.spawn(async move {
                    match client.get(&key).await {
                        Ok(o) => Ok(Some(o)),
                        // Removed since it was listed.
                        Err(sluice_client::SluiceError::NotFound { .. }) => Ok(None),
                        Err(e) => Err(e),
                    }
                }));
            }
            let Some(get) = gets.pop_front() else { break };
            if let Some(o) = h.block_on(get).context("a read of the dump")?? {
                write_object(&mut w, &o, &mut n)?;
                progress.tick(&n);
            }
        }
    }
    line(&mut w, &json!({ "end": &n }))?;
    w.flush().with_context(|| format!("writing {to}"))?;
    drop(w);
    // The dump may be standard output: the summary goes to standard error.
    if json_out {
        eprintln!("{}", json!({"dumped": &n, "to": to}));
    } else {
        eprintln!(
            "dumped {}, {} ({}) to {to}",
            counted(n.pools, "pool"),
            counted(n.objects, "object"),
            counted(n.bytes, "byte")
        );
    }
    Ok(())
}

/// One record of a dump.
enum Record {
    Pool(PoolSpec),
    Object {
        key: String,
        value: Option<bytes::Bytes>,
    },
    /// The end line (its counts checked against what came before).
    End,
}

/// Reads a dump's records one at a time, checking its framing.
struct Reader<R> {
    r: R,
    line: u64,
    counts: Counts,
    ended: bool,
}

impl<R: BufRead> Reader<R> {
    fn open(mut r: R, name: &str) -> Result<Self> {
        let mut first = String::new();
        r.read_line(&mut first)?;
        let head: serde_json::Value = serde_json::from_str(&first)
            .ok()
            .filter(|h: &serde_json::Value| h.get("sluice_dump").is_some())
            .with_context(|| {
                format!("{name} is not a dump of `sluice dump` (its first line is not one)")
            })?;
        if head["sluice_dump"] != FORMAT {
            bail!(
                "{name} is a dump of format {}; this sluice reads format {FORMAT}",
                head["sluice_dump"]
            );
        }
        Ok(Reader {
            r,
            line: 1,
            counts: Counts::default(),
            ended: false,
        })
    }

    fn next(&mut self) -> Result<Option<Record>> {
        let mut text = String::new();
        if self.r.read_line(&mut text)? == 0 {
            if self.ended {
                return Ok(None);
            }
            bail!(
                "the dump ends early, after {} objects: it was cut short (its end line is missing)",
                self.counts.objects
            );
        }
        self.line += 1;
        if !text.ends_with('\n') {
            bail!(
                "line {}: the dump ends early, after {} objects: it was cut short",
                self.line,
                self.counts.objects
            );
        }
        if self.ended {
            bail!("line {}: records after the dump's end line", self.line);
        }
        let j: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("line {}: not a record of a dump", self.line))?;
        if let Some(p) = j.get("pool") {
            let spec: PoolSpec = serde_json::from_value(p.clone())
                .with_context(|| format!("line {}: a pool", self.line))?;
            self.counts.pools += 1;
            return Ok(Some(Record::Pool(spec)));
        }
        if let Some(end) = j.get("end") {
            self.ended = true;
            let want = serde_json::to_value(&self.counts)?;
            if *end != want {
                bail!(
                    "line {}: the dump's end counts {end}, but it holds {want}",
                    self.line
                );
            }
            return Ok(Some(Record::End));
        }
        let key = j["key"]
            .as_str()
            .with_context(|| format!("line {}: a record without a key", self.line))?
            .to_string();
        self.counts.objects += 1;
        if j["removed"] == true {
            return Ok(Some(Record::Object { key, value: None }));
        }
        let size = j["size"]
            .as_u64()
            .with_context(|| format!("line {}: an object without a size", self.line))?;
        // No node takes a value of 4 GiB or more (the wire's bound): a
        // larger size is damage, not a value to allocate.
        if size >= u64::from(u32::MAX) {
            bail!(
                "line {}: the value of {key} claims {size} bytes: the dump is damaged",
                self.line
            );
        }
        let mut value = vec![0u8; size as usize];
        let mut nl = [0u8; 1];
        std::io::Read::read_exact(&mut self.r, &mut value)
            .and_then(|()| std::io::Read::read_exact(&mut self.r, &mut nl))
            .map_err(|_| {
                anyhow::anyhow!(
                    "line {}: the value of {key} ends early: the dump was cut short",
                    self.line
                )
            })?;
        if nl != *b"\n" {
            bail!(
                "line {}: the value of {key} is not {size} bytes long",
                self.line
            );
        }
        self.line += 1 + value.iter().filter(|b| **b == b'\n').count() as u64;
        self.counts.bytes += size;
        Ok(Some(Record::Object {
            key,
            value: Some(value.into()),
        }))
    }
}

fn open_dump(file: &str) -> Result<Box<dyn BufRead>> {
    Ok(if file == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin().lock()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("opening {file}"))?,
        ))
    })
}

/// Whether the pool the dump names exists here (`Ok(None)`: no) with
/// the dump's type; one of another type is refused (its objects would
/// land with another durability).
fn check_type(c: &BlockingClient, spec: &PoolSpec) -> Result<Option<PoolMeta>> {
    match c.get_pool(&spec.pathname) {
        Ok(have) if Some(have.pool_type) != spec.pool_type => bail!(
            "pool {} is {:?} here but {:?} in the dump: remove it or load elsewhere",
            spec.pathname,
            have.pool_type,
            spec.pool_type.unwrap_or(have.pool_type)
        ),
        Ok(have) => Ok(Some(have)),
        Err(sluice_client::SluiceError::PoolNotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A pool the dump names: created when missing (`Ok(true)`).
fn ensure_pool(c: &BlockingClient, spec: PoolSpec) -> Result<bool> {
    match check_type(c, &spec)? {
        Some(_) => Ok(false),
        None => {
            let path = spec.pathname.clone();
            c.create_pool(spec)
                .with_context(|| format!("creating pool {path}"))?;
            Ok(true)
        }
    }
}

/// Puts (and removes) of a load in flight: up to `WINDOW` at once, at
/// most one per key, so each key's versions are written in the dump's
/// order while different keys overlap (one at a time, a load took a round
/// trip per object).
struct Window {
    h: tokio::runtime::Handle,
    client: sluice_client::Client,
    tasks: std::collections::VecDeque<(
        String,
        tokio::task::JoinHandle<std::result::Result<(), sluice_client::SluiceError>>,
    )>,
    keys: std::collections::HashSet<String>,
}

/// Writes of a load in flight at once.
const WINDOW: usize = 64;

impl Window {
    fn new(c: &BlockingClient) -> Self {
        Window {
            h: c.handle(),
            client: c.async_client().clone(),
            tasks: Default::default(),
            keys: Default::default(),
        }
    }

    /// Waits for the oldest write in flight.
    fn wait_oldest(&mut self) -> Result<()> {
        let Some((key, task)) = self.tasks.pop_front() else {
            return Ok(());
        };
        self.keys.remove(&key);
        let done = self.h.block_on(task).context("a write of the load")?;
        done.with_context(|| format!("writing {key}"))
    }

    fn drain(&mut self) -> Result<()> {
        while !self.tasks.is_empty() {
            self.wait_oldest()?;
        }
        Ok(())
    }

    /// Puts `value` at `key` (`None`: removes it), after the key's write
    /// in flight, if any.
    fn write(&mut self, key: String, value: Option<bytes::Bytes>) -> Result<()> {
        while self.keys.contains(&key) || self.tasks.len() >= WINDOW {
            self.wait_oldest()?;
        }
        let client = self.client.clone();
        let k = key.clone();
        let task = self.h.spawn(async move {
            match value {
                Some(v) => client.put(&k, v).await.map(drop),
                None => match client.remove(&k).await {
                    Err(sluice_client::SluiceError::NotFound { .. }) => Ok(()),
                    r => r.map(drop),
                },
            }
        });
        self.keys.insert(key.clone());
        self.tasks.push_back((key, task));
        Ok(())
    }
}

pub fn load(c: &BlockingClient, a: LoadArgs, json_out: bool) -> Result<()> {
    // A file is read through once first: a dump cut short or damaged, or
    // one with a pool this cluster has with another type, is refused
    // before anything is written (from standard input, as they come).
    if a.file != "-" {
        let mut r = Reader::open(open_dump(&a.file)?, &a.file)?;
        while let Some(rec) = r.next()? {
            if let Record::Pool(spec) = rec {
                check_type(c, &spec)?;
            }
        }
    }
    let mut r = Reader::open(open_dump(&a.file)?, &a.file)?;
    let (mut created, mut n) = (0u64, Counts::default());
    let mut progress = Progress::new("loaded");
    let mut window = Window::new(c);
    while let Some(rec) = r.next()? {
        match rec {
            Record::Pool(spec) => {
                window.drain()?;
                created += ensure_pool(c, spec)? as u64;
                n.pools += 1;
            }
            Record::Object { key, value } => {
                n.bytes += value.as_ref().map_or(0, |v| v.len() as u64);
                window.write(key, value)?;
                n.objects += 1;
                progress.tick(&n);
            }
            Record::End => {}
        }
    }
    window.drain()?;
    if json_out {
        println!("{}", json!({"loaded": &n, "pools_created": created}));
    } else {
        println!(
            "loaded {} ({created} created), {} ({}) from {}",
            counted(n.pools, "pool"),
            counted(n.objects, "object"),
            counted(n.bytes, "byte"),
            a.file
        );
    }
    Ok(())
}
