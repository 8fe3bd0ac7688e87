//! Watch subscriptions: the notify hook. A watch forwards every delivery
//! whose key starts with its prefix to the connection that opened it.

use parking_lot::RwLock;
use sluice_store::{Delivery, DeliveryKind, DeliveryObserver, ShardId};
use sluice_types::Object;
use sluice_wire::DeliveryKindWire;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Notifications queued per connection before new ones are dropped (and the
/// watcher told how many it lost).
pub const WATCH_QUEUE_LEN: usize = 4096;

/// One queued notification: the watch's request id, what happened, the object.
pub struct Notice {
    pub watch_id: u64,
    pub kind: DeliveryKindWire,
    pub object: Arc<Object>,
}

/// What a watch lost since it was last told: how many notices, and the
/// versions and times of the first and last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    pub count: u64,
    pub first_version: u64,
    pub last_version: u64,
    pub first_timestamp_us: u64,
    pub last_timestamp_us: u64,
}

impl Lost {
    fn add(&mut self, o: &Object) {
        if self.count == 0 {
            self.first_version = o.meta.version;
            self.first_timestamp_us = o.meta.timestamp_us;
        }
        self.count += 1;
        self.last_version = o.meta.version;
        self.last_timestamp_us = o.meta.timestamp_us;
    }

    /// Adds `count` losses between versions `first` and `last` (times
    /// unknown).
    pub fn merge_range(&mut self, count: u64, first: u64, last: u64) {
        if count == 0 {
            return;
        }
        if self.count == 0 || first < self.first_version {
            self.first_version = first;
        }
        self.last_version = self.last_version.max(last);
        self.count += count;
    }

    /// The `Lagged` notice that reports this loss: `meta.version` is the
    /// count (as before), the value a JSON object with the count and the
    /// range (versions are `u64::MAX` for trigger puts, which have none).
    pub fn notice(&self, watch_id: u64, prefix: &str) -> Notice {
        self.notice_from(watch_id, prefix, "server")
    }

    /// The notice, saying where the loss happened (`server`: the node's
    /// queue overflowed; `retention`: a resumed watch found the versions
    /// gone).
    pub fn notice_from(&self, watch_id: u64, prefix: &str, place: &str) -> Notice {
        let value = serde_json::json!({
            "dropped": self.count,
            "first_version": self.first_version,
            "last_version": self.last_version,
            "first_timestamp_us": self.first_timestamp_us,
            "last_timestamp_us": self.last_timestamp_us,
            "where": place,
        })
        .to_string();
        Notice {
            watch_id,
            kind: DeliveryKindWire::Lagged,
            object: Arc::new(Object {
                key: Arc::from(prefix),
                meta: sluice_types::ObjectMeta {
                    version: self.count,
                    timestamp_us: self.last_timestamp_us,
                    previous_version: self.first_version,
                    previous_version_by_key: self.last_version,
                    tombstone: false,
                },
                value: bytes::Bytes::from(value),
                trace: None,
            }),
        }
    }
}

struct Entry {
    conn_id: u64,
    watch_id: u64,
    prefix: String,
    tx: mpsc::Sender<Notice>,
    /// Notices dropped because the connection's queue was full; reported
    /// by the connection once it has drained its queue (`take_lost`).
    lost: parking_lot::Mutex<Lost>,
    any_lost: AtomicBool,
    /// A resumed watch: per shard, the last version its replay covers;
    /// live deliveries up to it are not sent again.
    replayed: Vec<(ShardId, u64)>,
}

impl Entry {
    fn wants(&self, object: &Object, shard: Option<ShardId>) -> bool {
        if !object.key.starts_with(self.prefix.as_str()) {
            return false;
        }
        match shard {
            Some(s) => !self
                .replayed
                .iter()
                .any(|(id, upto)| *id == s && object.meta.version <= *upto),
            None => true,
        }
    }
}

/// All watches on a node.
#[derive(Default)]
pub struct WatchHub {
    entries: RwLock<Vec<Arc<Entry>>>,
}

impl WatchHub {
    pub fn add(&self, conn_id: u64, watch_id: u64, prefix: String, tx: mpsc::Sender<Notice>) {
        self.add_resumed(conn_id, watch_id, prefix, tx, Vec::new());
    }

    /// A watch whose replay covers each listed shard up to a version:
    /// only later deliveries of those shards are forwarded.
    pub fn add_resumed(
        &self,
        conn_id: u64,
        watch_id: u64,
        prefix: String,
        tx: mpsc::Sender<Notice>,
        replayed: Vec<(ShardId, u64)>,
    ) {
        self.entries.write().push(Arc::new(Entry {
            conn_id,
            watch_id,
            prefix,
            tx,
            lost: parking_lot::Mutex::default(),
            any_lost: AtomicBool::new(false),
            replayed,
        }));
    }

