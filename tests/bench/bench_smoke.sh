#!/usr/bin/env bash
# Quick end-to-end runs of the benchmark tools, so they cannot rot unnoticed: small traces are
# generated and replayed, and the figures checked for what must hold whatever the timings.
#
#   bench_smoke.sh pools TOOLS_DIR
#       the generator and the pools replayer (no CUDA): suite 'unit'
#   bench_smoke.sh cuda TOOLS_DIR STANDIN_DIR PRELOAD_LIST SUITE_SCRIPT BUILD_DIR
#       the CUDA replayer on the stand-in (plain, CUB, under libpoolcuda.so; PRELOAD_LIST is the
#       LD_PRELOAD value that puts the library, and a sanitizer runtime first if any, in front)
#       and a two-trace run of the suite script: suite 'preload'
set -euo pipefail
mode=$1
tools=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# check FILE PYTHON-EXPRESSION...: each expression must hold for the JSON object `r` in FILE.
check() {
  local file=$1
  shift
  python3 - "$file" "$@" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for expr in sys.argv[2:]:
    if not eval(expr):
        sys.exit(f"{sys.argv[1]}: {expr} does not hold for {json.dumps(r)[:600]}")
EOF
}

expect_status() {  # WANT COMMAND...: the command must exit with status WANT
  local want=$1
  shift
  local rc=0
  "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" -eq "$want" ] || fail "$* exited $rc, not $want: $(cat "$work/err")"
}

gen=$tools/poolcuda_trace_gen
traces="loop-64KiB ring16-512B-16MiB-2t slices-1M training"
"$gen" --scale 0.001 --out-dir "$work/t" $traces >"$work/index" || fail "generation failed"
[ "$(wc -l <"$work/index")" -eq 4 ] || fail "the generator did not list 4 traces"
expect_status 64 "$gen" --out-dir "$work/t" no-such-trace
grep -q "no trace named 'no-such-trace'" "$work/err" || fail "unknown trace name not reported"
expect_status 64 "$gen" --scale 0 --out-dir "$work/t"
printf 'poolcuda-trace 1\nname x\nthreads 1\nthread 0\na 0 8\n' >"$work/bad.trace"

if [ "$mode" = pools ]; then
  replay=$tools/poolcuda_replay_pools
  for t in $traces; do
    "$replay" "$work/t/$t.trace" >"$work/$t.json" || fail "pools replay of $t failed"
    # With two threads the peak live figure is the sum of each thread's peak: not a floor.
    check "$work/$t.json" 'r["status"] == "ok"' 'r["pairs"] == r["trace_pairs"] > 0' \
      'r["threads"] > 1 or r["peak_reserved_bytes"] >= r["peak_live_bytes"]' \
      'r["driver_allocs"] >= 1' \
      'r["reserved_at_end_bytes"] <= r["peak_reserved_bytes"]'
    "$replay" --allocator harness "$work/t/$t.trace" >"$work/$t.h.json" ||
      fail "harness replay of $t failed"
    check "$work/$t.h.json" 'r["status"] == "ok"' 'r["peak_reserved_bytes"] is None'
  done
  check "$work/slices-1M.json" '[p["name"] for p in r["phases"]][:2] == ["grow-10", "live-10"]'
  expect_status 65 "$replay" "$work/bad.trace"
  grep -q "line 5: the trace ends with slot 0" "$work/err" ||
    fail "a malformed trace was not explained"
  expect_status 65 "$replay" "$work/missing.trace"
  grep -q "missing.trace: cannot be read" "$work/err" || fail "a missing trace was not named"
  expect_status 64 "$replay" --allocator cub "$work/t/loop-64KiB.trace"
  echo "pools smoke: ok"
  exit 0
fi

[ "$mode" = cuda ] || fail "unknown mode $mode"
standin=$3
preload=$4
suite=$5
build=$6
replay=$tools/poolcuda_replay_cuda
run() {  # NAME ALLOCATOR TRACE [ENV...]
  local name=$1 allocator=$2 trace=$3
  shift 3
  env LD_LIBRARY_PATH="$standin" "$@" "$replay" --allocator "$allocator" \
    "$work/t/$trace.trace" >"$work/$name.json" || fail "$name: $(cat "$work/$name.json")"
}
run plain cuda training
# Every plain cudaMalloc is a driver allocation that lives exactly as long as the buffer.
check "$work/plain.json" 'r["status"] == "ok"' 'r["driver_allocs"] == r["pairs"]' \
  'r["driver_frees"] == r["pairs"]' 'r["peak_reserved_bytes"] == r["peak_live_bytes"]' \
  'r["reserved_at_end_bytes"] == 0' 'r["event_records"] == 0'
run cub cub-bg2 training
check "$work/cub.json" 'r["status"] == "ok"' 'r["driver_frees"] == 0' \
  'r["event_records"] == r["pairs"]' 'r["reserved_at_end_bytes"] == r["peak_reserved_bytes"]'
run pooled cuda training LD_PRELOAD="$preload"
check "$work/pooled.json" 'r["status"] == "ok"' 'r["driver_allocs"] < r["pairs"]' \
  'r["peak_reserved_bytes"] >= r["peak_live_bytes"]'
run pooled2 cuda ring16-512B-16MiB-2t LD_PRELOAD="$preload" POOLCUDA_CONF=free_fence:none
check "$work/pooled2.json" 'r["status"] == "ok"' 'r["threads"] == 2' 'r["event_records"] == 0'
expect_status 65 env LD_LIBRARY_PATH="$standin" "$replay" "$work/bad.trace"
expect_status 64 env LD_LIBRARY_PATH="$standin" "$replay" --allocator nope "$work/bad.trace"

# The suite script end to end on two traces, two repeats: its JSON and its tables. The columns
# whose times no target reads run once, the others in every repeat.
"$suite" --build "$build" --out "$work/suite" --quick --repeats 2 \
  --traces loop-64KiB,ring16-512B-16MiB-2t --preload "$preload" >"$work/tables.md" \
  2>"$work/suite.err" || fail "bench-suite: $(tail -5 "$work/suite.err")"
check "$work/suite/results.json" 'len(r["traces"]) == 2' \
  'all(c["ok"] == c["runs"] == (1 if a in ("cub", "cuda", "poolcuda-80g") else 2)
       for a, c in r["results"]["loop-64KiB"].items())' \
  'set(r["results"]["loop-64KiB"]) >= {"pools", "poolcuda", "poolcuda-none", "poolcuda-80g", "cub",
                                      "cub-bg2", "cuda"}'
grep -q "^| loop-64KiB | " "$work/tables.md" || fail "no table row for loop-64KiB"
grep -q "^cub, cuda, poolcuda-80g: no target reads their times" "$work/tables.md" ||
  fail "no note of the runs made once"
grep -q "the same on an 80 GiB device (poolcuda-80g)" "$work/tables.md" ||
  fail "no memory target read for the 80 GiB device"
grep -q "^### Targets" "$work/tables.md" || fail "no targets section"
echo "cuda smoke: ok"
