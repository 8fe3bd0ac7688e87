//! Groups on the raft-rs driver (`crate::raftrs`, the default): starting
//! a group over its log and state machine, peers' messages handed to it
//! as they arrive (by the receiving connection itself: no task per
//! message), and membership changes.

use super::*;
use crate::raftrs::{
    self, transport::PeerTransport, DriverError, DriverSettings, GroupHandle, MemberChange,
};
use sluice_types::marks::Point;

/// How long a newcomer may take nothing of its shard's log before
/// `add-member` checks whether it runs at all (well within a client's
/// default 10 s request timeout).
const NEWCOMER_SILENT: Duration = Duration::from_secs(2);

impl ClusterNode {
    /// The transport every raft-rs group of this node sends through.
    fn rs_transport(&self) -> Arc<PeerTransport> {
        self.rs_transport
            .get_or_init(|| {
                let addresses = self
                    .layout
                    .nodes
                    .iter()
                    .map(|n| (u64::from(n.id), n.address.to_string()))
                    .collect();
                PeerTransport::new(self.peers.clone(), addresses)
            })
            .clone()
    }

    /// The driver's settings from the node's `[cluster]` settings: a tick
    /// per heartbeat, elections after `election_min_ms`-`election_max_ms`
    /// (in whole ticks, at least two), snapshots by entries and
    /// bytes (`snapshot_every`, `snapshot_limit`).
    pub(super) fn driver_settings(&self, g: u64) -> DriverSettings {
        let hb = self.settings.heartbeat_ms.max(1);
        let ticks = |ms: u64| usize::try_from(ms.div_ceil(hb)).unwrap_or(usize::MAX);
        let min = ticks(self.settings.election_min_ms).max(2);
        DriverSettings {
            tick: Duration::from_millis(hb),
            election_ticks: (min, ticks(self.settings.election_max_ms).max(min + 1)),
            snapshot_every: self.settings.snapshot_every,
            snapshot_bytes: self.snapshot_limit(g),
            guard_lost_state: true,
            ..Default::default()
        }
    }

    /// Starts shard group `g` on the raft-rs driver, its members the
    /// layout's (or the metadata group's record of them).
    pub(super) fn start_raftrs(
        &self,
        g: u64,
        log: LogStore,
        sm: Sm,
    ) -> Result<Arc<Group>, SluiceError> {
        // The metadata group is every node of the layout.
        let members = match g {
            META_GROUP => self.layout.nodes.iter().map(|n| n.id).collect(),
            _ => self.members_of(g),
        };
        let voters: Vec<u64> = members.into_iter().map(u64::from).collect();
        let handle = raftrs::start(
            g,
            u64::from(self.id),
            &voters,
            log.clone(),
            sm.clone(),
            self.rs_transport(),
            &self.driver_settings(g),
        )
        .map_err(|e| SluiceError::Internal {
            reason: format!("starting replication group {}: {e}", group_name(g)),
        })?;
        let lost = handle.borrow_status().lost != raftrs::LostState::No;
        let group = Group::new(g, Core { handle }, sm, log);
        if let (true, Some(node)) = (lost, self.me.get().and_then(std::sync::Weak::upgrade)) {
            let watched = group.clone();
            tokio::spawn(async move { node.watch_lost_state(&watched).await });
        }
        Ok(group)
    }

