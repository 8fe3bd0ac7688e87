//! `sluice stream ...` (EdgeServe streams: publish, subscribe, fetch) and
//! `sluice queue ...` (a shared queue of competing consumers), over
//! `sluice-streams`.

use crate::commands::put_bytes;
use anyhow::{Context, Result};
use bytes::Bytes;
use sluice_client::{Client, ClientConfig};
use sluice_streams::shared::SharedQueue;
use sluice_streams::topic::{Fetcher, Header, Keep, Producer, Routing, Subscriber};
use std::io::{Read, Write};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum StreamCmd {
    /// Publish one item of stream TOPIC/SOURCE (VALUE, or `-` for stdin):
    /// the payload goes to the recording node (--local), the header to
    /// the topic on the node(s) of --addr. Prints the item in a line
    /// (--json: its header).
    Publish {
        /// The topic (one path segment: no `/`).
        topic: String,
        /// The source within it (an edge node, a camera): items of one
        /// source stay in order.
        source: String,
        /// The payload, or `-` to read it from standard input.
        value: String,
        /// The recording node (where the payload stays; consumers fetch
        /// it from this address). Default: the --addr node.
        #[arg(long)]
        local: Option<String>,
        /// lazy, eager, auto (measure the break-even first) or
        /// `auto:<bytes>`.
        #[arg(long, default_value = "lazy")]
        routing: String,
        /// The item's timestamp (µs since the epoch; default now).
        #[arg(long)]
        ts_us: Option<u64>,
        /// How long items stay fetchable (creating the pools).
        #[arg(long, default_value_t = 60)]
        keep_for_s: u64,
        /// Payload bytes kept per source on the recording node.
        #[arg(long)]
        keep_bytes: Option<u64>,
    },
    /// Print a topic's headers as they come (one JSON line each, as
    /// --json prints them anywhere), in per-source order; --from-time-us
    /// replays retained ones first.
    Sub {
        /// The topic.
        topic: String,
        /// First every retained item recorded at or after this time (µs
        /// since the epoch; 0: all), then live ones.
        #[arg(long)]
        from_time_us: Option<u64>,
        /// Fetch every payload (lazy ones from their recording node) and
        /// print its size and first bytes.
        #[arg(long)]
        fetch: bool,
        /// Stop after this many items.
        #[arg(long)]
        count: Option<u64>,
    },
}

