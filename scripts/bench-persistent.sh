#!/usr/bin/env bash
# Persistent puts: a standalone node with each fsync policy, a 3-node
# cluster replicating one persistent shard, and a 3-member etcd cluster
# (Debian's etcd-server, driven through its gRPC API), next to the disk's
# own fsync'd sequential bandwidth, all in one run; plus time-indexed reads
# and recovery of a log.
#   scripts/bench-persistent.sh [extra `sluice bench persistent` flags]
# Installs etcd-server and etcd-client (Debian packages) when missing;
# `sluice bench persistent` starts and stops the etcd processes itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
  echo "installing etcd-server and etcd-client (apt)" >&2
  apt-get update -qq && apt-get install -y -qq etcd-server etcd-client >/dev/null
fi
cargo build --release -p sluice-cli -p sluice-bench
./target/release/sluice bench persistent --duration-ms 2000 --recovery-mib 256 --node-threads 1 "$@"
