#!/usr/bin/env bash
# Tests of the poolcuda CLI, one case per invocation:
#   cli_test.sh CASE POOLCUDA STAND_IN_LIBRARY LIBDIR
# (LIBDIR: meson's libdir, relative to the prefix). Each case checks exit statuses and output; a
# failed check prints what was seen and exits 1.
set -uo pipefail

case_name=$1
poolcuda=$(readlink -f "$2")
stand_in=$(readlink -f "$3")
libdir=${4:-lib}
work=$(mktemp -d)
background_pid=
cleanup() {
  if [ -n "$background_pid" ]; then
    kill "$background_pid" 2>/dev/null
    wait "$background_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
unset POOLCUDA_CONF POOLCUDA_LIBRARY LD_PRELOAD POOLCUDA_CLI_TEST_MARKER

fail() {
  echo "FAIL [$case_name]: $*"
  echo "--- stdout:"; cat "$work/out" 2>/dev/null
  echo "--- stderr:"; cat "$work/err" 2>/dev/null
  exit 1
}

# run_cli EXPECTED_STATUS ARGS...: runs poolcuda, keeping stdout and stderr in $work/out, err.
run_cli() {
  local expected=$1
  shift
  "$poolcuda" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  [ "$status" -eq "$expected" ] || fail "poolcuda $* exited $status, expected $expected"
}

# has FILE TEXT: FILE (out or err) contains TEXT literally.
has() { grep -qF -- "$2" "$work/$1" || fail "$1 lacks: $2"; }
lacks() { ! grep -qF -- "$2" "$work/$1" || fail "$1 should not contain: $2"; }
is_empty() { [ ! -s "$work/$1" ] || fail "$1 should be empty"; }

# wait_for FILE TEXT: waits up to 10 s for FILE to contain TEXT.
wait_for() {
  for _ in $(seq 100); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 never contained: $2"
}

keys="pools persistent free_fence report_signal report_format report_path report_at_exit log
      managed managed_slab memgetinfo confirm"

case "$case_name" in
check-conf-good)
  run_cli 0 check-conf "log:full, pools:[sliced(page=1M,cap=4M);direct(reclaim=1G)]"
  has out "pools:[sliced(page=1MiB,slice=1MiB,cap=4MiB);direct(reclaim=1GiB)]"
  has out ",log:full,"
  has out "free_fence:auto"
  is_empty err
  # The output is itself a valid configuration describing the same thing.
  described=$(cat "$work/out")
  run_cli 0 check-conf "$described"
  [ "$(cat "$work/out")" = "$described" ] || fail "describe is not stable"
  run_cli 0 check-conf ""
  for key in $keys; do has out "$key:"; done
  has out "managed_slab:64MiB"
  ;;
check-conf-bad)
  run_cli 2 check-conf "free_fence:fast"
  has err "key 'free_fence'"
  has err "'fast'"
  has err "one of auto, events, sync, none"
  is_empty out
  run_cli 2 check-conf "pools:[sliced(page=1M,slice=2M)]"
  has err "slice (2MiB) no larger than page (1MiB)"
  run_cli 2 check-conf "colour:blue"
  has err "one of the keys pools, persistent"
  run_cli 2 check-conf
  has err "exactly one argument"
  run_cli 2 frobnicate
  has err "unknown command 'frobnicate'"
  ;;
check-conf-report-path)
  # A valid configuration whose report_path the library could not write: the configuration is
  # printed, one line says why, status 1 (2 is kept for invalid configurations).
  run_cli 1 check-conf "report_path:$work/missing/r-%p.txt"
  has out "report_path:$work/missing/r-%p.txt"
  has err "report_path '$work/missing/r-%p.txt': directory '$work/missing': No such file"
  has err "the library creates no directory"
  has err "reports would be lost"
  run_cli 1 check-conf "log:off,report_path:$work/run-%p/report.txt"
  has err "keep them in the file name"
  touch "$work/plain-file"
  run_cli 1 check-conf "report_path:$work/plain-file/r.json"
  has err "'$work/plain-file' is not a directory"
  mkdir "$work/reports"
  run_cli 1 check-conf "report_path:$work/reports"
  has err "'$work/reports' is a directory, not a file"
  # Relative paths are seen from the current directory.
  (cd "$work" && run_cli 1 check-conf "report_path:missing/r.txt") || exit 1
  has err "directory 'missing'"
  (cd "$work" && run_cli 0 check-conf "report_path:r-%p-%n.txt") || exit 1
  is_empty err
  run_cli 0 check-conf "report_path:$work/reports/r-%p-%n.json"
  is_empty err
  run_cli 0 check-conf "report_path:stderr"
  # A directory this user cannot write to (root writes everywhere, so only checked for others).
  if [ "$(id -u)" -ne 0 ]; then
    mkdir "$work/locked" && chmod 555 "$work/locked"
    run_cli 1 check-conf "report_path:$work/locked/r.txt"
    has err "directory '$work/locked' does not take new files"
  fi
  ;;
