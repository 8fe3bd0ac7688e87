//! The write path: puts batched per group (one log entry and one fsync
//! for many), proposals, forwarding to the leader, and lambdas' trigger
//! puts forwarded to a trigger shard of other nodes.

use super::*;
use sluice_types::retry::{follow_leader, Step};

/// A put waiting for its turn, and where its result goes.
pub(super) type Queued = (
    Command,
    tokio::sync::oneshot::Sender<Result<Applied, SluiceError>>,
);

/// Proposals of one group's puts. Puts that arrive while earlier ones are
/// in flight wait here and then go as one `Command::Batch`: one log
/// entry, one fsync. At most
/// `BATCHES_IN_FLIGHT` proposers run; a put that finds them all busy is
/// left in the queue for them (they drain it before they stop).
#[derive(Default)]
pub(super) struct Batcher {
    pub(super) queue: std::collections::VecDeque<Queued>,
    pub(super) proposers: usize,
}

/// Proposers at once: one being appended while another is replicated.
pub(super) const BATCHES_IN_FLIGHT: usize = 2;

impl Batcher {
    /// Takes the puts at the head of the queue that fit one batch
    /// (`types::batch_len`); with none left, this proposer stops (under
    /// the same lock as the check a new put makes, so no put is left
    /// without a proposer).
    pub(super) fn take(&mut self) -> Vec<Queued> {
        let n = crate::types::batch_len(self.queue.iter().map(|(cmd, _)| match cmd {
            Command::Write { key, value, .. } => key.len() + value.as_ref().map_or(0, |v| v.len()),
            _ => 0,
        }));
        let out: Vec<Queued> = self.queue.drain(..n).collect();
        if out.is_empty() {
            self.proposers -= 1;
        }
        out
    }
}

impl ClusterNode {
    pub(super) async fn propose(&self, g: &Group, cmd: Command) -> Result<Applied, SluiceError> {
        self.propose_at(g, cmd).await.map(|(_, a)| a)
    }

