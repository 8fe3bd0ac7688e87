//! Broadcast of a large object to many nodes (issue #21, after MCCS):
//! chunked and pipelined along chains (one chain, or `fanout` chains from
//! each node: a tree), ordered by the nodes' topology labels so a chain
//! crosses each boundary as few times as possible. Each hop forwards a
//! chunk as soon as it has it; a receiver that does not answer is skipped
//! and the chain continues at the next node (which gets every chunk sent
//! so far); every receiver checks the checksum of the whole object and
//! keeps it (`received`), where lambdas' reads of the key find it without
//! moving it again. The last chunk's reply carries each receiver's
//! outcome back up the chain.
//!
//! Chunks travel as peer messages (`Request::Raft` of kind
//! `kind::BCAST_CHUNK`, only on authenticated peer connections): a header
//! (length-prefixed bincode) followed by the chunk's bytes.

use super::*;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::sync::mpsc;

/// One chunk's header.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ChunkHeader {
    id: u64,
    key: String,
    meta: sluice_types::ObjectMeta,
    offset: u64,
    total: u64,
    crc: u32,
    fanout: u8,
    /// The nodes this receiver passes the object on to (split into
    /// `fanout` chains).
    next: Vec<u32>,
}

/// A receiver's outcome, reported back up the chain.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Outcome {
    pub node: u32,
    /// `None`: received whole with the right checksum.
    pub error: Option<String>,
}

/// Where a forwarding task takes its chunks from.
type ChunkTx = mpsc::UnboundedSender<(ChunkHeader, Bytes)>;
/// A forwarding task, ending with its chain's outcomes.
type Report = tokio::task::JoinHandle<Vec<Outcome>>;

/// Broadcasts a node receives at once, at most (each holds a buffer as
/// large as its object); a new broadcast of a key replaces an unfinished
/// one of the same key (its sender gave up on it).
pub(super) const MAX_ASSEMBLIES: usize = 16;

/// A broadcast being received here.
struct Assembly {
    key: String,
    buf: BytesMut,
    forwarders: Vec<ChunkTx>,
    reports: Vec<Report>,
}

/// What a node keeps of broadcasts: the assemblies in progress and the
/// objects received.
#[derive(Default)]
pub(crate) struct Broadcasts {
    assemblies: parking_lot::Mutex<HashMap<u64, Assembly>>,
    pub(super) received: parking_lot::RwLock<HashMap<String, Arc<sluice_types::Object>>>,
    /// Fault injection: flip a byte of every chunk this node forwards.
    pub(super) corrupt: std::sync::atomic::AtomicBool,
    /// When this node's (emulated) outgoing link is free again.
    egress_free: parking_lot::Mutex<Option<tokio::time::Instant>>,
}

/// A chunk's header as the first part of the message's body (the chunk's
/// bytes follow as the second part, written from where they are).
fn encode_head(h: &ChunkHeader) -> Bytes {
    let head = bincode::serialize(h).unwrap_or_default();
    let mut b = BytesMut::with_capacity(4 + head.len());
    b.put_u32_le(head.len() as u32);
    b.put_slice(&head);
    b.freeze()
}

/// A one-receiver chunk message's body (tests of `on_chunk`).
#[cfg(test)]
pub(super) fn chunk_body(
    id: u64,
    key: &str,
    offset: u64,
    total: u64,
    crc: u32,
    data: &[u8],
) -> Bytes {
    let h = ChunkHeader {
        id,
        key: key.to_string(),
        meta: sluice_types::ObjectMeta {
            version: 1,
            timestamp_us: 1,
            previous_version: 0,
            previous_version_by_key: 0,
            tombstone: false,
        },
        offset,
        total,
        crc,
        fanout: 1,
        next: Vec::new(),
    };
    let mut b = encode_head(&h).to_vec();
    b.extend_from_slice(data);
    Bytes::from(b)
}

fn decode(mut body: Bytes) -> Result<(ChunkHeader, Bytes), SluiceError> {
    if body.len() < 4 {
        return Err(SluiceError::protocol("a broadcast chunk without a header"));
    }
    let n = body.get_u32_le() as usize;
    if n > body.len() || n > 1 << 20 {
        return Err(SluiceError::protocol(
            "a broadcast chunk header runs past its body",
        ));
    }
    let h: ChunkHeader = bincode::deserialize(&body[..n])
        .map_err(|e| SluiceError::protocol(format!("a broadcast chunk header: {e}")))?;
    Ok((h, body.slice(n..)))
}

