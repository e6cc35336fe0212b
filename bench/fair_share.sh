#!/usr/bin/env bash
# bench/fair_share.sh [BINDIR] [RUNS]: how long one tenant's single claim waits behind
# another tenant's backlog on an empty pool (issue 22), on a real sbx-server with the local
# (bubblewrap) runtime. Tenant "a" asks for a batch of 60 on pool "fair" (0 warm, max_warm
# 4, one sandbox created at a time: --refill_max_creating 1), and 0.5 s later tenant "b"
# claims one sandbox. Prints both times per run. With one FIFO queue b is served after a's
# 60; with fair shares b gets one of the next two sandboxes. Prints numbers only.
set -euo pipefail
bin=${1:-build/clang/src/cmd}
runs=${2:-3}
bin=$(cd "$bin" && pwd)
work=$(mktemp -d /tmp/sbx-fair-share-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/config.yaml" <<'EOF'
templates:
  - name: default
    runtime: local
    local:
      network: false
      memory_limit_bytes: 268435456
      pids_limit: 128
pools:
  - name: fair
    template: default
    min_warm: 0
    max_warm: 4
    empty_pool_policy: wait
    default_wait: 120s
EOF
printf 'tok-a a\ntok-b b\ntok-root root admin\n' >"$work/tokens"
chmod 600 "$work/tokens"
port=$((40000 + RANDOM % 20000))
export SBX_SERVER=127.0.0.1:$port
now() { date +%s.%N; }
for run in $(seq 1 "$runs"); do
  rm -rf "$work/data" "$work/sandboxes"
  "$bin/sbx-server" --listen "$SBX_SERVER" --metrics_listen off --config "$work/config.yaml" \
    --data_dir "$work/data" --sandbox_root "$work/sandboxes" --sandboxd "$bin/sbx-sandboxd" \
    --auth_tokens_file "$work/tokens" --delete_sandboxes_on_exit --refill_max_creating 1 \
    >"$work/server.log" 2>&1 &
  server=$!
  for _ in $(seq 1 100); do SBX_TOKEN=tok-root "$bin/sbx" pools >/dev/null 2>&1 && break; sleep 0.1; done
  start=$(now)
  (
    SBX_TOKEN=tok-a "$bin/sbx" claim fair --count 60 -q >/dev/null 2>>"$work/cli.log"
    echo "run $run: a's batch of 60 after $(echo "$(now) - $start" | bc) s"
  ) &
  batch=$!
  sleep 0.5
  b_start=$(now)
  SBX_TOKEN=tok-b "$bin/sbx" claim fair -q >/dev/null 2>>"$work/cli.log"
  echo "run $run: b's single claim after $(echo "$(now) - $b_start" | bc) s"
  wait "$batch"
  kill -TERM "$server"
  wait "$server" || true
done