#[derive(clap::Subcommand)]
pub enum QueueCmd {
    /// Add an item (VALUE, or `-` for stdin) to the shared queue NAME.
    Push {
        /// The queue's name.
        name: String,
        /// The item, or `-` to read it from standard input.
        value: String,
    },
    /// Take items as consumer --consumer: each goes to one live
    /// consumer; one whose lease runs out unacknowledged goes to another.
    /// One JSON line per item: its id, its delivery count and its value
    /// (`value_hex` when it is not UTF-8 text).
    Take {
        /// The queue's name.
        name: String,
        /// This consumer's name (each item goes to one consumer).
        #[arg(long, default_value = "cli")]
        consumer: String,
        /// How many items to take, one after another.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Lease on each item; past it, another consumer may take it.
        #[arg(long, default_value_t = 30_000)]
        lease_ms: u64,
        /// Hold each item this long before acknowledging it (a stand-in
        /// for work).
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
        /// How long to wait for an item.
        #[arg(long, default_value_t = 10_000)]
        wait_ms: u64,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn connect(addr: &str, timeout_ms: u64) -> Result<Client> {
    Client::connect_with(ClientConfig {
        addr: addr.to_string(),
        request_timeout: Duration::from_millis(timeout_ms),
        client_name: "sluice-cli".into(),
        tls: crate::tls::client(),
        token: crate::tls::token(),
        ..Default::default()
    })
    .await
    .with_context(|| format!("connecting to {addr}"))
}

fn value_arg(v: &str) -> Result<Bytes> {
    if v == "-" {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b)?;
        Ok(b.into())
    } else {
        Ok(Bytes::copy_from_slice(v.as_bytes()))
    }
}

fn header_json(h: &Header) -> serde_json::Value {
    let mut j = serde_json::to_value(h).expect("a header serializes");
    j["routing"] = if h.is_eager() { "eager" } else { "lazy" }.into();
    j
}

/// A published item in a line: what, when, where its payload is.
fn published(h: &Header) -> String {
    let what = format!(
        "published {}/{} seq {} at {} µs, {}",
        h.topic,
        h.source,
        h.seq,
        h.ts_us,
        crate::commands::counted(h.size, "byte")
    );
    match (&h.node, &h.key, h.version) {
        (Some(node), Some(key), Some(v)) => {
            format!("{what}, lazy: the payload is {key} version {v} on {node}")
        }
        _ => format!("{what}, eager: the payload travels in the header"),
    }
}

/// The first bytes of a payload, cut at a character boundary when it is
/// text (a hex dump of 32 bytes when it is not).
fn head(p: &[u8]) -> &[u8] {
    let mut end = p.len().min(32);
    if let Err(e) = std::str::from_utf8(&p[..end]) {
        if e.error_len().is_none() {
            // A character cut at the end: stop before it.
            end = e.valid_up_to();
        }
    }
    &p[..end]
}

pub fn run_stream(addr: &str, timeout_ms: u64, json: bool, cmd: StreamCmd) -> Result<()> {
    runtime()?.block_on(async move {
        let broker = connect(addr, timeout_ms).await?;
        match cmd {
            StreamCmd::Publish {
                topic,
                source,
                value,
                local,
                routing,
                ts_us,
                keep_for_s,
                keep_bytes,
            } => {
                let routing: Routing = routing.parse()?;
                let local =
                    local.unwrap_or_else(|| addr.split(',').next().unwrap_or(addr).to_string());
                let keep = Keep {
                    for_s: keep_for_s,
                    bytes: keep_bytes,
                };
                let mut p = Producer::new(broker, &local, &topic, &source, routing, keep).await?;
                if let Some(be) = p.break_even() {
                    eprintln!("routing break-even: {}", serde_json::to_string(be)?);
                }
                let h = p.publish(ts_us, value_arg(&value)?).await?;
                if json {
                    println!("{}", header_json(&h));
                } else {
                    println!("{}", published(&h));
                }
                Ok(())
            }
            StreamCmd::Sub {
                topic,
                from_time_us,
                fetch,
                count,
            } => {
                let mut sub = Subscriber::new(&broker, &topic, from_time_us).await?;
                let mut fetcher = Fetcher::default();
                let mut n = 0u64;
                while count.is_none_or(|c| n < c) {
                    let Some(h) = sub.next().await else { break };
                    let h = h?;
                    let mut j = header_json(&h);
                    if fetch {
                        match fetcher.fetch(&h).await {
                            Ok(p) => {
                                j["fetched"] = p.len().into();
                                put_bytes(&mut j, "head", head(&p));
                            }
                            Err(e) => j["error"] = e.to_string().into(),
                        }
                    }
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{j}")?;
                    out.flush()?;
                    n += 1;
                }
                Ok(())
            }
        }
    })
}

pub fn run_queue(addr: &str, timeout_ms: u64, cmd: QueueCmd) -> Result<()> {
    runtime()?.block_on(async move {
        let client = connect(addr, timeout_ms).await?;
        match cmd {
            QueueCmd::Push { name, value } => {
                let mut q = SharedQueue::open(client, &name, "cli", Duration::ZERO).await?;
                println!("{}", q.push(value_arg(&value)?).await?);
                Ok(())
            }
            QueueCmd::Take {
                name,
                consumer,
                count,
                lease_ms,
                hold_ms,
                wait_ms,
            } => {
                let lease = Duration::from_millis(lease_ms);
                let mut q = SharedQueue::open(client, &name, &consumer, lease).await?;
                for _ in 0..count {
                    let d = q
                        .take(Duration::from_millis(wait_ms), Duration::from_millis(20))
                        .await?
                        .with_context(|| format!("no item in queue {name} within {wait_ms} ms"))?;
                    let mut j = serde_json::json!({
                        "id": d.id,
                        "delivery": d.delivery,
                    });
                    put_bytes(&mut j, "value", &d.value);
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{j}")?;
                    out.flush()?;
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    q.ack(&d).await?;
                }
                Ok(())
            }
        }
    })
}