/// The order of a node in a chain: by its topology labels (region, zone,
/// rack, host first, then the others by name), then by id.
fn topo_key(l: &ClusterLayout, id: u32) -> (Vec<String>, u32) {
    let labels = l
        .nodes
        .iter()
        .find(|n| n.id == id)
        .map(|n| n.labels.clone())
        .unwrap_or_default();
    let mut key = Vec::new();
    for k in ["region", "zone", "rack", "host"] {
        key.push(labels.get(k).cloned().unwrap_or_default());
    }
    for (k, v) in &labels {
        if !["region", "zone", "rack", "host"].contains(&k.as_str()) {
            key.push(format!("{k}={v}"));
        }
    }
    (key, id)
}

/// `targets` in chain order from `source`: the source's own group first,
/// then group by group; and the boundary crossings of that order against
/// the fewest possible (groups among the targets, less the source's).
pub fn chain_order(l: &ClusterLayout, source: u32, targets: &[u32]) -> (Vec<u32>, usize, usize) {
    let src = topo_key(l, source).0;
    let mut t: Vec<u32> = targets.iter().copied().filter(|t| *t != source).collect();
    t.sort_by_key(|id| {
        let (k, id) = topo_key(l, *id);
        (k != src, k, id)
    });
    let group = |id: u32| topo_key(l, id).0;
    let mut crossings = 0;
    let mut prev = src.clone();
    for id in &t {
        let g = group(*id);
        if g != prev {
            crossings += 1;
        }
        prev = g;
    }
    let mut groups: Vec<Vec<String>> = t.iter().map(|id| group(*id)).collect();
    groups.sort();
    groups.dedup();
    let optimum = groups.len() - usize::from(groups.contains(&src));
    (t, crossings, optimum)
}

/// `next` split into `fanout` contiguous chains.
fn split(next: &[u32], fanout: usize) -> Vec<Vec<u32>> {
    let f = fanout.max(1).min(next.len().max(1));
    let per = next.len().div_ceil(f);
    next.chunks(per.max(1)).map(|c| c.to_vec()).collect()
}

impl ClusterNode {
    /// Sends `key` (its latest version, read here or from a member of its
    /// shard) to `targets`, in `chunk`-byte chunks along `fanout` chains.
    /// Returns each target's outcome, the order and its crossings.
    pub async fn broadcast(
        &self,
        key: &str,
        targets: Vec<u32>,
        fanout: usize,
        chunk: usize,
    ) -> Result<serde_json::Value, SluiceError> {
        let t0 = std::time::Instant::now();
        for (i, t) in targets.iter().enumerate() {
            if self.layout.address_of(*t).is_none() {
                return Err(SluiceError::invalid_argument(
                    "broadcast",
                    format!("node {t} is not in the layout"),
                ));
            }
            // Sent twice, the second copy's chunks reached a receiver
            // that had finished the first and failed it.
            if targets[..i].contains(t) {
                return Err(SluiceError::invalid_argument(
                    "broadcast",
                    format!("node {t} is named twice among the receivers"),
                ));
            }
        }
        if fanout == 0 {
            return Err(SluiceError::invalid_argument(
                "broadcast",
                "fanout 0: each node passes the object on along at least one chain (1: one chain, 2: a binary tree)",
            ));
        }
        let obj = self.read_any(key).await?;
        let (order, crossings, optimum) = chain_order(&self.layout, self.id, &targets);
        let crc = crc32c::crc32c(&obj.value);
        let id = sluice_types::random_u64();
        let chunk = chunk.clamp(4 << 10, 64 << 20);
        let (txs, handles) = self.start_forwarders(&order, fanout.max(1));
        let total = obj.value.len() as u64;
        let mut offset = 0u64;
        loop {
            let end = (offset + chunk as u64).min(total);
            let data = obj.value.slice(offset as usize..end as usize);
            let h = ChunkHeader {
                id,
                key: key.to_string(),
                meta: obj.meta,
                offset,
                total,
                crc,
                fanout: fanout.clamp(1, 255) as u8,
                next: Vec::new(),
            };
            for tx in &txs {
                let _ = tx.send((h.clone(), data.clone()));
            }
            offset = end;
            if offset >= total {
                break;
            }
        }
        drop(txs);
        let mut outcomes = Vec::new();
        for h in handles {
            outcomes.extend(h.await.unwrap_or_default());
        }
        // Receivers the chains never reached (all before them failed).
        for t in &order {
            if !outcomes.iter().any(|o| o.node == *t) {
                outcomes.push(Outcome {
                    node: *t,
                    error: Some("not reached".into()),
                });
            }
        }
        outcomes.sort_by_key(|o| o.node);
        let ok = outcomes.iter().filter(|o| o.error.is_none()).count();
        tracing::info!(
            key,
            bytes = total,
            nodes = order.len(),
            ok,
            "broadcast done"
        );
        Ok(json!({
            "key": key,
            "version": obj.meta.version,
            "bytes": total,
            "crc32c": crc,
            "order": order,
            "fanout": fanout,
            "chunk_bytes": chunk,
            "crossings": crossings,
            "crossings_optimum": optimum,
            "ok": ok,
            "outcomes": outcomes,
            "elapsed_ms": t0.elapsed().as_secs_f64() * 1e3,
        }))
    }

