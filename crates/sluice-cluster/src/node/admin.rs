//! Admin commands (`Request::Cluster`): status, membership changes, fault
//! injection, and the internal operations peers send.

use super::*;

/// An admin command (`Request::Cluster`).
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Admin {
    Status,
    Info,
    /// Send the latest version of `key` to nodes `to` (default: all the
    /// others) along `fanout` chains (1: one chain) in chunks of `chunk_kb`.
    Broadcast {
        key: String,
        to: Option<Vec<u32>>,
        fanout: Option<usize>,
        chunk_kb: Option<usize>,
    },
    /// What this node received by broadcast.
    BroadcastStatus,
    /// The latest version of `key` in this node's copy.
    VersionOf {
        key: String,
    },
    /// Fault injection: flip a byte of every broadcast chunk this node
    /// passes on (receivers then fail their checksum).
    CorruptChunks {
        on: bool,
    },
    AddMember {
        shard: String,
        node: u32,
    },
    RemoveMember {
        shard: String,
        node: u32,
    },
    Cut {
        peers: Vec<u32>,
    },
    Heal,
    /// Fault injection: every later write to this node's synced
    /// (persistent) consensus logs fails as on a full disk (ENOSPC), until
    /// the node restarts.
    DiskFull,
    /// Internal: record a shard's members (sent to the metadata leader).
    SetMembers {
        group: u64,
        members: Vec<u32>,
    },
    /// Internal: the metadata leader's read index (after confirming its
    /// leadership), so a lagging node can catch up before answering.
    MetaReadIndex,
    /// The metadata log index whose data flow graphs this node runs.
    DfgsReconciled,
    /// Internal: commit a time frontier after `timestamp_us` in `group`
    /// (sent to its leader); answers the frontier's log index.
    TimeBarrier {
        group: u64,
        timestamp_us: u64,
    },
    /// Internal: catch up with the metadata group, as `group`'s leader
    /// (after a pool's removal: `remove_pool`).
    MetaFence {
        group: u64,
    },
    /// Internal: member `node` of `group` is stopping (sent to its
    /// leader, `leave_lambdas`); answers the last log index.
    Leaving {
        group: u64,
        node: u64,
    },
    /// Internal: how far this member has committed `group` (0: nothing,
    /// or it holds back its vote, having started with nothing), asked by
    /// a member that started with nothing (`watch_lost_state`).
    Held {
        group: u64,
    },
    /// Internal: replicate a purge of a removed pool's keys in `group`
    /// (sent to its leader); answers what it deleted there.
    PurgeShard {
        group: u64,
        prefix: String,
        except: Vec<String>,
    },
}

