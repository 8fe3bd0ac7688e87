#!/usr/bin/env bash
# Side-by-side: Sluice vs redis-server with the same harness, payloads and
# concurrency, plus the loopback TCP baseline, in one run.
#   scripts/bench-vs-redis.sh [extra `sluice bench` flags]
# Installs redis-server (Debian package) when missing; starts it on a free
# loopback port without persistence; stops it on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null; then
  echo "installing redis-server (apt)" >&2
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
PORT=${REDIS_PORT:-6399}
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
cargo build --release -p sluice-cli -p sluice-bench
./target/release/sluice bench --redis "127.0.0.1:$PORT" "$@"
