use serde::{Deserialize, Serialize};
use sluice_store::Layout;
use sluice_types::{Limits, PoolSpec};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The port `sluice serve` listens on by default.
pub use sluice_types::DEFAULT_PORT;

/// Per-connection time limits, in milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Timeouts {
    /// A new connection must complete the HELLO handshake within this.
    pub handshake_ms: u64,
    /// Once a frame's first byte arrives, the rest must arrive within this
    /// (defeats slowloris clients).
    pub frame_ms: u64,
    /// Close connections idle this long; 0 keeps them open.
    pub idle_ms: u64,
    /// On shutdown, wait this long for connections to finish.
    pub shutdown_grace_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake_ms: 5_000,
            frame_ms: 10_000,
            idle_ms: 0,
            shutdown_grace_ms: 5_000,
        }
    }
}

/// Upcall workers for lambdas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ComputeConfig {
    /// Upcall worker threads; 0 means one per core.
    pub workers: usize,
    /// Upcalls queued per worker before deliveries are refused
    /// (a trigger put then fails with `unavailable`; retry).
    pub queue_len: usize,
}

impl Default for ComputeConfig {
    fn default() -> Self {
        ComputeConfig {
            workers: 0,
            queue_len: 1024,
        }
    }
}

/// Persistent pools: on by default (`enabled = false` refuses
/// `--type persistent` pools and keeps no history directory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PersistentConfig {
    /// Allow `--type persistent` pools. Their shards keep an append-only
    /// log under `<data_dir>/persistent`.
    pub enabled: bool,
    /// `always` (acknowledge after an fsync of one's own, the default),
    /// `batch` (group commit: acknowledge after an fsync shared with the
    /// puts appended meanwhile) or `never` (the OS writes back; unsafe on
    /// power loss).
    pub sync: String,
    /// How often the background compaction applies retention policies.
    pub compact_every_s: u64,
    /// Log segment size; retention reclaims whole sealed segments.
    pub segment_bytes: u64,
}

impl Default for PersistentConfig {
    fn default() -> Self {
        PersistentConfig {
            enabled: true,
            sync: "always".into(),
            compact_every_s: 60,
            segment_bytes: 64 << 20,
        }
    }
}

impl PersistentConfig {
    pub fn sync_policy(&self) -> Result<sluice_log::SyncPolicy, String> {
        match self.sync.as_str() {
            "always" => Ok(sluice_log::SyncPolicy::Always),
            "batch" => Ok(sluice_log::SyncPolicy::Batch {
                max_delay: std::time::Duration::ZERO,
            }),
            "never" => Ok(sluice_log::SyncPolicy::Never),
            other => Err(format!(
                "persistent.sync = {other:?}: use \"always\", \"batch\" or \"never\""
            )),
        }
    }
}

/// A node's configuration (the `sluice serve --config` TOML file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub node_id: u32,
    /// Address to listen on: an IP address and a port, `:<port>` (every
    /// interface, IPv6 and IPv4), or a host name and a port (looked up
    /// once, at start: `localhost:7420` listens on loopback).
    #[serde(deserialize_with = "listen_from_text")]
    pub listen: SocketAddr,
    /// Where the node keeps its state (the pool table today).
    pub data_dir: PathBuf,
    /// Tokio worker threads; 0 means one per core.
    pub worker_threads: usize,
    pub limits: Limits,
    pub timeouts: Timeouts,
    pub compute: ComputeConfig,
    pub persistent: PersistentConfig,
    /// Shard counts per pool type and subgroup.
    pub layout: Layout,
    /// Pools created when the data directory has no pool table yet.
    pub default_pools: Vec<PoolSpec>,
    /// Cluster membership and replication (`layout` unset: standalone).
    pub cluster: sluice_cluster::ClusterSettings,
    /// Other names of UDLs in DFG files, e.g. Cascade's UDL UUIDs:
    /// `"<uuid>" = "python"`.
    pub udl_aliases: std::collections::BTreeMap<String, String>,
    /// The Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// TLS on client and peer connections (off unless `tls.cert` is set).
    pub tls: sluice_tls::NodeTls,
    /// Where policy refusals are recorded (the policies themselves live in
    /// the metadata service: `sluice policy`).
    pub policy: PolicyConfig,
    /// Trace export to an OpenTelemetry collector (off unless set).
    pub otel: crate::otel::OtelConfig,
}

