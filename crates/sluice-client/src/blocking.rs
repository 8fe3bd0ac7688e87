//! A synchronous wrapper for code without an async runtime (the CLI, scripts).

use crate::client::{Client, ClientConfig, Notification, Watch};
use bytes::Bytes;
use sluice_types::{Object, PoolMeta, PoolSpec, PutResult, Result, SluiceError};
use sluice_wire::ServerInfo;
use std::time::Duration;

/// Owns a small runtime and blocks on each call.
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    client: Client,
}

/// A blocking watch stream.
pub struct BlockingWatch<'a> {
    rt: &'a tokio::runtime::Runtime,
    watch: Watch,
}

impl BlockingWatch<'_> {
    /// Why the watch ended, once `next` returned `None` (see `Watch::lost`).
    pub fn lost(&self) -> Option<SluiceError> {
        self.watch.lost()
    }

    /// The next notification, or None when the connection closed or
    /// `timeout` passed.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Notification> {
        self.rt.block_on(async {
            tokio::time::timeout(timeout, self.watch.next())
                .await
                .ok()
                .flatten()
        })
    }
}

impl Iterator for BlockingWatch<'_> {
    type Item = Notification;

    /// The next notification; None when the connection closed.
    fn next(&mut self) -> Option<Notification> {
        self.rt.block_on(self.watch.next())
    }
}

