#!/bin/bash
# Profiles sbx-server during durable claims: starts it (--runtime instant, 5,000 warm,
# fsync on), records `perf record -F 2999 -g` of it while sbx-loadgen sends claims open
# loop, and prints the loadgen result, the store's counters before and after (commits,
# writes, syncs, committer and syncer busy seconds) and perf's split by thread and by
# library. Loopback only; stops by itself.
#
# Usage: bench/claim_profile.sh [SERVER [LOADGEN [RATE [SECONDS]]]]
#   defaults: build/clang/src/cmd/sbx-server build/clang/bench/sbx-loadgen 2000 7
#   RATE "saturated": closed-loop Claim+Release, 64 in flight on 2 connections (the third
#   ratio of bench/claim_floor.py) instead of open-loop claims.
# Needs perf (Debian's linux-perf) and permission to profile the server (root, or
# kernel.perf_event_paranoid <= 1). Keeps its folder (printed at the end) for perf report.
set -euo pipefail
SERVER=${1:-build/clang/src/cmd/sbx-server}
LOADGEN=${2:-build/clang/bench/sbx-loadgen}
RATE=${3:-2000}
SECONDS_=${4:-7}
W=$(mktemp -d /tmp/claim-profile-XXXX)
"$SERVER" --runtime instant --config "$(dirname "$0")/claim_bench.yaml" --refill_qps 100000 \
  --listen 127.0.0.1:0 --port_file "$W/port" --data_dir "$W/data" \
  --metrics_listen 127.0.0.1:0 --metrics_port_file "$W/mport" --log_level warn \
  --insecure_no_auth > "$W/server.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do [ -s "$W/port" ] && [ -s "$W/mport" ] && break; sleep 0.1; done
sleep 1.5  # the pool fills (the instant runtime makes a sandbox at once)
PORT=$(cat "$W/port"); MPORT=$(cat "$W/mport")
counters() {
  curl -s "127.0.0.1:$MPORT/metrics" |
    grep -E "^sbx_store_((committer|syncer|answerer)_busy_seconds|writes|syncs|commits)_total"
}
counters > "$W/before"
perf record -F 2999 -g -o "$W/perf.data" -p "$PID" -- sleep $((SECONDS_ + 1)) > /dev/null 2>&1 &
PERF=$!
if [ "$RATE" = saturated ]; then
  LOAD=(--workload claim-release --concurrency 64 --connections 2)
else
  LOAD=(--workload claim --rate "$RATE")
fi
"$LOADGEN" --server "127.0.0.1:$PORT" --pool bench "${LOAD[@]}" \
  --duration "${SECONDS_}s" --warmup 0.5s
wait $PERF || true
counters > "$W/after"
echo "--- store counters before / after"
paste "$W/before" "$W/after"
echo "--- perf by thread"
perf report -i "$W/perf.data" --no-children --sort comm --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -8
echo "--- perf by library"
perf report -i "$W/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -8
echo "kept: $W"
