//! The read checks: a stable read served by a member that has applied
//! the session's newest version, leader read barriers, and time barriers
//! (a frontier committed after a timestamp).

use super::*;

impl ClusterNode {
    /// A stable read may be served here: this node is a member of the
    /// shard, has applied at least `min_version` (the newest version the
    /// client's session has seen), and is not applying again what it had
    /// applied before a restart.
    pub fn check_read(&self, shard: ShardId, min_version: Option<u64>) -> Result<(), SluiceError> {
        if !self.replicates(shard) {
            return Ok(());
        }
        let g = self.local(shard)?;
        if let Some((_, crate::sm::READS_HELD)) = g.sm.applying_again() {
            // Back with nothing, and no leader heard from yet: it would
            // answer "not found" for what the others hold.
            return Err(unavailable(format!(
                "shard {shard} on node {}: came back with no state and has not caught up from the leader yet; another member or the leader answers",
                self.id
            )));
        }
        if let Some((applied, before)) = g.sm.applying_again() {
            // Restarted and still applying what it had applied before: a
            // read here would see less than one it answered then.
            return Err(unavailable(format!(
                "shard {shard} on node {}: applying again the log it had applied before it restarted (entry {applied} of {before}); another member or the leader answers",
                self.id
            )));
        }
        if let Some(want) = min_version {
            let applied = self.store.shard(shard).map_or(0, |s| s.last_version());
            if applied < want {
                return Err(SluiceError::ReplicaBehind {
                    shard: shard.to_string(),
                    node: self.id,
                    applied,
                    wanted: want,
                });
            }
        }
        Ok(())
    }

    /// Waits until a linearizable read may be served here: this node is
    /// the leader (confirmed by a quorum now) and has applied everything
    /// committed before the read arrived.
    pub async fn read_barrier(&self, shard: ShardId) -> Result<(), SluiceError> {
        let g = self.local(shard)?;
        self.check_leader(&g)?;
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        match tokio::time::timeout(t, g.core.read_index()).await {
            Err(_) => Err(unavailable(format!(
                "shard {}: leadership not confirmed within {} ms (no quorum?)",
                group_name(g.id),
                t.as_millis()
            ))),
            Ok(Ok(())) => Ok(()),
            Ok(Err(CoreError::NotLeader(leader))) => Err(self.not_leader(g.id, leader)),
            Ok(Err(CoreError::Stopped(e) | CoreError::Other(e))) => {
                Err(unavailable(format!("shard {}: {e}", group_name(g.id))))
            }
        }
    }

    /// Waits until a read of `shard` at `timestamp_us` (already in the
    /// past) is stable on this member: no write it applies from now on
    /// can get a timestamp at or before it. Answered at once when this
    /// member has applied a write (or frontier) after that time; else the
    /// leader commits a time frontier (`Command::Tick`, stamped with its
    /// clock, which is past `timestamp_us`) and this member waits until it
    /// has applied it. Every entry before the frontier in the log is
    /// applied by then, and every later one is stamped above it.
    /// Assumes the members' clocks agree to within the time a new leader
    /// takes to be elected (one machine, or NTP).
    pub async fn time_barrier(&self, shard: ShardId, timestamp_us: u64) -> Result<(), SluiceError> {
        let g = self.local(shard)?;
        if self.store.visible_ts(shard) > timestamp_us {
            return Ok(());
        }
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let leader = g.core.leader().map(|l| l as u32);
        let index = match leader {
            Some(l) if l == self.id => self.tick(&g, timestamp_us).await?,
            Some(l) => {
                let addr = self
                    .layout
                    .address_of(l)
                    .ok_or_else(|| self.not_leader(g.id, None))?;
                let req = sluice_wire::Request::Cluster {
                    command:
                        json!({"op": "time_barrier", "group": g.id, "timestamp_us": timestamp_us})
                            .to_string(),
                };
                match self.peers.request(l, &addr.to_string(), &req, t).await? {
                    sluice_wire::Response::Json(j) => serde_json::from_str::<serde_json::Value>(&j)
                        .ok()
                        .and_then(|v| v["index"].as_u64())
                        .ok_or_else(|| {
                            SluiceError::protocol(format!("bad reply to a time barrier: {j}"))
                        })?,
                    other => {
                        return Err(SluiceError::protocol(format!(
                            "unexpected reply to a time barrier: {other:?}"
                        )))
                    }
                }
            }
            None => return Err(self.not_leader(g.id, None)),
        };
        g.core
            .wait_applied(index, t, "time barrier")
            .await
            .map_err(|e| unavailable(format!("shard {}: time barrier: {e}", group_name(g.id))))
    }