    /// The latest version of `key` the shard has committed, read
    /// linearizably: here when this node leads the shard (after a read
    /// index), else from its leader. A member's own copy may be behind
    /// (a follower that has not applied the client's last put yet, or one
    /// cut off from its leader): broadcasting it would send an older
    /// version, or none, of a key the client just wrote. Trigger pools
    /// are not replicated: their copy here is the one.
    async fn read_any(&self, key: &str) -> Result<Arc<sluice_types::Object>, SluiceError> {
        let shard = self.store.shard_id_of(key, None)?;
        let Some(g) = group_of(shard) else {
            return self.store.get(key, None, None);
        };
        let leads = self
            .groups
            .read()
            .get(&g)
            .is_some_and(|x| x.core.leader() == Some(u64::from(self.id)));
        if leads && self.members_of(g).contains(&self.id) {
            self.read_barrier(shard).await?;
            return self.store.get(key, None, None);
        }
        let members = self.members_of(g);
        self.read_remote(
            g,
            members,
            key.to_string(),
            shard.shard,
            sluice_compute::ReadAt::Latest,
            true,
        )
        .await
    }

    /// One forwarding task per chain of `next`: it sends each chunk it is
    /// given to the chain's head (the rest of the chain in the header),
    /// and when a head does not answer moves on to the next node, sending
    /// it every chunk so far. Ends with the chain's outcomes.
    fn start_forwarders(&self, next: &[u32], fanout: usize) -> (Vec<ChunkTx>, Vec<Report>) {
        let mut txs = Vec::new();
        let mut handles = Vec::new();
        if next.is_empty() {
            return (txs, handles);
        }
        for chain in split(next, fanout) {
            let (tx, rx) = mpsc::unbounded_channel();
            txs.push(tx);
            let me = self.me.get().and_then(|w| w.upgrade());
            handles.push(tokio::spawn(async move {
                match me {
                    Some(me) => me.forward(chain, rx).await,
                    None => Vec::new(),
                }
            }));
        }
        (txs, handles)
    }

    async fn forward(
        &self,
        mut chain: Vec<u32>,
        mut rx: mpsc::UnboundedReceiver<(ChunkHeader, Bytes)>,
    ) -> Vec<Outcome> {
        let mut sent: Vec<(ChunkHeader, Bytes)> = Vec::new();
        let mut outcomes = Vec::new();
        let mut last_reply = Vec::new();
        // The head has received nothing yet (the first, or one after a repair).
        let mut fresh = true;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        while let Some((h, mut data)) = rx.recv().await {
            if self
                .bcast
                .corrupt
                .load(std::sync::atomic::Ordering::Relaxed)
                && !data.is_empty()
            {
                let mut b = data.to_vec();
                b[0] ^= 0xff;
                data = Bytes::from(b);
            }
            sent.push((h, data));
            while let Some(&head) = chain.first() {
                let rest = chain[1..].to_vec();
                for (hh, _) in sent.iter_mut() {
                    hh.next.clone_from(&rest);
                }
                let from = if fresh { 0 } else { sent.len() - 1 };
                match self.send_chunks(head, &sent, from, t).await {
                    Ok(reply) => {
                        last_reply = reply;
                        fresh = false;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(node = head, error = %e, "broadcast: a receiver did not answer; the chain goes on without it");
                        outcomes.push(Outcome {
                            node: head,
                            error: Some(format!("unreachable: {e}")),
                        });
                        chain.remove(0);
                        fresh = true;
                    }
                }
            }
        }
        outcomes.extend(last_reply);
        outcomes
    }

