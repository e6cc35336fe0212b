#!/bin/bash
# CPU per operation of saturated Ping and saturated Claim+Release (closed loop, 64 in
# flight on 2 connections, as the third ratio of bench/claim_floor.py), split by the
# server's threads, with the load generator's own CPU per operation beside it. Says where
# a claim+release cycle's CPU goes on the server and how much of the machine the client
# takes. Starts sbx-server (--runtime instant, 5,000 warm) on loopback; stops by itself.
#
# Usage: bench/claim_cpu.sh [SERVER [LOADGEN [SECONDS]]] [-- SERVER_ARGS...]
#   defaults: build/clang/src/cmd/sbx-server build/clang/bench/sbx-loadgen 5
#   e.g. bench/claim_cpu.sh -- --durability buffered
# Reads /proc/<pid>/task/*/stat (utime + stime) and each thread's context switches before
# and after each run; no root needed.
set -euo pipefail
ARGS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do ARGS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
SERVER=${ARGS[0]:-build/clang/src/cmd/sbx-server}
LOADGEN=${ARGS[1]:-build/clang/bench/sbx-loadgen}
SECONDS_=${ARGS[2]:-5}
W=$(mktemp -d /tmp/claim-cpu-XXXX)
trap 'kill $PID 2>/dev/null || true; rm -rf "$W"' EXIT
"$SERVER" --runtime instant --config "$(dirname "$0")/claim_bench.yaml" --refill_qps 100000 \
  --listen 127.0.0.1:0 --port_file "$W/port" --data_dir "$W/data" --metrics_listen off \
  --log_level warn --insecure_no_auth "$@" > "$W/server.log" 2>&1 &
PID=$!
for _ in $(seq 1 200); do [ -s "$W/port" ] && break; sleep 0.1; done
sleep 1.5  # the pool fills (the instant runtime makes a sandbox at once)
PORT=$(cat "$W/port")
TICK=$(getconf CLK_TCK)

# One line per thread: name, CPU ticks, context switches (voluntary + not).
threads() {
  for t in /proc/"$PID"/task/*; do
    printf '%s %s %s\n' "$(tr ' ' _ < "$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")" \
      "$(awk '/^(non)?voluntary_ctxt_switches/ {s += $2} END {print s}' "$t/status")"
  done
}

for workload in ping claim-release; do
  threads > "$W/before"
  /usr/bin/time -f "%U %S" -o "$W/client" "$LOADGEN" --server "127.0.0.1:$PORT" --pool bench \
    --workload "$workload" --concurrency 64 --connections 2 --duration "${SECONDS_}s" \
    --warmup 0s > "$W/out" 2>&1
  threads > "$W/after"
  /usr/bin/python3 - "$workload" "$W" "$TICK" <<'PY'
import collections, sys
workload, w, tick = sys.argv[1], sys.argv[2], float(sys.argv[3])
ops = None
for line in open(w + "/out"):
    f = line.split()
    if f and f[0] == workload:
        rate, ops = float(f[1]), int(f[2])
if not ops:
    sys.exit("no %s result: %s" % (workload, open(w + "/out").read()))
def load(name):
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(w + "/" + name):
        comm, cpu, switches = line.split()
        d[comm][0] += int(cpu)
        d[comm][1] += int(switches)
    return d
a, b = load("before"), load("after")
rows = []
for comm, (cpu, sw) in b.items():
    cpu -= a[comm][0]
    sw -= a[comm][1]
    rows.append((cpu / tick / ops * 1e6, sw / ops, comm))
user, system = map(float, open(w + "/client").read().split()[-2:])
total = sum(r[0] for r in rows)
print("%s: %.0f ops/s; server %.1f us CPU per op, sbx-loadgen %.1f us" %
      (workload, rate, total, (user + system) / ops * 1e6))
for us, sw, comm in sorted(rows, reverse=True):
    if us >= 0.5 or sw >= 0.05:
        print("  %-18s %6.1f us/op  %5.2f context switches/op" % (comm, us, sw))
PY
done