macro_rules! blocking {
    ($( $(#[$m:meta])* fn $name:ident(&self $(, $arg:ident : $ty:ty)*) -> $ret:ty; )*) => {
        $(
            $(#[$m])*
            #[doc = concat!("[`Client::", stringify!($name), "`], blocking until it answers.")]
            pub fn $name(&self $(, $arg: $ty)*) -> $ret { self.rt.block_on(self.client.$name($($arg),*)) }
        )*
    };
}

impl BlockingClient {
    /// Connects to `addr` (`host:port`, or several comma-separated) with
    /// default settings ([`Client::connect`]).
    pub fn connect(addr: &str) -> Result<Self> {
        Self::connect_with(ClientConfig {
            addr: addr.to_string(),
            ..Default::default()
        })
    }

    /// Connects with these settings ([`Client::connect_with`]), on a
    /// runtime of one worker thread that this client owns.
    pub fn connect_with(cfg: ClientConfig) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| SluiceError::Internal {
                reason: format!("cannot start a runtime: {e}"),
            })?;
        let client = rt.block_on(Client::connect_with(cfg))?;
        Ok(BlockingClient { rt, client })
    }

    /// The async client inside (shares connections).
    pub fn async_client(&self) -> &Client {
        &self.client
    }

    /// The runtime this client's calls run on: for many calls at once,
    /// spawn the `async_client`'s futures on it and wait for them with
    /// `Handle::block_on` (as `sluice load` does).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }

    /// What the node said about itself when the client connected.
    pub fn server_info(&self) -> &ServerInfo {
        self.client.server_info()
    }

    /// [`Client::put`], blocking until it answers.
    pub fn put(&self, key: &str, value: impl Into<Bytes>) -> Result<PutResult> {
        self.rt.block_on(self.client.put(key, value))
    }

    /// [`Client::put_if_version`], blocking until it answers.
    pub fn put_if_version(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        expected_version: u64,
    ) -> Result<PutResult> {
        self.rt
            .block_on(self.client.put_if_version(key, value, expected_version))
    }

    /// [`Client::put_and_forget`], blocking until it is sent.
    pub fn put_and_forget(&self, key: &str, value: impl Into<Bytes>) -> Result<()> {
        self.rt.block_on(self.client.put_and_forget(key, value))
    }

    /// [`Client::trigger_put`], blocking until it answers.
    pub fn trigger_put(&self, key: &str, value: impl Into<Bytes>) -> Result<u64> {
        self.rt.block_on(self.client.trigger_put(key, value))
    }

    /// A trigger put that starts a latency trace (`Client::trigger_put_traced`).
    pub fn trigger_put_traced(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        trace_id: u64,
    ) -> Result<u64> {
        self.rt
            .block_on(self.client.trigger_put_traced(key, value, trace_id))
    }

    /// [`Client::multi_get`], blocking until it answers.
    pub fn multi_get(&self, keys: &[&str]) -> Result<Vec<Result<Object>>> {
        self.rt.block_on(self.client.multi_get(keys))
    }

    /// `get_by_time` that answers at once, stable or not.
    pub fn get_by_time_unstable(&self, key: &str, timestamp_us: u64) -> Result<Object> {
        self.rt
            .block_on(self.client.get_by_time_with(key, timestamp_us, 0, true))
    }

    /// [`Client::watch`]: notifications of puts, trigger puts and removes
    /// under `prefix`, from now on.
    pub fn watch(&self, prefix: &str) -> Result<BlockingWatch<'_>> {
        let watch = self.rt.block_on(self.client.watch(prefix))?;
        Ok(BlockingWatch {
            rt: &self.rt,
            watch,
        })
    }

    /// `Client::watch_from`: replays a persistent pool's stored versions
    /// from a version or time, then goes on live.
    pub fn watch_from(
        &self,
        prefix: &str,
        from: sluice_wire::WatchFrom,
    ) -> Result<BlockingWatch<'_>> {
        let watch = self.rt.block_on(self.client.watch_from(prefix, from))?;
        Ok(BlockingWatch {
            rt: &self.rt,
            watch,
        })
    }

    blocking! {
        fn remove(&self, key: &str) -> Result<PutResult>;
        fn remove_if_version(&self, key: &str, expected_version: u64) -> Result<PutResult>;
        fn get(&self, key: &str) -> Result<Object>;
        fn get_version(&self, key: &str, version: u64) -> Result<Object>;
        fn get_by_time(&self, key: &str, timestamp_us: u64) -> Result<Object>;
        fn get_size(&self, key: &str, version: Option<u64>, timestamp_us: Option<u64>) -> Result<u64>;
        fn create_pool(&self, spec: PoolSpec) -> Result<PoolMeta>;
        fn remove_pool(&self, path: &str) -> Result<PoolMeta>;
        fn purge_pool(&self, path: &str) -> Result<sluice_types::PurgeReport>;
        fn get_pool(&self, path: &str) -> Result<PoolMeta>;
        fn pool_of_key(&self, key: &str) -> Result<PoolMeta>;
        fn list_pools(&self, include_deleted: bool) -> Result<Vec<PoolMeta>>;
        fn ping(&self) -> Result<Duration>;
        fn stats(&self) -> Result<serde_json::Value>;
        fn dfg_apply(&self, text: &str) -> Result<serde_json::Value>;
        fn policy(&self, command: serde_json::Value) -> Result<serde_json::Value>;
        fn broadcast(&self, key: &str, to: Option<&[u32]>, fanout: usize) -> Result<serde_json::Value>;
        fn dfg_list(&self) -> Result<serde_json::Value>;
        fn dfg_list_nodes(&self) -> Result<Vec<(u32, Result<serde_json::Value>)>>;
        fn dfg_remove(&self, id: &str) -> Result<()>;
        fn list_keys(&self, pool: &str, prefix: Option<&str>) -> Result<Vec<String>>;
        fn list_keys_at(&self, pool: &str, prefix: Option<&str>, by_time: bool, at: u64) -> Result<Vec<String>>;
        fn history(&self, key: &str, by_time: bool, from: u64, to: u64, page: u32) -> Result<Vec<Object>>;
        fn history_page(&self, key: &str, by_time: bool, from: u64, to: u64, limit: u32) -> Result<(Vec<Object>, bool)>;
        fn refresh_pools(&self) -> Result<()>;
        fn get_linearizable(&self, key: &str) -> Result<Object>;
        fn refresh_cluster(&self) -> Result<()>;
        fn cluster_command(&self, command: serde_json::Value, node: Option<u32>) -> Result<serde_json::Value>;
    }
}