    /// `propose`, also returning the entry's log index.
    pub(super) async fn propose_at(
        &self,
        g: &Group,
        cmd: Command,
    ) -> Result<(u64, Applied), SluiceError> {
        self.check_leader(g)?;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let asked = crate::marks::on().then(crate::marks::now_ns);
        let res = tokio::time::timeout(t, g.core.write(cmd)).await;
        if let (Some(ns), Ok(Ok((index, _)))) = (asked, &res) {
            use sluice_types::marks::Point;
            crate::marks::mark_at(ns, Point::Propose, g.id, *index);
            crate::marks::mark(Point::Done, g.id, *index);
        }
        match res {
            Err(_) => Err(unavailable(format!(
                "shard {}: the write was not committed within {} ms; the shard may have lost its majority (outcome unknown: retry with the same request id)",
                group_name(g.id),
                t.as_millis()
            ))),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(CoreError::NotLeader(leader))) => Err(self.not_leader(g.id, leader)),
            // A storage error (a failed write or fsync of the log) stops
            // this replica's group for good: the other members elect a
            // leader and serve on; this node serves the shard again only
            // after a restart re-reads and checks its files. A group
            // stopped before the write came is no leader (`check_leader`):
            // this one stopped with the write in flight, which the
            // followers may still commit.
            Ok(Err(CoreError::Stopped(f))) => Err(unavailable(format!(
                "shard {}: stopped on node {} ({f}) with this write in flight: its outcome is unknown (the other members may commit it: a client retries it under its request id). The other members serve the shard, this node only after a restart (check its disk: `sluice fsck`)",
                group_name(g.id),
                self.id
            ))),
            Ok(Err(CoreError::Other(e))) => Err(unavailable(format!(
                "shard {}: {e}",
                group_name(g.id)
            ))),
        }
    }

    /// Proposes a put with whatever other puts are waiting (see
    /// `Batcher`). A put that finds a free proposer slot proposes the
    /// queue's head itself (a lone put goes at once, as it is); if puts
    /// queued up meanwhile, a task takes the slot over and drains them.
    /// A put that finds every slot busy waits for a proposer to take it.
    pub(super) async fn propose_write(
        &self,
        g: &Arc<Group>,
        cmd: Command,
    ) -> Result<Applied, SluiceError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let propose = {
            let mut b = g.batch.lock();
            b.queue.push_back((cmd, tx));
            let free = b.proposers < BATCHES_IN_FLIGHT;
            b.proposers += usize::from(free);
            free
        };
        // Boxed: proposing is a large future, and only the writer that takes a free proposer slot
        // runs it; every write's task would otherwise be spawned and moved
        // with its space (`Conn::defer`).
        if propose && Box::pin(self.propose_batch(g)).await {
            let more = {
                let mut b = g.batch.lock();
                let more = !b.queue.is_empty();
                b.proposers -= usize::from(!more);
                more
            };
            if more {
                match self.me.get().and_then(std::sync::Weak::upgrade) {
                    Some(node) => {
                        let g = g.clone();
                        tokio::spawn(async move { while node.propose_batch(&g).await {} });
                    }
                    // Shutting down: this proposer drains what is left.
                    None => while Box::pin(self.propose_batch(g)).await {},
                }
            }
        }
        rx.await.map_err(|_| SluiceError::Internal {
            reason: "a batched write was dropped before it was proposed".into(),
        })?
    }

    /// Proposes one batch from the head of the queue and hands every put
    /// its result; false (and the slot given up) when the queue is empty.
    pub(super) async fn propose_batch(&self, g: &Group) -> bool {
        let taken = g.batch.lock().take();
        if taken.is_empty() {
            return false;
        }
        let (mut cmds, txs): (Vec<Command>, Vec<_>) = taken.into_iter().unzip();
        let cmd = match cmds.len() {
            1 => cmds.remove(0),
            // Only puts and removes are queued here.
            _ => Command::Batch(cmds.into_iter().filter_map(Command::into_batched).collect()),
        };
        let n = txs.len();
        match self.propose(g, cmd).await {
            Ok(Applied::Batch(rs)) if rs.len() == n => {
                for (tx, r) in txs.into_iter().zip(rs) {
                    let _ = tx.send(Ok(r));
                }
            }
            Ok(r) if n == 1 => {
                txs.into_iter().for_each(|tx| drop(tx.send(Ok(r.clone()))));
            }
            Ok(other) => {
                let e = SluiceError::Internal {
                    reason: format!("unexpected apply result for a batch of {n}: {other:?}"),
                };
                txs.into_iter().for_each(|tx| drop(tx.send(Err(e.clone()))));
            }
            Err(e) => txs.into_iter().for_each(|tx| drop(tx.send(Err(e.clone())))),
        }
        true
    }

    /// Replicates a put (`value: Some`) or remove: answered once a
    /// majority of the shard has it and this leader applied it.
    #[allow(clippy::too_many_arguments)]
    pub async fn write(
        &self,
        shard: ShardId,
        key: String,
        value: Option<bytes::Bytes>,
        expected: Option<u64>,
        req_id: Option<ReqId>,
        trace: Option<Trace>,
    ) -> Result<PutResult, SluiceError> {
        let g = self.local(shard)?;
        if let Some(v) = value.as_ref().filter(|_| self.store.memory.limited()) {
            // The leader's memory limit, before the write is proposed: a
            // replica never refuses a committed write (they would differ).
            self.check_leader(&g)?;
            self.store.admit(v.len())?;
        }
        let cmd = Command::Write {
            key,
            value,
            expected,
            timestamp_us: self.store.clock().now_us(),
            req_id,
            trace,
        };
        match self.propose_write(&g, cmd).await? {
            Applied::Put(r) => r.map_err(|e| Applied::decode_err(&e)),
            other => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// A put from inside the node (a lambda's emit) to a replicated shard:
    /// proposed here when this node leads the shard, else forwarded to the
    /// leader (following hints, trying members while none is known). One
    /// request id across retries: applied once.
    pub async fn write_anywhere(
        &self,
        shard: ShardId,
        key: String,
        value: bytes::Bytes,
        trace: Option<Trace>,
    ) -> Result<PutResult, SluiceError> {
        let g = group_of(shard).ok_or_else(|| SluiceError::Internal {
            reason: format!("shard {shard} is not replicated"),
        })?;
        let req_id = Some(ReqId {
            client: self.writer_id,
            seq: self
                .writer_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        let req = sluice_wire::Request::Put {
            key: key.clone(),
            shard: Some(shard.shard),
            expected: None,
            value: value.clone(),
            trace: trace.clone(),
            req_id,
        };
        self.at_leader(
            g,
            || {
                self.write(
                    shard,
                    key.clone(),
                    Some(value.clone()),
                    None,
                    req_id,
                    trace.clone(),
                )
            },
            &req,
            |r| match r {
                sluice_wire::Response::PutOk(p) => Ok(p),
                other => Err(SluiceError::protocol(format!(
                    "unexpected reply to a forwarded put: {other:?}"
                ))),
            },
        )
        .await
    }

    /// Runs an operation on `group`'s leader: `here()` when this node
    /// leads it, else `req` sent to the leader, its reply read by `reply`.
    /// Follows leader hints, and tries the members in turn while none is
    /// known, until the write timeout.
    pub(super) async fn at_leader<T, H, F>(
        &self,
        group: u64,
        mut here: H,
        req: &sluice_wire::Request,
        reply: impl Fn(sluice_wire::Response) -> Result<T, SluiceError>,
    ) -> Result<T, SluiceError>
    where
        H: FnMut() -> F,
        F: std::future::Future<Output = Result<T, SluiceError>>,
    {
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let deadline = std::time::Instant::now() + t;
        let mut attempt = 0usize;
        follow_leader(deadline, |hint| {
            let known = self
                .groups
                .read()
                .get(&group)
                .and_then(|x| x.core.leader())
                .map(|l| l as u32);
            let members = self.members_of(group);
            let target = hint
                .or(known)
                .or_else(|| (!members.is_empty()).then(|| members[attempt % members.len()]));
            attempt += 1;
            let local = (target == Some(self.id)).then(&mut here);
            let reply = &reply;
            async move {
                let r = match (local, target) {
                    (Some(f), _) => f.await,
                    (None, Some(l)) => match self.layout.address_of(l) {
                        Some(addr) => self
                            .peers
                            .request(l, &addr.to_string(), req, t)
                            .await
                            .and_then(reply),
                        None => Err(self.not_leader(group, None)),
                    },
                    (None, None) => Err(self.not_leader(group, None)),
                };
                let step = match &r {
                    Err(SluiceError::NotLeader {
                        leader: Some(l), ..
                    }) => Step::Follow(*l),
                    // A member whose group has not learned its membership
                    // yet (just started, or just added) says NotMember: it
                    // or another member will take the request shortly.
                    Err(
                        SluiceError::NotLeader { .. }
                        | SluiceError::NotMember { .. }
                        | SluiceError::Connection { .. }
                        | SluiceError::Unavailable { .. },
                    ) => Step::Pause,
                    _ => Step::Done,
                };
                (r, step)
            }
        })
        .await
    }
}

/// A member a forwarded trigger put could not reach is tried last for
/// this long (then first again for its keys, one put finding out): a
/// member paused or behind a dead link costs one try this often, not one
/// per put.
const UNREACHED_FOR: Duration = Duration::from_secs(5);

/// The longest one try of a forwarded trigger put waits for its answer
/// (a member answers once it has queued the call: a client's
/// `attempt_timeout` too).
const FORWARD_TRY: Duration = Duration::from_secs(1);

impl ClusterNode {
    /// A lambda's trigger put to a trigger shard of other nodes: to the
    /// member its key hashes to (a key's upcalls stay in order there),
    /// and, when that one cannot be reached (nothing listens, the link is
    /// cut, no answer in time), to the next, as a client's trigger put
    /// goes on to another member; members that could not be reached in
    /// the last `UNREACHED_FOR` go last. An answer (an error included,
    /// say a full upcall queue) is final. Before, a member down failed
    /// every forwarded trigger put whose key hashed to it: with one of a
    /// shard's two members killed, half of a pipeline's items were lost.
    pub(super) async fn forward_trigger_put(
        &self,
        members: &[u32],
        key: &str,
        req: &sluice_wire::Request,
    ) -> Result<u64, SluiceError> {
        let n = members.len();
        let first = (sluice_types::fnv1a64(key.as_bytes()) % n as u64) as usize;
        let mut order: Vec<u32> = (0..n).map(|i| members[(first + i) % n]).collect();
        {
            let now = std::time::Instant::now();
            let unreached = self.unreached.lock();
            let recently = |m: &u32| {
                unreached
                    .get(m)
                    .is_some_and(|t| now.duration_since(*t) < UNREACHED_FOR)
            };
            order.sort_by_key(recently); // stable: hash order otherwise
        }
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let deadline = tokio::time::Instant::now() + t;
        let per_try = (t / n as u32).clamp(Duration::from_millis(100), FORWARD_TRY);
        let mut last = None;
        for m in order {
            let Some(addr) = self.layout.address_of(m).map(|a| a.to_string()) else {
                continue;
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let try_for = per_try.min(left);
            let r = tokio::time::timeout(try_for, self.peers.request(m, &addr, req, try_for)).await;
            match r {
                Ok(Ok(sluice_wire::Response::PutOk(p))) => {
                    self.unreached.lock().remove(&m);
                    return Ok(p.timestamp_us);
                }
                Ok(Ok(sluice_wire::Response::Error(e))) => return Err(e),
                Ok(Ok(other)) => {
                    return Err(SluiceError::protocol(format!(
                        "unexpected reply to a forwarded trigger put: {other:?}"
                    )))
                }
                // Not delivered, or no answer: the next member.
                Ok(Err(
                    e @ (SluiceError::Connection { .. }
                    | SluiceError::Timeout { .. }
                    | SluiceError::Unavailable { .. }),
                )) => last = Some(e),
                Err(_) => {
                    last = Some(SluiceError::Timeout {
                        what: format!("a trigger put forwarded to node {m}"),
                        after_ms: try_for.as_millis() as u64,
                    })
                }
                Ok(Err(e)) => return Err(e),
            }
            tracing::debug!(
                node = m,
                key,
                "forwarded trigger put: member not reached, trying the next"
            );
            self.unreached.lock().insert(m, std::time::Instant::now());
        }
        Err(last.unwrap_or_else(|| SluiceError::Unavailable {
            reason: format!("no member of the trigger shard of {key:?} has an address"),
        }))
    }
}