help)
  for flag in --help -h help; do
    run_cli 0 "$flag"
    for command in "run [--conf STR] [--report-at-exit]" "report PID" "check-conf STR"; do
      has out "$command"
    done
    for key in $keys; do has out "  $key:"; done
    has out "  managed_slab:64MiB"
    has out "  free_fence:auto"
    has out "REPLACES any POOLCUDA_CONF"
  done
  run_cli 0 --version
  grep -qE '^poolcuda [0-9]+\.[0-9]+\.[0-9]+$' "$work/out" || fail "bad --version output"
  run_cli 2
  has err "missing command"
  ;;
run-bad-conf)
  export POOLCUDA_LIBRARY=$stand_in
  run_cli 2 run --conf "log:loud" -- touch "$work/ran"
  has err "key 'log'"
  has err "'loud'"
  [ ! -e "$work/ran" ] || fail "the program ran despite a bad configuration"
  # An inherited POOLCUDA_CONF is checked too.
  POOLCUDA_CONF="pools:[]" run_cli 2 run -- touch "$work/ran"
  has err "at least one pool"
  [ ! -e "$work/ran" ] || fail "the program ran despite a bad inherited configuration"
  run_cli 2 run --conf
  has err "--conf needs a value"
  run_cli 2 run --bogus -- true
  has err "unknown option '--bogus'"
  run_cli 2 run --conf log:off
  has err "needs a program"
  ;;
run-cannot-execute)
  export POOLCUDA_LIBRARY=$stand_in
  run_cli 127 run -- "$work/no-such-program" arg
  has err "cannot execute '$work/no-such-program'"
  has err "No such file or directory"
  run_cli 127 run -- poolcuda-no-such-command-on-path
  has err "cannot execute 'poolcuda-no-such-command-on-path'"
  # A library that is not there is refused before anything runs.
  POOLCUDA_LIBRARY=$work/missing.so run_cli 127 run -- touch "$work/ran"
  has err "POOLCUDA_LIBRARY is '$work/missing.so', which is not a file"
  [ ! -e "$work/ran" ] || fail "the program ran without its library"
  ;;
run-environment)
  export POOLCUDA_LIBRARY=$stand_in
  run_cli 0 run --conf "log:full , free_fence:sync" -- env
  has out "POOLCUDA_CONF=log:full , free_fence:sync"
  has out "LD_PRELOAD=$stand_in"
  # --report-at-exit writes the whole configuration out with report_at_exit:1.
  run_cli 0 run --report-at-exit --conf=log:full -- env
  has out "POOLCUDA_CONF=pools:subslices,"
  has out ",report_at_exit:1,log:full,"
  # --conf replaces an inherited configuration; without --conf the inherited one is kept.
  POOLCUDA_CONF=log:off run_cli 0 run --conf confirm:1 -- env
  has out "POOLCUDA_CONF=confirm:1"
  lacks out "log:off"
  POOLCUDA_CONF=log:off run_cli 0 run -- env
  has out "POOLCUDA_CONF=log:off"
  # The library goes first; other preloads follow and a second copy of ours is dropped.
  LD_PRELOAD="$stand_in" run_cli 0 run -- env
  grep -qxF "LD_PRELOAD=$stand_in" "$work/out" || fail "LD_PRELOAD duplicated the library"
  # The program's own arguments and exit status pass through; the library really loads.
  POOLCUDA_CLI_TEST_MARKER=$work/marker run_cli 7 run -- sh -c 'echo "args:$1"; exit 7' sh "a b"
  has out "args:a b"
  grep -qx loaded "$work/marker" || fail "the preloaded library did not load"
  ;;