    /// Leader side of `time_barrier`: commits a frontier stamped after
    /// `timestamp_us`; returns its log index.
    pub(super) async fn tick(&self, g: &Group, timestamp_us: u64) -> Result<u64, SluiceError> {
        let mut now = self.store.clock().now_us();
        // Members ask only once the time has passed on their clock; more
        // than a write timeout ahead of ours is a bad request, not a wait.
        let slack = self.settings.write_timeout_ms * 1000;
        if timestamp_us > now.saturating_add(slack) {
            return Err(unavailable(format!(
                "time frontier at {timestamp_us} µs refused: {} ms ahead of this leader's clock (at most {} ms: the clocks disagree)",
                (timestamp_us - now) / 1000,
                self.settings.write_timeout_ms
            )));
        }
        while now <= timestamp_us {
            tokio::time::sleep(Duration::from_micros(timestamp_us + 1 - now)).await;
            now = self.store.clock().now_us();
        }
        let (index, _) = self
            .propose_at(g, Command::Tick { timestamp_us: now })
            .await?;
        Ok(index)
    }
}

impl ClusterNode {
    /// A read at another member of a shard: tried at each member (the
    /// known leader first) until one answers; a key that is not there is
    /// that answer, not a reason to try the next member. `linearizable`:
    /// only the leader answers (after confirming its leadership), so the
    /// read sees every write acknowledged before it.
    pub(super) async fn read_remote(
        &self,
        group: u64,
        mut members: Vec<u32>,
        key: String,
        shard: u32,
        at: sluice_compute::ReadAt,
        linearizable: bool,
    ) -> Result<Arc<sluice_types::Object>, SluiceError> {
        use sluice_compute::ReadAt;
        let leader = self
            .groups
            .read()
            .get(&group)
            .and_then(|x| x.core.leader())
            .map(|l| l as u32);
        if let Some(l) = leader {
            members.sort_by_key(|m| *m != l);
        }
        let req = match at {
            ReadAt::Latest | ReadAt::Version(_) => sluice_wire::Request::Get {
                key,
                shard: Some(shard),
                version: match at {
                    ReadAt::Version(v) => Some(v),
                    _ => None,
                },
                min_version: None,
                linearizable,
            },
            ReadAt::Time(t) => sluice_wire::Request::GetByTime {
                key,
                shard: Some(shard),
                timestamp_us: t,
                wait_ms: 0,
                unstable: false,
            },
        };
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let mut last = unavailable(format!("shard {} has no members", group_name(group)));
        for m in members {
            let Some(addr) = self.layout.address_of(m) else {
                continue;
            };
            match self.peers.request(m, &addr.to_string(), &req, t).await {
                Ok(sluice_wire::Response::Object(o)) => {
                    return Ok(Arc::new(sluice_types::Object {
                        key: Arc::from(o.key),
                        meta: o.meta,
                        value: o.value,
                        trace: o.trace.map(Arc::new),
                    }))
                }
                Ok(sluice_wire::Response::Error(e)) if !retry_elsewhere(&e) => return Err(e),
                Ok(sluice_wire::Response::Error(e)) => last = e,
                Ok(other) => {
                    last = SluiceError::protocol(format!("unexpected reply to a read: {other:?}"))
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// Whether a read error from one member may go away at another.
fn retry_elsewhere(e: &SluiceError) -> bool {
    matches!(
        e,
        SluiceError::Unavailable { .. }
            | SluiceError::NotLeader { .. }
            | SluiceError::NotMember { .. }
            | SluiceError::ReplicaBehind { .. }
            | SluiceError::Connection { .. }
            | SluiceError::Timeout { .. }
    )
}

impl ClusterNode {
    /// The latest version of `key` a member of its shard holds (asked of
    /// the members in turn; `version_of` answers from the member's copy).
    pub(super) async fn latest_version_remote(
        &self,
        _group: u64,
        members: Vec<u32>,
        key: String,
    ) -> Result<u64, SluiceError> {
        let req = sluice_wire::Request::Cluster {
            command: json!({"op": "version_of", "key": key}).to_string(),
        };
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let mut last = unavailable(format!("no member answered for {key}"));
        for m in members {
            let Some(addr) = self.layout.address_of(m) else {
                continue;
            };
            match self.peers.request(m, &addr.to_string(), &req, t).await {
                Ok(sluice_wire::Response::Json(j)) => {
                    if let Some(v) = serde_json::from_str::<serde_json::Value>(&j)
                        .ok()
                        .and_then(|v| v["version"].as_u64())
                    {
                        return Ok(v);
                    }
                }
                Ok(sluice_wire::Response::Error(e)) => last = e,
                Ok(_) => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}
