//! Watch subscriptions: the notify hook. A watch forwards every delivery
//! whose key starts with its prefix to the connection that opened it.

use parking_lot::RwLock;
use sluice_store::{Delivery, DeliveryKind, DeliveryObserver};
use sluice_types::Object;
use sluice_wire::DeliveryKindWire;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// For `Lagged`: how many notices were dropped.
    pub dropped: u64,
}

struct Entry {
    conn_id: u64,
    watch_id: u64,
    prefix: String,
    tx: mpsc::Sender<Notice>,
    dropped: AtomicU64,
}

/// All watches on a node.
#[derive(Default)]
pub struct WatchHub {
    entries: RwLock<Vec<Arc<Entry>>>,
}

impl WatchHub {
    pub fn add(&self, conn_id: u64, watch_id: u64, prefix: String, tx: mpsc::Sender<Notice>) {
        self.entries.write().push(Arc::new(Entry {
            conn_id,
            watch_id,
            prefix,
            tx,
            dropped: AtomicU64::new(0),
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
}

impl DeliveryObserver for WatchHub {
    fn on_delivery(&self, d: &Delivery<'_>) -> sluice_types::Result<()> {
        self.publish(d.object, d.kind.into_wire());
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
        let entries = self.entries.read();
        if entries.is_empty() {
            return;
        }
        for e in entries
            .iter()
            .filter(|e| object.key.starts_with(e.prefix.as_str()))
        {
            let lost = e.dropped.load(Ordering::Relaxed);
            if lost > 0 {
                let lag = Notice {
                    watch_id: e.watch_id,
                    kind: DeliveryKindWire::Lagged,
                    object: object.clone(),
                    dropped: lost,
                };
                if e.tx.try_send(lag).is_ok() {
                    e.dropped.fetch_sub(lost, Ordering::Relaxed);
                } else {
                    e.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let n = Notice {
                watch_id: e.watch_id,
                kind,
                object: object.clone(),
                dropped: 0,
            };
            if e.tx.try_send(n).is_err() {
                e.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl sluice_compute::Publisher for WatchHub {
    fn publish(&self, object: &Arc<Object>) {
        WatchHub::publish(self, object, DeliveryKindWire::Notify);
    }
}
