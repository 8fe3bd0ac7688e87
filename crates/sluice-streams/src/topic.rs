//! Streams on Sluice's pools (EdgeServe §3-4): a source writes (header,
//! payload) items; the payload stays on the node that recorded it, in a
//! persistent pool with a retention (`/edge/<topic>`, one key per source,
//! one version per item), and the header goes to the topic
//! (`/streams/<topic>/<source>`, a persistent pool, so a subscriber can
//! resume from a time while items are retained). Routing per stream:
//! `lazy` headers name where the payload lives and a consumer fetches it
//! from that node, peer to peer, only when it uses it; `eager` headers
//! carry the payload; `auto` picks by size against a break-even measured
//! on the running system ([`Producer::calibrate`]).
//!
//! A header on the wire is `[u32 LE: JSON length][JSON][inline payload]`,
//! so an eager payload is a slice of the received bytes (no copy, no
//! base64). Sources whose name starts with `_` are reserved (calibration)
//! and never delivered.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use sluice_client::{Client, PoolSpec, PoolType, Retention, SluiceError, Watch, WatchFrom};
use std::collections::HashMap;
use std::time::Instant;

pub type Result<T, E = SluiceError> = std::result::Result<T, E>;

/// Where topics' headers live (one pool per topic below it).
pub const TOPIC_ROOT: &str = "/streams";
/// Where recording nodes keep payloads (one pool per topic below it).
pub const PAYLOAD_ROOT: &str = "/edge";
const CALIBRATION_SOURCE: &str = "_calibration";

/// How a stream's payloads travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum Routing {
    /// Headers only; consumers fetch payloads from the recording node.
    Lazy,
    /// Payloads travel inside the headers.
    Eager,
    /// Eager below `threshold` bytes, lazy from it on. `None`: measure
    /// the break-even when the producer starts ([`Producer::calibrate`]).
    Auto { threshold: Option<u64> },
}

impl std::str::FromStr for Routing {
    type Err = SluiceError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lazy" => Ok(Routing::Lazy),
            "eager" => Ok(Routing::Eager),
            "auto" => Ok(Routing::Auto { threshold: None }),
            other => match other.strip_prefix("auto:").map(str::parse::<u64>) {
                Some(Ok(t)) => Ok(Routing::Auto { threshold: Some(t) }),
                _ => Err(SluiceError::invalid_argument(
                    "routing",
                    format!("{other:?}: use lazy, eager, auto or auto:<bytes>"),
                )),
            },
        }
    }
}

/// What travels on the topic for one item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub topic: String,
    pub source: String,
    /// Per-source sequence number, from 0 (the producer's count).
    pub seq: u64,
    /// When the item was recorded (µs since the epoch, the producer's
    /// clock unless it gave its own).
    pub ts_us: u64,
    /// The payload's size in bytes.
    pub size: u64,
    /// Address of the node holding the payload (lazy items).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The payload's key and version there (lazy items).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// The payload, for eager items (a slice of the received bytes).
    #[serde(skip)]
    pub inline: Option<Bytes>,
}

impl Header {
    /// The header's wire form: JSON, then the inline payload if any.
    pub fn encode(&self) -> Bytes {
        let json = serde_json::to_vec(self).expect("a header serializes");
        let inline = self.inline.as_ref().map_or(0, Bytes::len);
        let mut b = BytesMut::with_capacity(4 + json.len() + inline);
        b.put_u32_le(json.len() as u32);
        b.put_slice(&json);
        if let Some(p) = &self.inline {
            b.put_slice(p);
        }
        b.freeze()
    }

    /// Parses a header's wire form; an inline payload is a slice of `b`.
    pub fn decode(b: &Bytes) -> Result<Header> {
        let bad = |why: String| SluiceError::invalid_argument("stream header", why);
        if b.len() < 4 {
            return Err(bad(format!("{} bytes, shorter than its length", b.len())));
        }
        let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let json = b
            .get(4..4 + n)
            .ok_or_else(|| bad(format!("length {n} beyond its {} bytes", b.len())))?;
        let mut h: Header = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
        if b.len() > 4 + n {
            h.inline = Some(b.slice(4 + n..));
        }
        Ok(h)
    }

    pub fn is_eager(&self) -> bool {
        self.inline.is_some()
    }
}

/// How long and how much a stream keeps (the paper's payload timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// Seconds an item (header and payload) stays fetchable.
    pub for_s: u64,
    /// Bytes of payload kept per source on its recording node.
    pub bytes: Option<u64>,
}

impl Default for Keep {
    fn default() -> Self {
        Keep {
            for_s: 60,
            bytes: None,
        }
    }
}