impl ClusterNode {
    /// Runs an admin command (JSON, `{"op": ...}`). `from_peer`: the
    /// connection authenticated as a cluster peer; the internal operations
    /// (`set_members`, `time_barrier`, `meta_read_index`) need it.
    pub async fn admin(
        &self,
        command: &str,
        from_peer: bool,
    ) -> Result<serde_json::Value, SluiceError> {
        let cmd: Admin = serde_json::from_str(command)
            .map_err(|e| SluiceError::invalid_argument("cluster command", e.to_string()))?;
        if !from_peer
            && matches!(
                cmd,
                Admin::SetMembers { .. }
                    | Admin::TimeBarrier { .. }
                    | Admin::MetaReadIndex
                    | Admin::MetaFence { .. }
                    | Admin::PurgeShard { .. }
                    | Admin::Leaving { .. }
                    | Admin::Held { .. }
            )
        {
            return Err(SluiceError::Forbidden {
                what: "an internal cluster operation from a client connection".into(),
            });
        }
        match cmd {
            Admin::Status => Ok(self.status()),
            Admin::DfgsReconciled => Ok(json!({
                "node": self.id,
                "index": self.dfgs_reconciled.load(std::sync::atomic::Ordering::Acquire),
            })),
            Admin::Info => Ok(self.info()),
            Admin::Broadcast {
                key,
                to,
                fanout,
                chunk_kb,
            } => {
                let to = to.unwrap_or_else(|| {
                    self.layout
                        .nodes
                        .iter()
                        .map(|n| n.id)
                        .filter(|n| *n != self.id)
                        .collect()
                });
                self.broadcast(&key, to, fanout.unwrap_or(1), chunk_kb.unwrap_or(1024) << 10)
                    .await
            }
            Admin::BroadcastStatus => Ok(self.broadcast_status()),
            Admin::VersionOf { key } => match self.store.get(&key, None, None) {
                Ok(o) => Ok(json!({"version": o.meta.version})),
                Err(e) => Err(e),
            },
            Admin::CorruptChunks { .. } if !self.settings.fault_injection => {
                Err(SluiceError::NotSupported {
                    what: "fault injection on a node started without `[cluster] fault_injection = true`".into(),
                })
            }
            Admin::CorruptChunks { on } => {
                self.bcast
                    .corrupt
                    .store(on, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(on, "fault injection: broadcast chunks corrupted when passed on");
                Ok(json!({"node": self.id, "corrupt_chunks": on}))
            }
            Admin::AddMember { shard, node } => self.add_member(&shard, node).await,
            Admin::RemoveMember { shard, node } => self.remove_member(&shard, node).await,
            Admin::Cut { .. } | Admin::Heal | Admin::DiskFull
                if !self.settings.fault_injection =>
            {
                Err(SluiceError::NotSupported {
                    what: "fault injection on a node started without `[cluster] fault_injection = true`".into(),
                })
            }
            Admin::Cut { peers } => {
                self.peers.cut(&peers);
                tracing::warn!(?peers, "fault injection: links cut");
                Ok(json!({"node": self.id, "cut": self.peers.blocked()}))
            }
            Admin::MetaReadIndex => {
                let g = self.local_group(META_GROUP)?;
                self.check_leader(&g)?;
                let t = Duration::from_millis(self.settings.write_timeout_ms);
                match tokio::time::timeout(t, g.core.leader_read_index()).await {
                    Ok(Ok(index)) => Ok(json!({ "index": index })),
                    Ok(Err(CoreError::NotLeader(leader))) => Err(self.not_leader(g.id, leader)),
                    Ok(Err(CoreError::Stopped(e) | CoreError::Other(e))) => {
                        Err(unavailable(format!("metadata read index: {e}")))
                    }
                    Err(_) => Err(unavailable("metadata read index timed out".into())),
                }
            }
            Admin::TimeBarrier {
                group,
                timestamp_us,
            } => {
                let g = self.local_group(group)?;
                // raft-rs tells the followers of the commit at once: the
                // member that asked waits to apply the frontier.
                let index = self.tick(&g, timestamp_us).await?;
                Ok(json!({ "index": index }))
            }
            Admin::Leaving { group, node } => {
                let g = self.local_group(group)?;
                let index = self.mark_leaving(&g, node).await?;
                Ok(json!({ "index": index }))
            }
            Admin::Held { group } => {
                let g = self.local_group(group)?;
                let st = g.core.handle.borrow_status();
                let committed = match st.lost {
                    crate::raftrs::LostState::No => st.commit,
                    _ => 0,
                };
                Ok(json!({ "committed": committed }))
            }
            Admin::MetaFence { group } => {
                let g = self.local_group(group)?;
                self.check_leader(&g)?;
                self.meta_catch_up().await?;
                Ok(json!({}))
            }
            Admin::PurgeShard {
                group,
                prefix,
                except,
            } => {
                let g = self.local_group(group)?;
                let r = self.propose_purge(&g, prefix, except).await?;
                serde_json::to_value(r).map_err(|e| SluiceError::Internal {
                    reason: e.to_string(),
                })
            }
            Admin::SetMembers { group, members } => self
                .meta_write(MetaCommand::SetMembers { group, members })
                .await
                .map(|_| json!({})),
            Admin::Heal => {
                self.peers.heal();
                tracing::warn!("fault injection: links healed");
                Ok(json!({"node": self.id, "cut": []}))
            }
            Admin::DiskFull => {
                let mut f = self.disk_faults.lock().unwrap_or_else(|p| p.into_inner());
                f.space_left = Some(0);
                tracing::warn!("fault injection: the disk is full for the synced consensus logs");
                Ok(json!({"node": self.id, "disk_full": true}))
            }
        }
    }

    pub(super) async fn change(
        &self,
        shard: &str,
        node: u32,
        add: bool,
    ) -> Result<serde_json::Value, SluiceError> {
        let s = parse_shard(shard)?;
        let g = self.local(s)?;
        self.check_leader(&g)?;
        let members = self
            .change_raftrs(&g, &g.core.handle, shard, node, add)
            .await?;
        let members: Vec<u32> = members.iter().map(|v| *v as u32).collect();
        self.record_members(g.id, &members).await?;
        Ok(json!({"shard": shard, "members": members}))
    }

    /// Records a shard's new members in the metadata group, through its
    /// leader wherever that is.
    pub(super) async fn record_members(
        &self,
        group: u64,
        members: &[u32],
    ) -> Result<(), SluiceError> {
        let req = sluice_wire::Request::Cluster {
            command: json!({"op": "set_members", "group": group, "members": members}).to_string(),
        };
        self.at_leader(
            META_GROUP,
            || {
                self.meta_write(MetaCommand::SetMembers {
                    group,
                    members: members.to_vec(),
                })
            },
            &req,
            |_| Ok(String::new()),
        )
        .await
        .map(|_| ())
    }

    pub(super) async fn add_member(
        &self,
        shard: &str,
        node: u32,
    ) -> Result<serde_json::Value, SluiceError> {
        self.change(shard, node, true).await
    }

    pub(super) async fn remove_member(
        &self,
        shard: &str,
        node: u32,
    ) -> Result<serde_json::Value, SluiceError> {
        self.change(shard, node, false).await
    }
}