run-finds-library)
  # Installed layout: <prefix>/bin/poolcuda finds <prefix>/<libdir>/libpoolcuda.so.
  mkdir -p "$work/prefix/bin" "$work/prefix/$libdir"
  cp "$poolcuda" "$work/prefix/bin/poolcuda"
  cp "$stand_in" "$work/prefix/$libdir/libpoolcuda.so"
  poolcuda=$work/prefix/bin/poolcuda
  run_cli 0 run -- env
  has out "LD_PRELOAD=$work/prefix/$libdir/libpoolcuda.so"
  # Build tree: build/tools/cli/poolcuda finds build/interpose/libpoolcuda.so.
  mkdir -p "$work/build/tools/cli" "$work/build/interpose"
  cp "$poolcuda" "$work/build/tools/cli/poolcuda"
  cp "$stand_in" "$work/build/interpose/libpoolcuda.so"
  poolcuda=$work/build/tools/cli/poolcuda
  run_cli 0 run -- env
  has out "LD_PRELOAD=$work/build/interpose/libpoolcuda.so"
  # POOLCUDA_LIBRARY wins over both.
  POOLCUDA_LIBRARY=$stand_in run_cli 0 run -- env
  has out "LD_PRELOAD=$stand_in"
  # Nothing found: a clear error naming what was tried, and the program does not run.
  rm "$work/build/interpose/libpoolcuda.so"
  run_cli 127 run -- touch "$work/ran"
  has err "cannot find libpoolcuda.so (tried $work/build/interpose/libpoolcuda.so)"
  has err "set POOLCUDA_LIBRARY"
  [ ! -e "$work/ran" ] || fail "the program ran without its library"
  ;;
report-refuses)
  run_cli 2 report
  has err "usage: poolcuda report PID"
  run_cli 2 report 12x
  has err "'12x' is not a process ID"
  # A PID that no process has (beyond the largest PID the kernel hands out).
  run_cli 1 report 2147483646
  has err "no process with PID 2147483646"
  # A process without the library: refused, and the signal (fatal to it) is not sent.
  sleep 30 &
  background_pid=$!
  run_cli 1 report "$background_pid"
  has err "process $background_pid has not loaded libpoolcuda.so"
  has err "nothing was sent"
  sleep 0.2
  kill -0 "$background_pid" 2>/dev/null || fail "the process without the library was signalled"
  kill "$background_pid"; wait "$background_pid" 2>/dev/null; background_pid=
  # A process with the library but report_signal:none: refused.
  POOLCUDA_LIBRARY=$stand_in POOLCUDA_CLI_TEST_MARKER=$work/marker \
    "$poolcuda" run --conf report_signal:none -- sleep 30 &
  background_pid=$!
  wait_for "$work/marker" loaded
  run_cli 1 report "$background_pid"
  has err "report_signal:none"
  has err "nothing was sent"
  ;;
report-sends)
  mkdir "$work/cwd"
  # A relative report path with %p and %n, USR2, JSON; the process runs in $work/cwd.
  (cd "$work/cwd" && POOLCUDA_LIBRARY=$stand_in POOLCUDA_CLI_TEST_MARKER=$work/marker \
    exec "$poolcuda" run --conf "report_signal:USR2,report_format:json,report_path:r-%p-%n.json" \
    -- sleep 30) &
  background_pid=$!
  wait_for "$work/marker" loaded
  run_cli 0 report "$background_pid"
  has out "sent SIGUSR2 to process $background_pid"
  has out "JSON report goes to $work/cwd/r-$background_pid-%n.json"
  has out "%n is the report's number in that process"
  wait_for "$work/marker" SIGUSR2
  kill -0 "$background_pid" 2>/dev/null || fail "the process died from the report signal"
  kill "$background_pid"; wait "$background_pid" 2>/dev/null; background_pid=
  # The default: SIGUSR1, text on the process's standard error.
  POOLCUDA_LIBRARY=$stand_in POOLCUDA_CLI_TEST_MARKER=$work/marker2 "$poolcuda" run -- sleep 30 &
  background_pid=$!
  wait_for "$work/marker2" loaded
  run_cli 0 report "$background_pid"
  has out "sent SIGUSR1 to process $background_pid; its text report goes to that process's"
  has out "report goes to that process's standard error"
  wait_for "$work/marker2" SIGUSR1
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS [$case_name]"