    /// Removes one watch; returns whether it existed.
    pub fn remove(&self, conn_id: u64, watch_id: u64) -> bool {
        let mut e = self.entries.write();
        let before = e.len();
        e.retain(|x| !(x.conn_id == conn_id && x.watch_id == watch_id));
        e.len() != before
    }

    pub fn remove_conn(&self, conn_id: u64) {
        self.entries.write().retain(|x| x.conn_id != conn_id);
    }

    pub fn count_for(&self, conn_id: u64) -> usize {
        self.entries
            .read()
            .iter()
            .filter(|x| x.conn_id == conn_id)
            .count()
    }

    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// The loss reports owed to the watches of `conn_id`, reset. Called by
    /// the connection after it drained its queue: a notice is dropped only
    /// when that queue is full, so every loss is followed by a drain and
    /// reported, even when no other delivery comes after it.
    pub fn take_lost(&self, conn_id: u64) -> Vec<Notice> {
        let entries = self.entries.read();
        entries
            .iter()
            .filter(|e| e.conn_id == conn_id && e.any_lost.swap(false, Ordering::AcqRel))
            .map(|e| {
                let lost = std::mem::take(&mut *e.lost.lock());
                lost.notice(e.watch_id, &e.prefix)
            })
            .filter(|n| n.object.meta.version > 0)
            .collect()
    }
}

impl DeliveryObserver for WatchHub {
    fn on_delivery(&self, d: &Delivery<'_>) -> sluice_types::Result<()> {
        self.publish_from(d.object, d.kind.into_wire(), Some(d.shard));
        Ok(())
    }
}

trait IntoWire {
    fn into_wire(self) -> DeliveryKindWire;
}

impl IntoWire for DeliveryKind {
    fn into_wire(self) -> DeliveryKindWire {
        match self {
            DeliveryKind::Put => DeliveryKindWire::Put,
            DeliveryKind::TriggerPut => DeliveryKindWire::TriggerPut,
            DeliveryKind::Remove => DeliveryKindWire::Remove,
        }
    }
}

impl WatchHub {
    /// Queues `object` for every watch whose prefix covers its key.
    pub fn publish(&self, object: &Arc<Object>, kind: DeliveryKindWire) {
        self.publish_from(object, kind, None);
    }

    /// `publish` of a delivery from a shard (resumed watches skip what
    /// their replay already sent).
    fn publish_from(&self, object: &Arc<Object>, kind: DeliveryKindWire, shard: Option<ShardId>) {
        let entries = self.entries.read();
        if entries.is_empty() {
            return;
        }
        for e in entries.iter().filter(|e| e.wants(object, shard)) {
            let n = Notice {
                watch_id: e.watch_id,
                kind,
                object: object.clone(),
            };
            if e.tx.try_send(n).is_err() {
                e.lost.lock().add(object);
                e.any_lost.store(true, Ordering::Release);
            }
        }
    }
}

impl sluice_compute::Publisher for WatchHub {
    fn publish(&self, object: &Arc<Object>) {
        WatchHub::publish(self, object, DeliveryKindWire::Notify);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_types::{ObjectMeta, PoolMeta, PoolType};

    fn object(key: &str, version: u64) -> Arc<Object> {
        Arc::new(Object {
            key: Arc::from(key),
            meta: ObjectMeta {
                version,
                timestamp_us: version,
                previous_version: 0,
                previous_version_by_key: 0,
                tombstone: false,
            },
            value: bytes::Bytes::new(),
            trace: None,
        })
    }

    /// A resumed watch is not sent again what its replay covered (per
    /// shard, up to the version it was registered at), and gets the rest.
    #[test]
    fn a_resumed_watch_skips_what_its_replay_sent() {
        let shard = |i| ShardId {
            pool_type: PoolType::Persistent,
            subgroup: 0,
            shard: i,
        };
        let pool = PoolMeta {
            pathname: "/p".into(),
            pool_type: PoolType::Persistent,
            subgroup_index: 0,
            sharding_policy: Default::default(),
            shard_count: 2,
            affinity_set_regex: None,
            object_locations: Default::default(),
            access_policy: Default::default(),
            retention: None,
            deleted: false,
            creation_version: 1,
            creation_timestamp_us: 0,
        };
        let hub = WatchHub::default();
        let (tx, mut rx) = mpsc::channel(16);
        hub.add_resumed(1, 5, "/p".into(), tx, vec![(shard(0), 10), (shard(1), 3)]);
        for (s, v) in [(0, 9), (0, 10), (0, 11), (1, 3), (1, 4)] {
            hub.on_delivery(&Delivery {
                pool: &pool,
                shard: shard(s),
                object: &object("/p/k", v),
                kind: DeliveryKind::Put,
            })
            .unwrap();
        }
        // A lambda's emit carries no shard: always forwarded.
        hub.publish(&object("/p/emitted", 1), DeliveryKindWire::Notify);
        let mut got = Vec::new();
        while let Ok(n) = rx.try_recv() {
            got.push(n.object.meta.version);
        }
        assert_eq!(got, vec![11, 4, 1]);
    }
}