    /// A group that started with nothing holds back its vote
    /// (`raftrs/lost.rs`): asks the other voters every 100 ms what they
    /// hold, and lets it vote (and stand) once a majority holds nothing
    /// too, until it has caught up from a leader or stopped.
    async fn watch_lost_state(&self, g: &Group) {
        use raftrs::LostState;
        let me = u64::from(self.id);
        loop {
            let (lost, voters) = {
                let st = g.core.handle.borrow_status();
                if st.stopped.is_some() {
                    return;
                }
                (st.lost, st.members.voters.clone())
            };
            if lost == LostState::No {
                return;
            }
            let asks = voters
                .iter()
                .filter(|n| **n != me)
                .map(|n| self.held_by(g.id, *n));
            let held = futures_util::future::join_all(asks).await;
            let empty = 1 + held.iter().filter(|h| **h == Some(0)).count();
            let holding = held.iter().filter(|h| h.is_some_and(|c| c > 0)).count();
            if 2 * empty > voters.len() {
                let to = if holding == 0 {
                    LostState::No
                } else {
                    LostState::VoteOnly
                };
                tracing::info!(group = %group_name(g.id), empty, holding, voters = voters.len(), to = to.as_str(), "a majority of the members started with no state too");
                g.core.handle.lost_state(to);
                if to == LostState::No {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How far member `node` has committed group `g` (0: it holds
    /// nothing, or holds back as this one does), or `None` if it did not
    /// answer within 500 ms.
    async fn held_by(&self, g: u64, node: u64) -> Option<u64> {
        let node = u32::try_from(node).ok()?;
        let addr = self.layout.address_of(node)?;
        let req = sluice_wire::Request::Cluster {
            command: json!({"op": "held", "group": g}).to_string(),
        };
        let t = Duration::from_millis(500);
        match self.peers.request(node, &addr.to_string(), &req, t).await {
            Ok(sluice_wire::Response::Json(j)) => serde_json::from_str::<serde_json::Value>(&j)
                .ok()
                .and_then(|v| v["committed"].as_u64()),
            _ => None,
        }
    }

    /// A raft-rs message from node `from` (`raftrs::transport`): decoded
    /// and handed to its group, which steps it in its next turn.
    pub fn deliver_raftrs(
        &self,
        from: u32,
        group: u64,
        body: &bytes::Bytes,
    ) -> Result<(), SluiceError> {
        if self.peers.is_blocked(from) {
            return Err(unavailable(format!(
                "link from node {from} is cut (fault injection)"
            )));
        }
        let Some(g) = self.groups.read().get(&group).cloned() else {
            // A leader's first message to a member it just added: the
            // group starts here, empty (its log and configuration come
            // from the leader). This message is dropped: raft-rs sends
            // again.
            let node = self.me.get().and_then(|w| w.upgrade());
            if let Some(node) = node.filter(|_| self.starting.lock().insert(group)) {
                tokio::spawn(async move {
                    if let Err(e) = node.ensure_group(group).await {
                        tracing::warn!(group, from, error = %e, "a raft-rs message for a group this node cannot start");
                    }
                    node.starting.lock().remove(&group);
                });
            }
            return Ok(());
        };
        let handle = &g.core.handle;
        let (msg, commands) = raftrs::wire::decode(body)?;
        if msg.get_msg_type() == raft::eraftpb::MessageType::MsgAppend {
            g.appends_received.count(msg.entries.is_empty());
            if crate::marks::on() {
                let ix = msg.entries.iter().map(|e| e.index);
                crate::marks::mark_all(Point::Recv, group, ix, self.id.into());
            }
        }
        if !handle.deliver(msg, commands, body.len()) {
            tracing::debug!(group = %group_name(group), from, "a raft-rs message dropped: the group's queue is full");
        }
        Ok(())
    }
}

impl ClusterNode {
    /// A membership change of a raft-rs group, at its leader; the voters
    /// after it. A newcomer joins as a learner and is promoted once its
    /// log has caught up with the leader's commit index as it was when it
    /// joined (from the log, or a snapshot); a member is removed in one step. A leader asked to remove
    /// itself first hands its leadership to the voter furthest along and
    /// answers `NotLeader` naming it: the client asks again there.
    pub(super) async fn change_raftrs(
        &self,
        g: &Group,
        handle: &GroupHandle,
        shard: &str,
        node: u32,
        add: bool,
    ) -> Result<BTreeSet<u64>, SluiceError> {
        if self.layout.address_of(node).is_none() {
            return Err(SluiceError::invalid_argument(
                format!("node {node}"),
                "it is not in the layout's [[nodes]]",
            ));
        }
        let n = u64::from(node);
        let me = u64::from(self.id);
        let members = handle.borrow_status().members.clone();
        let err = |e: DriverError| match e {
            DriverError::NotLeader { leader, .. } => self.not_leader(g.id, leader),
            e => unavailable(format!("membership change of {shard}: {e}")),
        };
        if add {
            if members.voters.contains(&n) {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is already a member of {shard}"),
                ));
            }
            if !members.learners.contains(&n) {
                handle
                    .change_members(MemberChange::AddLearner(n))
                    .await
                    .map_err(err)?;
            }
            let target = handle.borrow_status().commit;
            // `catch_up_wait_ms`: then the newcomer stays a learner.
            let wait = Duration::from_millis(self.settings.catch_up_wait_ms);
            let deadline = std::time::Instant::now() + wait;
            let tick = Duration::from_millis(self.settings.heartbeat_ms.max(1));
            // A newcomer that is not running would keep this waiting for
            // the whole catch_up_wait_ms (10 minutes by default), long
            // after its client gave up with a bare timeout: once it has
            // taken nothing for a while, nothing listening at its address
            // ends the wait, saying so.
            let started = std::time::Instant::now();
            let mut probed = false;
            while handle.matched().get(&n).copied().unwrap_or(0) < target {
                if !handle.borrow_status().is_leader {
                    return Err(self.not_leader(g.id, handle.borrow_status().leader));
                }
                if !probed
                    && started.elapsed() >= NEWCOMER_SILENT
                    && handle.matched().get(&n).copied().unwrap_or(0) == 0
                {
                    probed = true;
                    let addr = self.layout.address_of(node);
                    if let Some(a) = addr {
                        if super::failover::probe(&a).await == super::failover::Probe::Gone {
                            return Err(unavailable(format!(
                                "node {node} is not running (nothing listens at {a}); it was added to {shard} as a learner and catches up once it starts: run add-member again then to make it a voter"
                            )));
                        }
                    }
                }
                if std::time::Instant::now() > deadline {
                    return Err(unavailable(format!(
                        "node {node} has not caught up with {shard} within {} ms (catch_up_wait_ms); it stays a learner (run add-member again to promote it once it has)",
                        wait.as_millis()
                    )));
                }
                // The leader's view of its followers is published each tick.
                tokio::time::sleep(tick).await;
            }
            handle
                .change_members(MemberChange::Promote(n))
                .await
                .map_err(err)?;
        } else {
            if !members.contains(n) {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is not a member of {shard}"),
                ));
            }
            if members.voters.iter().all(|v| *v == n) {
                return Err(SluiceError::invalid_argument(
                    format!("node {node}"),
                    format!("it is the last member of {shard}, which cannot be removed"),
                ));
            }
            if n == me && members.voters.contains(&n) {
                let led = self.hand_over(g, handle).await?;
                return Err(self.not_leader(g.id, Some(led)));
            }
            handle
                .change_members(MemberChange::Remove(n))
                .await
                .map_err(err)?;
        }
        Ok(handle.borrow_status().members.voters.clone())
    }

    /// Hands this leader's leadership of `g` to another voter, the one
    /// whose log is furthest along first (raft-rs's leader transfer: the
    /// voter is brought up to date, then stands at once); the new leader
    /// once one is known. A voter whose process is gone (nothing listens
    /// at its address: the whole cluster may be stopping) is passed over
    /// for the next at once, one that does not take over within an
    /// election timeout (cut off) after it; all within two.
    async fn hand_over(&self, g: &Group, handle: &GroupHandle) -> Result<u64, SluiceError> {
        let me = u64::from(self.id);
        // (A leader that has just taken over knows no follower's progress
        // yet: every voter is a candidate.)
        let matched = handle.matched();
        let mut next: Vec<(u64, u64)> = handle
            .borrow_status()
            .members
            .voters
            .iter()
            .filter(|n| **n != me)
            .map(|n| (*n, matched.get(n).copied().unwrap_or(0)))
            .collect();
        next.sort_by_key(|(n, m)| (std::cmp::Reverse(*m), *n));
        if next.is_empty() {
            return Err(unavailable(format!(
                "{} has no other voter to hand its leadership to",
                group_name(g.id)
            )));
        }
        let wait = Duration::from_millis(2 * self.settings.election_max_ms);
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = handle.status();
        let mut all_gone = true;
        for (to, _) in next {
            tracing::info!(group = %group_name(g.id), to, "handing leadership over");
            handle.transfer_leader(to);
            let gone = async {
                let Some(addr) = u32::try_from(to)
                    .ok()
                    .and_then(|n| self.layout.address_of(n))
                else {
                    return std::future::pending().await;
                };
                while super::failover::probe(&addr).await != super::failover::Probe::Gone {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            // raft-rs gives a transfer up after an election timeout (a
            // member alive but cut off never stands): then the next.
            let this_one = deadline.min(
                tokio::time::Instant::now() + Duration::from_millis(self.settings.election_max_ms),
            );
            let led = rx.wait_for(|s| !s.is_leader && s.leader.is_some());
            tokio::select! {
                r = tokio::time::timeout_at(this_one, led) => match r {
                    Ok(Ok(s)) => return s.leader.ok_or_else(|| unavailable("no leader".into())),
                    Ok(Err(_)) => return Err(unavailable(format!("{} stopped", group_name(g.id)))),
                    Err(_) if this_one < deadline => {
                        all_gone = false;
                        tracing::info!(group = %group_name(g.id), to, "that member did not take over; trying the next")
                    }
                    Err(_) => {
                        all_gone = false;
                        break;
                    }
                },
                _ = gone => tracing::info!(group = %group_name(g.id), to, "that member is gone; trying the next"),
            }
        }
        if !all_gone {
            return Err(unavailable(format!(
                "{}: leadership was not handed over within {} ms; try again",
                group_name(g.id),
                wait.as_millis()
            )));
        }
        Err(unavailable(format!(
            "{}: every other voter has stopped (nothing listens at its address)",
            group_name(g.id)
        )))
    }

    /// The groups running here with another voter that `keep` takes
    /// (given the group and its status): those a stop acts on.
    fn running_groups(
        &self,
        keep: impl Fn(&Group, &crate::raftrs::GroupStatus) -> bool,
    ) -> Vec<Arc<Group>> {
        self.groups
            .read()
            .values()
            .filter(|g| {
                let st = g.core.handle.borrow_status();
                st.stopped.is_none() && st.members.voters.len() > 1 && keep(g, &st)
            })
            .cloned()
            .collect()
    }

    /// Before this node stops (SIGTERM, Ctrl-C): hands the leadership of
    /// every group it leads to another voter, all at once, as etcd's
    /// members do on a graceful stop. Clients then find the new leader by
    /// the hints they are given instead of waiting for an election after
    /// the process is gone (the failover of a dead leader, `failover`), so
    /// a rolling restart does not pause writes. A group with no other
    /// voter, or a stopped one, stays as it is. Returns the groups handed
    /// over; each failure is logged and the stop goes on.
    pub async fn hand_over_leadership(&self) -> usize {
        let led = self.running_groups(|_, st| st.is_leader);
        let tries = led.iter().map(|g| async move {
            let r = self.hand_over(g, &g.core.handle).await;
            match &r {
                Ok(to) => tracing::info!(group = %group_name(g.id), to, "leadership handed over before stopping"),
                Err(e) => tracing::warn!(group = %group_name(g.id), error = %e, "stopping while still the leader"),
            }
            r.is_ok()
        });
        let handed = futures_util::future::join_all(tries).await;
        handed.into_iter().filter(|ok| *ok).count()
    }

    /// Before this node stops, after `hand_over_leadership`: tells the
    /// leader of every data shard it is a member of that it is stopping
    /// (from the leader's next write on, the others take its share of the
    /// lambdas dispatched to one member: `raftrs/down.rs`), and applies
    /// every write the leader had by then, so the lambdas of the writes
    /// that still name it are queued here; the caller then waits for them
    /// to run (`Engine::pending`). A stop dropped the lambdas queued on
    /// it, for good (a put applied here before is not run again after a
    /// restart). At most `within`; returns the shards done, and logs the
    /// others.
    pub async fn leave_lambdas(&self, within: Duration) -> usize {
        let me = u64::from(self.id);
        let shards = self.running_groups(|g, _| g.id != META_GROUP);
        let leave = shards.iter().map(|g| async move {
            let req = sluice_wire::Request::Cluster {
                command: json!({"op": "leaving", "group": g.id, "node": me}).to_string(),
            };
            let leave = async {
                let index = self
                    .at_leader(g.id, || self.mark_leaving(g, me), &req, |r| match r {
                        sluice_wire::Response::Json(j) => {
                            serde_json::from_str::<serde_json::Value>(&j)
                                .ok()
                                .and_then(|v| v["index"].as_u64())
                                .ok_or_else(|| {
                                    SluiceError::protocol(format!("bad reply to leaving: {j}"))
                                })
                        }
                        other => Err(SluiceError::protocol(format!(
                            "unexpected reply to leaving: {other:?}"
                        ))),
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                g.core
                    .wait_applied(index, within, "applying before stopping")
                    .await
            };
            // The others stopping too (a whole cluster stopped at once):
            // no leader to tell and nothing more committed, so nothing to
            // wait for.
            let r = tokio::select! {
                r = leave => r,
                () = self.majority_gone(g) => Err("the shard's other members have stopped too".into()),
            };
            if let Err(e) = &r {
                tracing::warn!(group = %group_name(g.id), error = %e, "stopping without the shard's leader counting this node out of its lambdas");
            }
            r.is_ok()
        });
        let left = tokio::time::timeout(within, futures_util::future::join_all(leave)).await;
        left.map_or(0, |l| l.into_iter().filter(|ok| *ok).count())
    }

    /// Ends once too few of the group's voters listen for it to commit
    /// (this node counted as one of them), probed every 20 ms.
    async fn majority_gone(&self, g: &Group) {
        let voters = g.core.handle.borrow_status().members.voters.clone();
        let others: Vec<sluice_types::cluster::NodeAddr> = voters
            .iter()
            .filter(|n| **n != u64::from(self.id))
            .filter_map(|n| {
                u32::try_from(*n)
                    .ok()
                    .and_then(|n| self.layout.address_of(n))
            })
            .collect();
        loop {
            let probes = others.iter().map(super::failover::probe);
            let gone = futures_util::future::join_all(probes).await;
            let alive = gone
                .iter()
                .filter(|p| !matches!(p, super::failover::Probe::Gone))
                .count();
            if 2 * (alive + 1) <= voters.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Leader side of `leave_lambdas`: member `node` is stopping; the last
    /// log index.
    pub(super) async fn mark_leaving(&self, g: &Group, node: u64) -> Result<u64, SluiceError> {
        match g.core.handle.leaving(node).await {
            Ok(index) => Ok(index),
            Err(DriverError::NotLeader { leader, .. }) => Err(self.not_leader(g.id, leader)),
            Err(e) => Err(unavailable(format!("{}: {e}", group_name(g.id)))),
        }
    }
}
