#!/usr/bin/env bash
# Replicated shards of 1, 3 and 5 node processes next to redis-server with
# two replicas (SET + WAIT 2) and the loopback TCP round trip, plus failover
# time after SIGKILL of the leader, all in one run.
#   scripts/bench-cluster.sh [extra `sluice bench cluster` flags]
# Installs redis-server (Debian package) when missing; `sluice bench
# cluster` starts and stops the redis processes itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  echo "installing redis-server (apt)" >&2
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
cargo build --release -p sluice-cli -p sluice-bench
./target/release/sluice bench cluster --duration-ms 2000 --failovers 5 --node-threads 1 "$@"
