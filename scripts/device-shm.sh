#!/usr/bin/env bash
# Shared memory on the GPU machine, in one command (about 3 minutes), each
# figure beside the socket path's in the same run (docs/shm.md):
#   - large f32 LayerNorm requests (64 MiB, 256 MiB, 1 GiB of x), GB/s of
#     x + y: --transport shm against the socket (client chunks pipelined);
#   - 1 x 4096 bf16 requests from 16 client processes, 8 and 16 in flight
#     each (RING_CONC: requests in flight in all, default 128,256):
#     --transport ring batched and unbatched (max-batch-rows 1), and the
#     socket (raw driver) batched;
#   - CUDA IPC: lnorm-bench --transport cuda-ipc (256 MiB and 1 GiB bf16
#     RMSNorm, 1, 2 and 4 in flight), then lnorm-ipc-bench against a running
#     lnormd (checks vs float64, then 8 MiB, 256 MiB and 1 GiB bf16 tensors
#     end to end, one request at a time and IPC_CONC (default 4) in flight,
#     beside a device copy and the same kernel in the client; IPC_ROWS: rows
#     of 4096).
# Binaries in one folder ($1, default .devserve): static lnormd, lnorm-bench,
# lnorm-ipc-bench (cmake --build build-sm90 --target lnormd lnorm-bench
# lnorm-ipc-bench) and lnorm_commit.txt. Run from the repository root:
#   OUT=/some/dir scripts/device-shm.sh .devserve
# Files in $OUT: shm.log, shm-runs.json (every lnorm-bench JSON and the
# lnorm-ipc-bench JSON, one per line) and shm-h200.json (scripts/shm-summary.py:
# the file kept as bench/results/shm-h200.json).
set -u
BIN=${1:-.devserve}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
TMP=$(mktemp -d)
LOG=$OUT/shm.log
COMMIT=$(cat "$BIN/lnorm_commit.txt" 2>/dev/null || echo unknown)
export LNORM_COMMIT=$COMMIT LNORM_BENCH_COMMIT=$COMMIT
exec >"$LOG" 2>&1
echo "date: $(date -u +%FT%TZ) commit: $COMMIT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
DUR=${LNORM_SHM_DURATION:-4}
run() { # name, lnorm-bench args... -- lnormd args
  local name=$1
  shift
  echo "== $name"
  timeout 150 "$BIN/lnorm-bench" --spawn "$BIN/lnormd" --duration "$DUR" --warmup 1 --no-progress \
    --json "$TMP/$name.json" --tag "mode=$name" "$@"
  echo "($name: rc=$?)"
}

STEPS=${LNORM_SHM_STEPS:-large,ring,ipc}
# Large requests: rows x 4096 f32 (64 MiB of x at 4096 rows).
case ",$STEPS," in *,large,*) ;; *) LARGE_ROWS= ;; esac
for rows in ${LARGE_ROWS-4096 16384 65536}; do
  mib=$((rows * 16 / 1024))
  run "large${mib}M-shm" --transport shm --op ln --rows "$rows" --hidden 4096 --dtype f32 --variants 1 \
    --concurrency 2,4 --verify 2 --timeout 60000 -- --backend cuda --allow-shm
  if [ "$rows" -le 16384 ]; then
    run "large${mib}M-socket" --op ln --rows "$rows" --hidden 4096 --dtype f32 --variants 1 --concurrency 2,4 \
      --verify 2 --timeout 60000 --chunk-bytes 8M --pipeline-depth 4 -- --backend cuda
  fi
done

# Small requests from 16 processes; RING_CONC: requests in flight in all
# (a list: one point each).
small=(--rows 1 --hidden 4096 --dtype bf16 --procs 16 --concurrency "${RING_CONC:-128,256}" --verify 50)
case ",$STEPS," in *,ring,*)
run ring-batched --transport ring "${small[@]}" -- --backend cuda --allow-shm
run ring-unbatched --transport ring "${small[@]}" -- --backend cuda --allow-shm --max-batch-rows 1
run socket-batched --driver raw "${small[@]}" -- --backend cuda
;; esac

# CUDA IPC through lnorm-bench (GB/s of x + y as for shm): bf16 RMSNorm on
# the client's GPU memory, 256 MiB and 1 GiB of x.
case ",$STEPS," in *,ipc,*)
for rows in 32768 131072; do
  mib=$((rows * 8 / 1024))
  run "ipc${mib}M-cuda" --transport cuda-ipc --op rms --rows "$rows" --hidden 4096 --dtype bf16 --variants 1 \
    --concurrency 1,2,4 --verify 2 --timeout 60000 -- --backend cuda --allow-shm
done
;; esac

# CUDA IPC.
case ",$STEPS," in *,ipc,*)
echo "== cuda-ipc"
D=$(mktemp -d)
"$BIN/lnormd" --backend cuda --allow-shm --listen "ipc://$D/l.sock" --http off --ready-file "$D/ready" \
  >"$TMP/lnormd-ipc.log" 2>&1 &
P=$!
for _ in $(seq 1 200); do [ -f "$D/ready" ] && break; sleep 0.1; done
for rows in ${IPC_ROWS:-1024 32768 131072}; do
  timeout 120 "$BIN/lnorm-ipc-bench" --url "ipc://$D/l.sock" --rows "$rows" --hidden 4096 --dtype bf16 --iters 50 \
    --concurrency "${IPC_CONC:-4}" --json "$TMP/cuda-ipc-$rows.json"
done
echo "(cuda-ipc: rc=$?)"
kill -TERM "$P"
wait "$P"
tail -5 "$TMP/lnormd-ipc.log"
;; esac

for f in "$TMP"/*.json; do tr -d '\n' <"$f"; echo; done >"$OUT/shm-runs.json"
python3 "$(dirname "$0")/shm-summary.py" "$OUT/shm-runs.json" >"$OUT/shm-h200.json"
echo "done"
