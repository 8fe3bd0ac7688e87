//! A shared queue across processes (EdgeServe's `shared_queue()`), on the
//! pool `/queues/<name>` (made volatile on first use; one created
//! persistent beforehand keeps its items across restarts): competing
//! consumers, each item to one live consumer at a time, at-least-once.
//!
//! An item is the key `items/<id>`; a consumer takes it by creating
//! `claims/<id>` (a conditional put that succeeds only if no claim
//! exists: one winner) holding its name, the lease's end and the
//! delivery count. Acknowledging turns the claim into `done` (a
//! conditional put on the claim's version, so a consumer whose lease was
//! taken over learns it), then removes the item and the claim. A claim
//! whose lease ended is taken over the same way (conditional on its
//! version), with the delivery count + 1: a consumer that died mid-item
//! causes a redelivery, visible as `delivery > 1`. A consumer tries the
//! items it listed oldest first; finding one held by another, it skips a
//! stretch of its own length (by its name), so competing consumers spread
//! over the backlog. In a cluster the pool's
//! shards are replicated and conditional puts linearizable, so this holds
//! across nodes. Leases compare wall clocks: consumers' clocks must agree
//! to well within a lease.

use crate::topic::Result;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sluice_client::{Client, PoolSpec, PoolType, SluiceError, VERSION_NONE};
use std::collections::VecDeque;
use std::time::Duration;

/// Where shared queues live (one pool per queue).
pub const QUEUE_ROOT: &str = "/queues";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Claim {
    consumer: String,
    until_us: u64,
    delivery: u32,
    #[serde(default)]
    done: bool,
}

/// What a try to take one item found.
enum Claimed {
    Taken(Delivery),
    /// Acknowledged (or being cleaned up) since the listing.
    Gone,
    /// Another consumer holds it (its lease runs, or it won the claim).
    Held,
}

/// The longest stretch of its list a consumer skips after finding an item
/// held by another.
const SPREAD: usize = 16;

/// An item a consumer took.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub value: Bytes,
    /// 1 the first time; more when an earlier consumer's lease ran out.
    pub delivery: u32,
    claim_version: u64,
}

/// A handle on a shared queue: pushes, and takes as the consumer `name`.
pub struct SharedQueue {
    client: Client,
    name: String,
    consumer: String,
    lease: Duration,
    seq: u64,
    candidates: VecDeque<String>,
    /// Items this consumer took over after another's lease ran out.
    pub redelivered: u64,
    /// Items this consumer tried to take that another had taken (held, or
    /// acknowledged and gone) since it listed them.
    pub missed: u64,
}