/// A listen address as an operator writes it: `10.0.0.7:7420`,
/// `[::]:7420`, `:7420` (every interface, IPv6 and IPv4: `[::]`), or
/// `localhost:7420` and other host names, looked up now (IPv4 first, as
/// clients look names up). Taken as `SocketAddr` only, `localhost:7420`
/// and `:7420` were "invalid socket address syntax".
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || {
        format!(
            "listen address {text:?}: expected an address and a port (127.0.0.1:7420, [::]:7420), :<port> for every interface, or a host name and a port (localhost:7420)"
        )
    };
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Ok(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)));
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("listen address {text:?}: cannot look up {host:?}: {e}"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("listen address {text:?}: {host:?} has no address"))
}

fn listen_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(d)?;
    parse_listen(&text).map_err(serde::de::Error::custom)
}

fn some_listen_from_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    listen_from_text(d).map(Some)
}

/// `[policy]`: this node's side of the policies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// A file every refusal is appended to, one JSON line each (they are
    /// also logged at warn level under the `sluice::audit` target: a
    /// principal's refusals of one operation five at once, then one per
    /// 10 s with the number left out).
    pub audit_log: Option<PathBuf>,
}

/// `[metrics]`: the node's Prometheus endpoint (`GET /metrics`); off
/// unless `listen` is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Where `/metrics` is served, e.g. "127.0.0.1:9420" (as `listen`:
    /// ":9420" for every interface, or a host name and a port).
    #[serde(deserialize_with = "some_listen_from_text")]
    pub listen: Option<SocketAddr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            node_id: 0,
            listen: SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)),
            data_dir: PathBuf::from("./sluice-data"),
            worker_threads: 0,
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            compute: ComputeConfig::default(),
            persistent: PersistentConfig::default(),
            layout: Layout::default(),
            default_pools: sluice_types::pool::default_pools(),
            cluster: sluice_cluster::ClusterSettings::default(),
            udl_aliases: Default::default(),
            metrics: MetricsConfig::default(),
            tls: sluice_tls::NodeTls::default(),
            policy: PolicyConfig::default(),
            otel: crate::otel::OtelConfig::default(),
        }
    }
}

