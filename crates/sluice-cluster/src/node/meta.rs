//! Metadata: pool table changes through the metadata group, purges of
//! removed pools on every shard, and catching up with the metadata
//! leader.

use super::*;

impl ClusterNode {
    /// A replicated metadata change (through the metadata group).
    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<String, SluiceError> {
        self.meta_write_at(cmd, None).await.map(|(_, r)| r)
    }

    /// `meta_write` for a client's request `req_id` (a retry of a change
    /// already made gets the first result), also returning the change's
    /// index in the metadata log.
    pub async fn meta_write_at(
        &self,
        cmd: MetaCommand,
        req_id: Option<ReqId>,
    ) -> Result<(u64, String), SluiceError> {
        let g = self.local_group(META_GROUP)?;
        let json = serde_json::to_string(&MetaEntry { cmd, req_id }).map_err(|e| {
            SluiceError::Internal {
                reason: e.to_string(),
            }
        })?;
        match self.propose_at(&g, Command::Meta(json)).await? {
            (index, Applied::Meta(r)) => r.map(|r| (index, r)).map_err(|e| Applied::decode_err(&e)),
            (_, other) => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// The result of a client's metadata change `req_id` if this node
    /// applied it (its reply lost with a leader, the client retrying):
    /// after a `meta_catch_up`, a change that committed is found. For
    /// changes whose preparation would fail once they are made (a purge).
    fn meta_result_of(&self, req_id: ReqId) -> Result<Option<String>, SluiceError> {
        let g = self.local_group(META_GROUP)?;
        match g.sm.applied_result(req_id) {
            None => Ok(None),
            Some(Applied::Meta(r)) => r.map(Some).map_err(|e| Applied::decode_err(&e)),
            Some(other) => Err(SluiceError::Internal {
                reason: format!("request {req_id:?}: a metadata result expected, found {other:?}"),
            }),
        }
    }

    /// The metadata log index this node has applied.
    pub fn meta_applied_index(&self) -> u64 {
        self.local_group(META_GROUP)
            .map_or(0, |g| g.sm.applied_index())
    }

    /// Called by the node's graph reconciler once its engine runs the
    /// graphs of the metadata log up to `index`.
    pub fn set_dfgs_reconciled(&self, index: u64) {
        self.dfgs_reconciled
            .fetch_max(index, std::sync::atomic::Ordering::AcqRel);
    }

    /// Waits until every node of the layout runs the data flow graphs of
    /// metadata index `index` (a graph change committed there), for at
    /// most `timeout`. Returns the nodes that did not confirm it (down,
    /// cut off, or slow): they run the change once they apply it.
    pub async fn wait_dfgs_everywhere(&self, index: u64, timeout: Duration) -> Vec<u32> {
        let deadline = tokio::time::Instant::now() + timeout;
        let cmd = sluice_wire::Request::Cluster {
            command: json!({"op": "dfgs_reconciled"}).to_string(),
        };
        // Where node `n` is: asked of every node at once, so one that is
        // cut off does not use up the others' time.
        let reconciled = |n: u32| {
            let cmd = &cmd;
            async move {
                if n == self.id {
                    return self
                        .dfgs_reconciled
                        .load(std::sync::atomic::Ordering::Acquire);
                }
                let Some(addr) = self.layout.address_of(n) else {
                    return u64::MAX; // not a node of the layout any more
                };
                let t = deadline.saturating_duration_since(tokio::time::Instant::now());
                match self.peers.request(n, &addr.to_string(), cmd, t).await {
                    Ok(sluice_wire::Response::Json(j)) => {
                        serde_json::from_str::<serde_json::Value>(&j)
                            .ok()
                            .and_then(|v| v["index"].as_u64())
                            .unwrap_or(0)
                    }
                    _ => 0,
                }
            }
        };
        let mut pending: Vec<u32> = self.layout.nodes.iter().map(|n| n.id).collect();
        loop {
            let at = futures_util::future::join_all(pending.iter().map(|n| reconciled(*n))).await;
            pending = pending
                .into_iter()
                .zip(at)
                .filter(|(_, at)| *at < index)
                .map(|(n, _)| n)
                .collect();
            if pending.is_empty() || tokio::time::Instant::now() >= deadline {
                return pending;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The cluster's data flow graphs (id -> normalized JSON), as this
    /// node has applied the metadata log so far.
    pub fn dfgs(&self) -> BTreeMap<String, String> {
        self.meta.read().dfgs.clone()
    }

    /// The policies as this node has applied the metadata log so far.
    pub fn policies(&self) -> sluice_types::policy::Policies {
        self.meta.read().policies.clone()
    }

    /// Changes whenever this node applies a metadata change (or installs
    /// a metadata snapshot).
    pub fn meta_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.meta.subscribe()
    }

    /// `Ok` when this node leads the metadata group, else the `NotLeader`
    /// error naming the leader it knows (where metadata changes go).
    pub fn check_meta_leader(&self) -> Result<(), SluiceError> {
        let g = self.local_group(META_GROUP)?;
        self.check_leader(&g)
    }

    /// Removes a pool: the metadata group records it, then the leader of
    /// each of the pool's shards catches up with the metadata group
    /// (`meta_fence`), so that from the moment this returns a write to the
    /// pool is refused wherever it goes (a shard's leader behind on the
    /// metadata would otherwise take one for a moment). The removal
    /// stands even if a fence fails (a shard without a leader: its next
    /// leader catches up before it answers a write for an unknown or
    /// removed pool anyway); that is logged.
    pub async fn remove_pool(
        &self,
        path: &str,
        req_id: Option<ReqId>,
    ) -> Result<String, SluiceError> {
        let pool = self.store.pool_table().get(path).cloned();
        let (_, r) = self
            .meta_write_at(
                MetaCommand::PoolRemove {
                    path: path.to_string(),
                },
                req_id,
            )
            .await?;
        for shard in pool
            .map(|p| self.store.shards_of_pool(&p))
            .unwrap_or_default()
        {
            let Some(g) = group_of(shard) else { continue };
            if let Err(e) = self.meta_fence(g).await {
                tracing::warn!(pool = %path, shard = %shard, error = %e, "a shard's leader did not confirm the pool's removal");
            }
        }
        Ok(r)
    }

    /// Has group `g`'s leader (here or forwarded) catch up with the
    /// metadata group.
    async fn meta_fence(&self, g: u64) -> Result<(), SluiceError> {
        let req = sluice_wire::Request::Cluster {
            command: json!({"op": "meta_fence", "group": g}).to_string(),
        };
        self.at_leader(
            g,
            || async {
                let grp = self.local_group(g)?;
                self.check_leader(&grp)?;
                self.meta_catch_up().await
            },
            &req,
            |_| Ok(()),
        )
        .await
    }

    /// Purges a removed pool everywhere: each of its shards deletes the
    /// pool's keys through its own log (every member, in log order), then
    /// the metadata group drops the pool and frees the path. Interrupted,
    /// it can run again (the pool stays removed until the last step). A
    /// client's retry (`req_id`) of a purge that finished is answered with
    /// its report.
    pub async fn purge_pool(
        &self,
        path: &str,
        req_id: Option<ReqId>,
    ) -> Result<PurgeReport, SluiceError> {
        self.meta_catch_up().await?;
        if let Some(id) = req_id {
            if let Some(done) = self.meta_result_of(id)? {
                return serde_json::from_str(&done).map_err(|e| SluiceError::Internal {
                    reason: format!("the report of purge {id:?} ({e}): {done}"),
                });
            }
        }
        let (meta, except) = self.store.pool_table().purge_scope(path)?;
        let mut total = PurgeReport::default();
        for shard in self.store.shards_of_pool(&meta) {
            if let Some(g) = group_of(shard) {
                total += self.purge_shard(g, path, &except).await?;
            }
        }
        self.meta_write_at(
            MetaCommand::PoolPurge {
                path: path.to_string(),
                report: Some(total),
            },
            req_id,
        )
        .await?;
        tracing::info!(pool = %path, keys = total.keys, versions = total.versions, bytes = total.bytes, "pool purged");
        Ok(total)
    }

    /// One shard's part of `purge_pool`, proposed by its leader (here or
    /// forwarded, following leader hints until the write timeout).
    pub(super) async fn purge_shard(
        &self,
        group: u64,
        prefix: &str,
        except: &[String],
    ) -> Result<PurgeReport, SluiceError> {
        let req = sluice_wire::Request::Cluster {
            command:
                json!({"op": "purge_shard", "group": group, "prefix": prefix, "except": except})
                    .to_string(),
        };
        self.at_leader(
            group,
            || async {
                let g = self.local_group(group)?;
                self.propose_purge(&g, prefix.to_string(), except.to_vec())
                    .await
            },
            &req,
            |r| match r {
                sluice_wire::Response::Json(j) => serde_json::from_str(&j).map_err(|e| {
                    SluiceError::protocol(format!("bad reply to a shard purge ({e}): {j}"))
                }),
                other => Err(SluiceError::protocol(format!(
                    "unexpected reply to a shard purge: {other:?}"
                ))),
            },
        )
        .await
    }

    /// Leader side of a shard purge: first catches up with the metadata
    /// group (so this leader sees the pool removed and refuses writes to
    /// it from now on), then replicates the purge.
    pub(super) async fn propose_purge(
        &self,
        g: &Group,
        prefix: String,
        except: Vec<String>,
    ) -> Result<PurgeReport, SluiceError> {
        self.meta_catch_up().await?;
        match self
            .propose_at(g, Command::Purge { prefix, except })
            .await?
        {
            (_, Applied::Purged(r)) => r.map_err(|e| Applied::decode_err(&e)),
            (_, other) => Err(SluiceError::Internal {
                reason: format!("unexpected apply result {other:?}"),
            }),
        }
    }

    /// Brings this node's pool table and membership up to date with the
    /// metadata leader (everything committed before the call), e.g. before
    /// telling a client that a key has no pool: a client may have learned
    /// of a new pool from a node further ahead.
    pub async fn meta_catch_up(&self) -> Result<(), SluiceError> {
        // A leader being elected, or a request to it lost, is retried
        // until `write_timeout_ms`: answering from a stale pool table
        // would tell a client that an existing pool does not exist.
        let t = Duration::from_millis(self.settings.write_timeout_ms);
        let deadline = tokio::time::Instant::now() + t;
        loop {
            match self.meta_catch_up_once(t).await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::debug!(error = %e, "metadata catch-up failed; trying again");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn meta_catch_up_once(&self, t: Duration) -> Result<(), SluiceError> {
        let g = self.local_group(META_GROUP)?;
        let leader = g.core.leader().map(|l| l as u32);
        let index = match leader {
            // A leader knows every committed change only once it has
            // committed an entry of its own term (a new leader may hold
            // changes its predecessor committed and it did not apply yet):
            // the read index waits for that, and for their apply.
            Some(l) if l == self.id => {
                return match tokio::time::timeout(t, g.core.read_index()).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(CoreError::NotLeader(leader))) => Err(self.not_leader(g.id, leader)),
                    Ok(Err(CoreError::Stopped(e) | CoreError::Other(e))) => {
                        Err(unavailable(format!("metadata catch-up: {e}")))
                    }
                    Err(_) => Err(unavailable(
                        "metadata catch-up: the leader's read index timed out".into(),
                    )),
                }
            }
            Some(l) => {
                let addr = self
                    .layout
                    .address_of(l)
                    .ok_or_else(|| self.not_leader(META_GROUP, None))?;
                let req = sluice_wire::Request::Cluster {
                    command: json!({"op": "meta_read_index"}).to_string(),
                };
                match self.peers.request(l, &addr.to_string(), &req, t).await? {
                    sluice_wire::Response::Json(j) => serde_json::from_str::<serde_json::Value>(&j)
                        .ok()
                        .and_then(|v| v["index"].as_u64())
                        .unwrap_or(0),
                    other => {
                        return Err(SluiceError::protocol(format!(
                            "unexpected reply to a metadata read index: {other:?}"
                        )))
                    }
                }
            }
            None => return Err(self.not_leader(META_GROUP, None)),
        };
        g.core
            .wait_applied(index, t, "metadata catch-up")
            .await
            .map_err(|e| unavailable(format!("metadata catch-up: {e}")))
    }
}

/// How long a starting node waits for each other node's layout.
const LAYOUT_ASK: Duration = Duration::from_secs(1);

impl ClusterNode {
    /// The metadata group takes every node of the layout as a voter, so a
    /// layout that adds or removes nodes changes its configuration, and a
    /// rollout restarts the nodes one by one: for a while some run the
    /// old layout and some the new. One node more or less keeps every
    /// majority of the old configuration meeting every majority of the
    /// new (Raft's single-server change); two at once do not, and an
    /// election then may choose a leader in each. So a starting node asks
    /// the others it reaches (within a second) which nodes their layouts
    /// name, and refuses to start with one that differs from any of them by
    /// more than one node; one node apart, it says so and starts.
    pub(super) async fn check_layout_step(&self) -> Result<(), SluiceError> {
        let mine: BTreeSet<u32> = self.layout.nodes.iter().map(|n| n.id).collect();
        let req = sluice_wire::Request::Cluster {
            command: json!({"op": "info"}).to_string(),
        };
        let asks = self
            .layout
            .nodes
            .iter()
            .filter(|n| n.id != self.id)
            .map(|n| {
                let (req, addr) = (&req, n.address.to_string());
                async move {
                    let r = tokio::time::timeout(
                        LAYOUT_ASK,
                        self.peers.request(n.id, &addr, req, LAYOUT_ASK),
                    )
                    .await;
                    match r {
                        Ok(Ok(sluice_wire::Response::Json(j))) => Some((n.id, j)),
                        _ => None,
                    }
                }
            });
        for (peer, j) in futures_util::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
        {
            let Some(nodes) = serde_json::from_str::<serde_json::Value>(&j)
                .ok()
                .and_then(|v| v["nodes"].as_array().cloned())
            else {
                continue;
            };
            let theirs: BTreeSet<u32> = nodes
                .iter()
                .filter_map(|n| n["id"].as_u64().map(|i| i as u32))
                .collect();
            let here: Vec<u32> = mine.difference(&theirs).copied().collect();
            let there: Vec<u32> = theirs.difference(&mine).copied().collect();
            match here.len() + there.len() {
                0 => {}
                1 => tracing::warn!(
                    peer,
                    only_here = ?here,
                    only_there = ?there,
                    "node {peer}'s layout names other nodes than this one's: roll the new layout out to every node before the next change"
                ),
                _ => {
                    return Err(SluiceError::invalid_argument(
                        "the cluster layout",
                        format!(
                            "it differs from the one node {peer} runs by more than one node (nodes {here:?} only here, {there:?} only there): add or remove one node at a time, rolling each layout out to every node before the next (the metadata group takes every node as a voter, and two changes at once can elect two leaders; README: Adding and removing nodes)"
                        ),
                    ))
                }
            }
        }
        Ok(())
    }
}