impl SharedQueue {
    /// Opens (creating if needed) the queue `name` for `consumer` (unique
    /// among live consumers), whose takes are leased for `lease`.
    pub async fn open(
        client: Client,
        name: &str,
        consumer: &str,
        lease: Duration,
    ) -> Result<SharedQueue> {
        if name.is_empty() || name.contains('/') || consumer.is_empty() || consumer.contains('/') {
            return Err(SluiceError::invalid_argument(
                "shared queue",
                format!("queue {name:?} and consumer {consumer:?} must be non-empty path segments"),
            ));
        }
        match client
            .create_pool(PoolSpec {
                pathname: format!("{QUEUE_ROOT}/{name}"),
                pool_type: Some(PoolType::Volatile),
                ..Default::default()
            })
            .await
        {
            Ok(_) | Err(SluiceError::PoolExists { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(SharedQueue {
            client,
            name: name.to_string(),
            consumer: consumer.to_string(),
            lease,
            seq: 0,
            candidates: VecDeque::new(),
            redelivered: 0,
            missed: 0,
        })
    }

    fn key(&self, kind: &str, id: &str) -> String {
        format!("{QUEUE_ROOT}/{}/{kind}/{id}", self.name)
    }

    /// Adds an item; its id sorts by push time (oldest taken first).
    pub async fn push(&mut self, value: impl Into<Bytes>) -> Result<String> {
        let id = format!(
            "{:020}-{}-{}",
            sluice_client::wall_us(),
            self.consumer,
            self.seq
        );
        self.seq += 1;
        self.client.put(&self.key("items", &id), value).await?;
        Ok(id)
    }

    /// Items waiting or in progress (not acknowledged).
    pub async fn backlog(&self) -> Result<usize> {
        Ok(self.item_ids().await?.len())
    }

    async fn item_ids(&self) -> Result<Vec<String>> {
        let pool = format!("{QUEUE_ROOT}/{}", self.name);
        let prefix = format!("{pool}/items/");
        let mut ids: Vec<String> = self
            .client
            .list_keys(&pool, Some(&prefix))
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Takes the next item no live consumer holds, or `None` if there is
    /// none now.
    pub async fn try_take(&mut self) -> Result<Option<Delivery>> {
        if self.lease.as_millis() == 0 {
            // Every item taken would be free for another consumer at
            // once. (A handle that only pushes needs no lease.)
            return Err(SluiceError::invalid_argument(
                "shared queue",
                format!(
                    "consumer {:?} takes items under a lease of {:?}, which ends as it starts: give at least 1 ms",
                    self.consumer, self.lease
                ),
            ));
        }
        if self.candidates.is_empty() {
            self.candidates = self.item_ids().await?.into();
        }
        while let Some(id) = self.candidates.pop_front() {
            match self.try_claim(&id).await? {
                Claimed::Taken(d) => return Ok(Some(d)),
                Claimed::Gone => {}
                // Another consumer holds it: skip a stretch of the list as
                // long as this consumer's own (by its name), so competing
                // consumers spread over the backlog instead of all going
                // for the next oldest item (they took turns losing the
                // same items, and three drained a backlog no faster than
                // one). A consumer alone never meets one, and takes the
                // oldest item first.
                Claimed::Held => {
                    let skip = skip_of(&self.consumer).min(self.candidates.len());
                    self.candidates.rotate_left(skip);
                }
            }
        }
        Ok(None)
    }

    /// Takes the next item, waiting up to `timeout` for one (polling every
    /// `poll`).
    pub async fn take(&mut self, timeout: Duration, poll: Duration) -> Result<Option<Delivery>> {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(d) = self.try_take().await? {
                return Ok(Some(d));
            }
            if tokio::time::Instant::now() >= end {
                return Ok(None);
            }
            tokio::time::sleep(poll).await;
        }
    }

    fn claim_value(&self, delivery: u32, done: bool) -> Bytes {
        let c = Claim {
            consumer: self.consumer.clone(),
            until_us: sluice_client::wall_us() + self.lease.as_micros() as u64,
            delivery,
            done,
        };
        Bytes::from(serde_json::to_vec(&c).expect("a claim serializes"))
    }

    async fn try_claim(&mut self, id: &str) -> Result<Claimed> {
        // The item and its claim in one request: an item acknowledged
        // since the listing is gone and skipped at that (a claim was
        // written first, then the item found missing and both cleaned up:
        // five requests). Once claimed, the item is checked again: it may
        // have been acknowledged between that read and the claim. (Items
        // never change, so the value read first is the item's.)
        let (item_key, claim_key) = (self.key("items", id), self.key("claims", id));
        let mut both = self.client.multi_get(&[&item_key, &claim_key]).await?;
        let claim = both.pop().unwrap_or_else(|| Err(missing(&claim_key)));
        let item = both.pop().unwrap_or_else(|| Err(missing(&item_key)));
        let claim = match claim {
            Err(SluiceError::NotFound { .. }) => None,
            Err(e) => return Err(e),
            Ok(o) => {
                let c: Claim = serde_json::from_slice(&o.value).map_err(|e| {
                    SluiceError::invalid_argument("queue claim", format!("{claim_key}: {e}"))
                })?;
                Some((c, o.meta.version))
            }
        };
        let value = match item {
            Ok(o) => o.value,
            Err(SluiceError::NotFound { .. }) => {
                self.missed += 1;
                if let Some((_, version)) = claim.filter(|(c, _)| c.done) {
                    // Acknowledged by a consumer that did not finish
                    // cleaning up: finish for it.
                    self.cleanup(id, version).await?;
                }
                return Ok(Claimed::Gone);
            }
            Err(e) => return Err(e),
        };
        let (expected, delivery) = match claim {
            None => (VERSION_NONE, 1),
            // Acknowledged, the item's removal not yet seen here.
            Some((c, version)) if c.done => {
                self.cleanup(id, version).await?;
                return Ok(Claimed::Gone);
            }
            Some((c, _)) if c.until_us > sluice_client::wall_us() => {
                self.missed += 1;
                return Ok(Claimed::Held);
            }
            Some((c, version)) => (version, c.delivery + 1),
        };
        let claimed = match self
            .client
            .put_if_version(&claim_key, self.claim_value(delivery, false), expected)
            .await
        {
            Ok(r) => r,
            Err(SluiceError::VersionConflict { .. }) => {
                self.missed += 1;
                return Ok(Claimed::Held);
            }
            Err(e) => return Err(e),
        };
        match self.client.get_size(&item_key, None, None).await {
            Ok(_) => {
                if delivery > 1 {
                    self.redelivered += 1;
                    tracing::info!(queue = %self.name, id, delivery, "shared queue: redelivered after a lease ran out");
                }
                Ok(Claimed::Taken(Delivery {
                    id: id.to_string(),
                    value,
                    delivery,
                    claim_version: claimed.version,
                }))
            }
            Err(SluiceError::NotFound { .. }) => {
                self.missed += 1;
                self.cleanup(id, claimed.version).await?;
                Ok(Claimed::Gone)
            }
            Err(e) => Err(e),
        }
    }

    async fn cleanup(&self, id: &str, claim_version: u64) -> Result<()> {
        match self.client.remove(&self.key("items", id)).await {
            Ok(_) | Err(SluiceError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        match self
            .client
            .remove_if_version(&self.key("claims", id), claim_version)
            .await
        {
            Ok(_) | Err(SluiceError::NotFound { .. } | SluiceError::VersionConflict { .. }) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Acknowledges an item: it is gone for good. `VersionConflict` when
    /// this consumer's lease ran out and another took the item over.
    pub async fn ack(&mut self, d: &Delivery) -> Result<()> {
        let done = self
            .client
            .put_if_version(
                &self.key("claims", &d.id),
                self.claim_value(d.delivery, true),
                d.claim_version,
            )
            .await?;
        self.cleanup(&d.id, done.version).await
    }

    /// Extends the lease of an item still in progress.
    pub async fn extend(&mut self, d: &mut Delivery) -> Result<()> {
        let r = self
            .client
            .put_if_version(
                &self.key("claims", &d.id),
                self.claim_value(d.delivery, false),
                d.claim_version,
            )
            .await?;
        d.claim_version = r.version;
        Ok(())
    }
}

/// How far consumer `name` skips in its list after finding an item held
/// by another: 1 to `SPREAD`, by a stable hash of its name (FNV-1a), so
/// consumers skip by different amounts.
fn skip_of(name: &str) -> usize {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    1 + (h % SPREAD as u64) as usize
}

/// A multi-get's answer that lacks one of the keys asked for.
fn missing(key: &str) -> SluiceError {
    SluiceError::protocol(format!("a multi-get answered without {key}"))
}