/// A watch on a topic that replays what it retains from `from_ts_us`
/// first. A topic nobody has published to has no pool yet, so nothing to
/// replay: the watch is then a live one (a first publish creates the pool
/// and reaches it). Should a publish create the pool while that watch is
/// set up, the items it published could fall between the two: the pool
/// is looked up again once the live watch stands, and if it exists by
/// then the replaying watch is tried again (`REPLAY_TRIES` times in all;
/// then its error).
async fn replay_then_live(broker: &Client, prefix: &str, from_ts_us: u64) -> Result<Watch> {
    const REPLAY_TRIES: usize = 3;
    for _ in 1..REPLAY_TRIES {
        match broker.watch_from(prefix, WatchFrom::Time(from_ts_us)).await {
            Err(SluiceError::NoPool { .. }) => {
                let live = broker.watch(prefix).await?;
                match broker.pool_of_key(prefix).await {
                    Err(SluiceError::NoPool { .. }) => return Ok(live),
                    Ok(_) => drop(live),
                    Err(e) => return Err(e),
                }
            }
            other => return other,
        }
    }
    broker.watch_from(prefix, WatchFrom::Time(from_ts_us)).await
}

/// Creates a persistent pool unless it exists.
async fn ensure_pool(c: &Client, path: &str, retention: Option<Retention>) -> Result<()> {
    match c
        .create_pool(PoolSpec {
            pathname: path.to_string(),
            pool_type: Some(PoolType::Persistent),
            retention,
            ..Default::default()
        })
        .await
    {
        Ok(_) | Err(SluiceError::PoolExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') {
        return Err(SluiceError::invalid_argument(
            what,
            format!("{name:?} must be one non-empty path segment"),
        ));
    }
    Ok(())
}

/// One measurement of the two routings at one size.
#[derive(Clone, Debug, Serialize)]
pub struct BreakEvenSample {
    pub size: u64,
    /// Median µs to publish and then read one item, eager.
    pub eager_us: f64,
    /// Same, lazy (local put, header, header read, payload fetch).
    pub lazy_us: f64,
}

/// What [`Producer::calibrate`] measured: the smallest size at which lazy
/// was no slower than eager, for an item a consumer uses (lazy only gets
/// cheaper when items are skipped). `None`: eager won at every size.
#[derive(Clone, Debug, Serialize)]
pub struct BreakEven {
    pub bytes: Option<u64>,
    pub samples: Vec<BreakEvenSample>,
}

/// The writing side of one stream (`topic`, `source`).
pub struct Producer {
    broker: Client,
    local: Client,
    /// How consumers reach `local`.
    local_addr: String,
    topic: String,
    source: String,
    routing: Routing,
    seq: u64,
    break_even: Option<BreakEven>,
}

impl Producer {
    /// A producer writing headers through `broker` and payloads to the
    /// recording node at `local_addr` (which consumers must reach at
    /// that address). Creates the topic's and the payload's pools with
    /// `keep` if they do not exist; `Auto` routing without a threshold
    /// measures the break-even first.
    pub async fn new(
        broker: Client,
        local_addr: &str,
        topic: &str,
        source: &str,
        routing: Routing,
        keep: Keep,
    ) -> Result<Producer> {
        check_name("topic", topic)?;
        check_name("source", source)?;
        let local = Client::connect(local_addr).await?;
        let age = Retention::of(None, Some(keep.for_s), None);
        ensure_pool(&broker, &format!("{TOPIC_ROOT}/{topic}"), age).await?;
        let payload = Retention::of(None, Some(keep.for_s), keep.bytes);
        ensure_pool(&local, &format!("{PAYLOAD_ROOT}/{topic}"), payload).await?;
        // A producer that restarts goes on with its source's numbering.
        let seq = match broker.get(&format!("{TOPIC_ROOT}/{topic}/{source}")).await {
            Ok(o) => Header::decode(&o.value).map_or(0, |h| h.seq + 1),
            Err(SluiceError::NotFound { .. }) => 0,
            Err(e) => return Err(e),
        };
        let mut p = Producer {
            broker,
            local,
            local_addr: local_addr.to_string(),
            topic: topic.to_string(),
            source: source.to_string(),
            routing,
            seq,
            break_even: None,
        };
        if routing == (Routing::Auto { threshold: None }) {
            let be = p
                .calibrate(
                    &[1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20],
                    5,
                )
                .await?;
            p.routing = Routing::Auto {
                threshold: Some(be.bytes.unwrap_or(u64::MAX)),
            };
            p.break_even = Some(be);
        }
        Ok(p)
    }

    pub fn routing(&self) -> Routing {
        self.routing
    }

    /// What calibration measured, when `Auto` ran it.
    pub fn break_even(&self) -> Option<&BreakEven> {
        self.break_even.as_ref()
    }

    /// Publishes one item recorded at `ts_us` (`None`: now).
    pub async fn publish(&mut self, ts_us: Option<u64>, payload: Bytes) -> Result<Header> {
        let eager = match self.routing {
            Routing::Eager => true,
            Routing::Lazy => false,
            Routing::Auto { threshold } => (payload.len() as u64) < threshold.unwrap_or(u64::MAX),
        };
        let seq = self.seq;
        let h = self
            .publish_as(&self.source.clone(), seq, ts_us, payload, eager)
            .await?;
        self.seq += 1;
        Ok(h)
    }

    async fn publish_as(
        &self,
        source: &str,
        seq: u64,
        ts_us: Option<u64>,
        payload: Bytes,
        eager: bool,
    ) -> Result<Header> {
        let mut h = Header {
            topic: self.topic.clone(),
            source: source.to_string(),
            seq,
            ts_us: ts_us.unwrap_or_else(sluice_client::wall_us),
            size: payload.len() as u64,
            node: None,
            key: None,
            version: None,
            inline: None,
        };
        if eager {
            h.inline = Some(payload);
        } else {
            let key = format!("{PAYLOAD_ROOT}/{}/{source}", self.topic);
            let r = self.local.put(&key, payload).await?;
            h.node = Some(self.local_addr.clone());
            h.key = Some(key);
            h.version = Some(r.version);
        }
        self.broker
            .put(&format!("{TOPIC_ROOT}/{}/{source}", self.topic), h.encode())
            .await?;
        Ok(h)
    }

    /// Measures both routings at each size (`reps` items each, median)
    /// on this producer's own pools, as a reserved source consumers never
    /// see: publish, read the header back as a subscriber would, and
    /// fetch the payload (lazy). Returns the smallest size where lazy
    /// was no slower.
    pub async fn calibrate(&mut self, sizes: &[u64], reps: usize) -> Result<BreakEven> {
        let mut fetcher = Fetcher::default();
        let mut samples = Vec::new();
        let topic_key = format!("{TOPIC_ROOT}/{}/{CALIBRATION_SOURCE}", self.topic);
        for &size in sizes {
            let payload = Bytes::from(vec![0x5au8; size as usize]);
            let mut t = [Vec::new(), Vec::new()];
            for rep in 0..reps.max(1) {
                for (i, eager) in [true, false].into_iter().enumerate() {
                    let start = Instant::now();
                    self.publish_as(CALIBRATION_SOURCE, rep as u64, None, payload.clone(), eager)
                        .await?;
                    let h = Header::decode(&self.broker.get(&topic_key).await?.value)?;
                    fetcher.fetch(&h).await?;
                    t[i].push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            samples.push(BreakEvenSample {
                size,
                eager_us: median(&mut t[0]),
                lazy_us: median(&mut t[1]),
            });
        }
        let bytes = samples
            .iter()
            .find(|s| s.lazy_us <= s.eager_us)
            .map(|s| s.size);
        tracing::info!(topic = %self.topic, ?bytes, "stream routing break-even measured");
        Ok(BreakEven { bytes, samples })
    }
}

/// Fetches payloads: inline ones from the header, lazy ones from their
/// recording node (one connection per node, kept). Counts what it moved.
#[derive(Default)]
pub struct Fetcher {
    nodes: HashMap<String, Client>,
    /// Payloads fetched from recording nodes, and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
}

impl Fetcher {
    /// The item's payload. A lazy payload the recording node no longer
    /// keeps is `PayloadExpired`, naming the item.
    pub async fn fetch(&mut self, h: &Header) -> Result<Bytes> {
        if let Some(p) = &h.inline {
            return Ok(p.clone());
        }
        let (Some(node), Some(key), Some(version)) = (&h.node, &h.key, h.version) else {
            return Err(SluiceError::invalid_argument(
                "stream header",
                format!("{}/{} #{} names no payload", h.topic, h.source, h.seq),
            ));
        };
        let c = match self.nodes.get(node) {
            Some(c) => c.clone(),
            None => {
                let c = Client::connect(node).await?;
                self.nodes.insert(node.clone(), c.clone());
                c
            }
        };
        let expired = |reason: String| SluiceError::PayloadExpired {
            topic: h.topic.clone(),
            stream_source: h.source.clone(),
            seq: h.seq,
            ts_us: h.ts_us,
            version,
            reason,
        };
        match c.get_version(key, version).await {
            Ok(o) => {
                self.fetched += 1;
                self.fetched_bytes += o.value.len() as u64;
                Ok(o.value)
            }
            Err(SluiceError::VersionNotRetained { reason, .. }) => Err(expired(reason)),
            Err(SluiceError::NotFound { .. }) => {
                Err(expired("the recording node no longer has it".into()))
            }
            Err(e) => Err(e),
        }
    }
}

/// A subscription to a topic: headers in per-source order (lazy payloads
/// are not moved until [`Fetcher::fetch`]).
pub struct Subscriber {
    watch: sluice_client::Watch,
    keys: String,
    /// Headers received, and the bytes that came with them (eager
    /// payloads included).
    pub received: u64,
    pub received_bytes: u64,
    /// Notifications lost because this subscriber fell behind (the watch's
    /// `Lagged` reports).
    pub lost: u64,
}

impl Subscriber {
    /// Subscribes to `topic` through `broker`: items published from now
    /// on, or, with `from_ts_us`, every retained item recorded from then
    /// first (oldest first), then live ones.
    pub async fn new(broker: &Client, topic: &str, from_ts_us: Option<u64>) -> Result<Subscriber> {
        check_name("topic", topic)?;
        // The topic's pool path (a watch prefix cannot end with '/'); keys
        // of other topics that share its leading characters are skipped.
        let prefix = format!("{TOPIC_ROOT}/{topic}");
        let watch = match from_ts_us {
            Some(t) => replay_then_live(broker, &prefix, t).await?,
            None => broker.watch(&prefix).await?,
        };
        Ok(Subscriber {
            watch,
            keys: format!("{TOPIC_ROOT}/{topic}/"),
            received: 0,
            received_bytes: 0,
            lost: 0,
        })
    }

    /// The next header; `None` when the subscription was closed, an
    /// error when its connection to the broker was lost (the broker died).
    pub async fn next(&mut self) -> Option<Result<Header>> {
        loop {
            let Some(n) = self.watch.next().await else {
                // Lost with its broker (an error saying so), or closed.
                return self.watch.lost().map(Err);
            };
            if n.kind == sluice_client::NotificationKind::Lagged {
                self.lost += n.object.meta.version;
                continue;
            }
            if n.object.meta.tombstone || !n.object.key.starts_with(&self.keys) {
                continue;
            }
            self.received += 1;
            self.received_bytes += n.object.value.len() as u64;
            let h = Header::decode(&n.object.value);
            if matches!(&h, Ok(h) if h.source.starts_with('_')) {
                continue;
            }
            return Some(h);
        }
    }
}

/// A tuple of headers (what the aggregation and target-rate operators
/// emit in a DFG) on the wire: `[u64 LE ts][u32 LE slots]`, then per
/// slot `[u8 state: 0 fresh, 1 imputed, 2 missing][u32 LE length][header
/// wire bytes]`, in the topic's source order.
pub fn encode_tuple(t: &crate::Tuple<Bytes>, sources: &[String]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u64_le(t.ts);
    b.put_u32_le(t.slots.len() as u32);
    for (i, s) in t.slots.iter().enumerate() {
        let (state, bytes) = match s {
            crate::Slot::Fresh(it) => (0u8, it.value.clone()),
            crate::Slot::Imputed(it) => (1, it.value.clone()),
            crate::Slot::Missing => (2, None),
        };
        b.put_u8(state);
        match bytes {
            Some(h) => {
                b.put_u32_le(h.len() as u32);
                b.put_slice(&h);
            }
            // A missing slot carries its source's name, as a header
            // without a payload would.
            None => {
                let name = sources.get(i).map_or("", String::as_str);
                b.put_u32_le(name.len() as u32);
                b.put_slice(name.as_bytes());
            }
        }
    }
    b.freeze()
}

/// Parses [`encode_tuple`]'s form: each fresh or imputed slot's header
/// (eager payloads are slices of `b`); a missing slot's item names its
/// source with `value: None`.
pub fn decode_tuple(b: &Bytes) -> Result<crate::Tuple<Header>> {
    let bad = |why: &str| SluiceError::invalid_argument("stream tuple", why.to_string());
    let take = |at: &mut usize, n: usize| -> Result<Bytes> {
        let s = b.get(*at..*at + n).ok_or_else(|| bad("truncated"))?;
        let out = b.slice_ref(s);
        *at += n;
        Ok(out)
    };
    let mut at = 0;
    let ts = u64::from_le_bytes(take(&mut at, 8)?[..].try_into().expect("8 bytes"));
    let n = u32::from_le_bytes(take(&mut at, 4)?[..].try_into().expect("4 bytes"));
    let mut slots = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        let state = take(&mut at, 1)?[0];
        let len = u32::from_le_bytes(take(&mut at, 4)?[..].try_into().expect("4 bytes"));
        let body = take(&mut at, len as usize)?;
        slots.push(match state {
            0 | 1 => {
                let h = Header::decode(&body)?;
                let item = crate::Item::new(&h.source.clone(), h.ts_us, h);
                if state == 0 {
                    crate::Slot::Fresh(item)
                } else {
                    crate::Slot::Imputed(item)
                }
            }
            2 => crate::Slot::Missing,
            _ => return Err(bad("unknown slot state")),
        });
    }
    Ok(crate::Tuple { ts, slots })
}