    /// Sends `sent[from..]` to `head` in order; the last reply's outcomes.
    async fn send_chunks(
        &self,
        head: u32,
        sent: &[(ChunkHeader, Bytes)],
        from: usize,
        t: Duration,
    ) -> Result<Vec<Outcome>, SluiceError> {
        let addr = self
            .layout
            .address_of(head)
            .ok_or_else(|| SluiceError::protocol(format!("node {head} has no address")))?
            .to_string();
        let mut out = Vec::new();
        for (h, data) in &sent[from..] {
            self.egress(data.len()).await;
            let req = sluice_wire::Request::Raft {
                from: self.id,
                group: META_GROUP,
                kind: crate::network::kind::BCAST_CHUNK,
                body: encode_head(h),
                more: vec![data.clone()],
            };
            match self.peers.request(head, &addr, &req, t).await? {
                sluice_wire::Response::Raw(b) => {
                    out = serde_json::from_slice(&b).map_err(|e| {
                        SluiceError::protocol(format!("a broadcast chunk's reply: {e}"))
                    })?;
                }
                sluice_wire::Response::Error(e) => return Err(e),
                other => {
                    return Err(SluiceError::protocol(format!(
                        "unexpected reply to a broadcast chunk: {other:?}"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Waits until this node's emulated outgoing link has carried `bytes`
    /// more (`broadcast_egress_mbps`; all its sends share it).
    async fn egress(&self, bytes: usize) {
        let mbps = self.settings.broadcast_egress_mbps;
        if mbps == 0 {
            return;
        }
        let cost = Duration::from_secs_f64(bytes as f64 / (mbps as f64 * 1e6));
        let done = {
            let mut free = self.bcast.egress_free.lock();
            let now = tokio::time::Instant::now();
            let start = free.map_or(now, |f| f.max(now));
            *free = Some(start + cost);
            start + cost
        };
        tokio::time::sleep_until(done).await;
    }

    /// A chunk arrived: kept, passed on down the chains, and on the last
    /// one the object is checked and kept, and the outcomes of this node
    /// and the nodes below it are the reply.
    pub(super) async fn on_chunk(&self, body: &Bytes) -> Result<Bytes, SluiceError> {
        let (h, data) = decode(body.clone())?;
        let last = h.offset + data.len() as u64 >= h.total;
        let reports = {
            let mut asm = self.bcast.assemblies.lock();
            if h.offset == 0 && !asm.contains_key(&h.id) {
                if h.total > 4 << 30 {
                    return Err(SluiceError::invalid_argument(
                        "broadcast",
                        format!("{} bytes is over the 4 GiB limit", h.total),
                    ));
                }
                asm.retain(|_, a| a.key != h.key);
                if asm.len() >= MAX_ASSEMBLIES {
                    return Err(unavailable(format!(
                        "node {} is receiving {MAX_ASSEMBLIES} broadcasts already; retry later",
                        self.id
                    )));
                }
                let (forwarders, reports) = self.start_forwarders(&h.next, h.fanout as usize);
                asm.insert(
                    h.id,
                    Assembly {
                        key: h.key.clone(),
                        buf: BytesMut::with_capacity(h.total as usize),
                        forwarders,
                        reports,
                    },
                );
            }
            let a = asm.get_mut(&h.id).ok_or_else(|| {
                SluiceError::protocol(format!(
                    "broadcast {} chunk at {} without its start",
                    h.id, h.offset
                ))
            })?;
            if a.buf.len() as u64 != h.offset {
                // A resend after a repair upstream: what is here already is kept.
                if (a.buf.len() as u64) < h.offset {
                    return Err(SluiceError::protocol(format!(
                        "broadcast {}: chunk at {} but {} bytes held",
                        h.id,
                        h.offset,
                        a.buf.len()
                    )));
                }
            } else {
                a.buf.extend_from_slice(&data);
                for f in &a.forwarders {
                    let _ = f.send((h.clone(), data.clone()));
                }
            }
            if !last {
                return Ok(Bytes::from_static(b"[]"));
            }
            let a = asm
                .remove(&h.id)
                .unwrap_or_else(|| unreachable!("held above"));
            let value = a.buf.freeze();
            let mine = if crc32c::crc32c(&value) == h.crc {
                self.bcast.received.write().insert(
                    h.key.clone(),
                    Arc::new(sluice_types::Object {
                        key: Arc::from(h.key.as_str()),
                        meta: h.meta,
                        value,
                        trace: None,
                    }),
                );
                tracing::info!(key = %h.key, version = h.meta.version, bytes = h.total, "broadcast received");
                Outcome {
                    node: self.id,
                    error: None,
                }
            } else {
                tracing::error!(key = %h.key, "broadcast received with a wrong checksum; not kept");
                Outcome {
                    node: self.id,
                    error: Some("checksum mismatch: the object was not kept".into()),
                }
            };
            drop(a.forwarders);
            (mine, a.reports)
        };
        let (mine, handles) = reports;
        let mut all = vec![mine];
        for h in handles {
            all.extend(h.await.unwrap_or_default());
        }
        serde_json::to_vec(&all)
            .map(Bytes::from)
            .map_err(|e| SluiceError::Internal {
                reason: e.to_string(),
            })
    }

    /// Keys received by broadcast here, with their versions and sizes.
    pub fn broadcast_status(&self) -> serde_json::Value {
        let r = self.bcast.received.read();
        let mut keys: Vec<_> = r
            .values()
            .map(|o| json!({"key": &*o.key, "version": o.meta.version, "bytes": o.value.len()}))
            .collect();
        keys.sort_by(|a, b| a["key"].as_str().cmp(&b["key"].as_str()));
        json!({"node": self.id, "received": keys})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_types::cluster::NodeSpec;

    fn layout(racks: &[&str]) -> ClusterLayout {
        ClusterLayout {
            version: 1,
            consensus: Default::default(),
            nodes: racks
                .iter()
                .enumerate()
                .map(|(i, r)| NodeSpec {
                    id: i as u32,
                    address: format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                    name: None,
                    labels: [("rack".to_string(), r.to_string())].into(),
                })
                .collect(),
            subgroups: Default::default(),
        }
    }

    #[test]
    fn a_chain_crosses_each_rack_boundary_once() {
        // Racks interleaved by id: a chain by id would cross 5 times.
        let l = layout(&["a", "b", "a", "b", "a", "b"]);
        let (order, crossings, optimum) = chain_order(&l, 0, &[1, 2, 3, 4, 5]);
        assert_eq!(order, vec![2, 4, 1, 3, 5]);
        assert_eq!((crossings, optimum), (1, 1));
        // From a source outside every target's rack.
        let l = layout(&["c", "b", "a", "b", "a"]);
        let (order, crossings, optimum) = chain_order(&l, 0, &[1, 2, 3, 4]);
        assert_eq!(order, vec![2, 4, 1, 3]);
        assert_eq!((crossings, optimum), (2, 2));
    }

    #[test]
    fn chunks_round_trip_and_chains_split() {
        let h = ChunkHeader {
            id: 7,
            key: "/m/k".into(),
            meta: sluice_types::ObjectMeta {
                version: 3,
                timestamp_us: 1,
                previous_version: 2,
                previous_version_by_key: 2,
                tombstone: false,
            },
            offset: 4,
            total: 10,
            crc: 1,
            fanout: 2,
            next: vec![3, 4],
        };
        let mut body = encode_head(&h).to_vec();
        body.extend_from_slice(b"abc");
        let (back, data) = decode(Bytes::from(body)).unwrap();
        assert_eq!(
            (back.id, back.next, &data[..]),
            (7, vec![3, 4], &b"abc"[..])
        );
        assert!(decode(Bytes::from_static(b"\xff\xff\xff\x00")).is_err());
        assert_eq!(split(&[1, 2, 3, 4, 5], 2), vec![vec![1, 2, 3], vec![4, 5]]);
        assert_eq!(split(&[1, 2], 1), vec![vec![1, 2]]);
        assert_eq!(split(&[1], 4), vec![vec![1]]);
    }
}