impl ServerConfig {
    /// Parses a TOML config; errors name the line and field.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let cfg: ServerConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), String> {
        self.layout.validate()?;
        self.persistent.sync_policy()?;
        self.tls.validate().map_err(|e| e.to_string())?;
        if let Some(e) = &self.otel.endpoint {
            crate::otel::Endpoint::parse(e)?;
        }
        let c = &self.cluster;
        if c.election_min_ms <= c.heartbeat_ms * 2 || c.election_max_ms <= c.election_min_ms {
            return Err(format!(
                "cluster: need heartbeat_ms ({}) * 2 < election_min_ms ({}) < election_max_ms ({})",
                c.heartbeat_ms, c.election_min_ms, c.election_max_ms
            ));
        }
        let l = &self.limits;
        let checks = [
            (
                l.max_key_bytes >= 2,
                "limits.max_key_bytes must be at least 2",
            ),
            (
                l.max_value_bytes >= 1,
                "limits.max_value_bytes must be at least 1",
            ),
            (
                l.max_value_bytes <= u32::MAX - 1024,
                "limits.max_value_bytes must be below 4 GiB",
            ),
            (
                l.max_meta_bytes >= 4096,
                "limits.max_meta_bytes must be at least 4096",
            ),
            (
                l.max_in_flight_per_conn >= 1,
                "limits.max_in_flight_per_conn must be at least 1",
            ),
            (
                l.max_connections >= 1,
                "limits.max_connections must be at least 1",
            ),
            (
                l.max_multi_get_keys >= 1,
                "limits.max_multi_get_keys must be at least 1",
            ),
            (
                self.timeouts.handshake_ms >= 1,
                "timeouts.handshake_ms must be at least 1",
            ),
            (
                self.timeouts.frame_ms >= 1,
                "timeouts.frame_ms must be at least 1",
            ),
            // 0 was taken as 1 ms: a thousand heartbeats a second per group.
            (
                c.heartbeat_ms >= 1,
                "cluster.heartbeat_ms must be at least 1",
            ),
            // A leader is replaced within election_max_ms: past a minute a
            // cluster could wait that long without one (etcd caps its
            // election timeout at 50 s).
            (
                c.election_max_ms <= 60_000,
                "cluster.election_max_ms must be at most 60000 (a minute)",
            ),
            (
                (1..=3_600_000).contains(&c.write_timeout_ms),
                "cluster.write_timeout_ms must be between 1 and 3600000 (an hour)",
            ),
            (
                c.catch_up_wait_ms <= 86_400_000,
                "cluster.catch_up_wait_ms must be at most 86400000 (a day)",
            ),
            // 0 was taken as 1: a snapshot after every entry.
            (
                c.snapshot_every >= 1,
                "cluster.snapshot_every must be at least 1",
            ),
        ];
        for (ok, msg) in checks {
            if !ok {
                return Err(msg.to_string());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--listen` and `listen` take what operators write: before, a name
    /// or `:port` was "invalid socket address syntax".
    #[test]
    fn a_listen_address_may_be_a_name_or_a_bare_port() {
        assert_eq!(
            parse_listen("10.0.0.7:7420").unwrap().to_string(),
            "10.0.0.7:7420"
        );
        assert_eq!(
            parse_listen("[::1]:7420").unwrap().to_string(),
            "[::1]:7420"
        );
        assert_eq!(parse_listen(":7420").unwrap().to_string(), "[::]:7420");
        let local = parse_listen("localhost:7420").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 7420, "{local}");
        for bad in ["nope", "localhost", "localhost:x", "host:99999"] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains("expected an address and a port"), "{bad}: {e}");
        }
        let e = parse_listen("no-such-host.invalid:7420").unwrap_err();
        assert!(e.contains("cannot look up \"no-such-host.invalid\""), "{e}");
        let cfg = ServerConfig::from_toml("listen = \"localhost:9000\"\n").unwrap();
        assert!(cfg.listen.ip().is_loopback() && cfg.listen.port() == 9000);
        let cfg = ServerConfig::from_toml("[metrics]\nlisten = \":9420\"\n").unwrap();
        assert_eq!(cfg.metrics.listen.unwrap().to_string(), "[::]:9420");
    }

    #[test]
    fn defaults_and_toml_overrides() {
        let c = ServerConfig::from_toml(
            "node_id = 3\nlisten = \"127.0.0.1:9000\"\n[limits]\nmax_value_bytes = 1024\n[layout]\nversion = 1\nvolatile = [4]\ntrigger = [1]\npersistent = []\n",
        )
        .unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(c.limits.max_value_bytes, 1024);
        assert_eq!(c.limits.max_key_bytes, Limits::default().max_key_bytes);
        assert_eq!(c.layout.volatile, vec![4]);
    }

    #[test]
    fn the_annotated_example_config_parses() {
        let c = ServerConfig::from_toml(include_str!("../../../examples/node.toml")).unwrap();
        assert_eq!(c.cluster.heartbeat_ms, 50);
        assert!(c.cluster.layout.is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let e = ServerConfig::from_toml("node_idd = 3\n").unwrap_err();
        assert!(e.contains("node_idd"), "{e}");
        let e = ServerConfig::from_toml("[limits]\nmax_connections = 0\n").unwrap_err();
        assert!(e.contains("max_connections"), "{e}");
        let e = ServerConfig::from_toml("[layout]\nvolatile = [0]\n").unwrap_err();
        assert!(e.contains("layout.volatile[0]"), "{e}");
        let e = ServerConfig::from_toml("listen = \"nope\"\n").unwrap_err();
        assert!(e.contains("listen"), "{e}");
        // Cluster timings that could not work: each named.
        for (setting, field) in [
            ("heartbeat_ms = 0", "cluster.heartbeat_ms"),
            (
                "election_min_ms = 900000000\nelection_max_ms = 900000001",
                "cluster.election_max_ms",
            ),
            ("write_timeout_ms = 0", "cluster.write_timeout_ms"),
            (
                "write_timeout_ms = 9223372036854775807",
                "cluster.write_timeout_ms",
            ),
            (
                "catch_up_wait_ms = 9223372036854775807",
                "cluster.catch_up_wait_ms",
            ),
            ("snapshot_every = 0", "cluster.snapshot_every"),
        ] {
            let e = ServerConfig::from_toml(&format!("[cluster]\n{setting}\n")).unwrap_err();
            assert!(e.contains(field), "{setting}: {e}");
        }
        // A setting of the openraft driver, gone with it.
        let e = ServerConfig::from_toml("[cluster]\ncommit_hold_us = 2000\n").unwrap_err();
        assert!(e.contains("commit_hold_us"), "{e}");
    }
}
