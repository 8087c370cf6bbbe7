#!/usr/bin/env bash
# Tests of the poolcuda CLI, one case per invocation:
#   cli_test.sh CASE POOLCUDA STAND_IN_LIBRARY LIBDIR MAN_PAGE [TARGET]
# (LIBDIR: meson's libdir, relative to the prefix; MAN_PAGE: the built poolcuda.1). Cases named
# real-* run the build tree's CLI with the real libpoolcuda.so (found beside the CLI, with the
# CUDA stand-in beside it) on TARGET (tests/cli/target.cpp); the others use a stand-in library
# (stand_in_library.cpp). Each case checks exit statuses and output; a failed check prints what
# was seen and exits 1.
set -uo pipefail

case_name=$1
poolcuda=$(readlink -f "$2")
stand_in=$(readlink -f "$3")
libdir=${4:-lib}
man_page=${5:-}
target=${6:+$(readlink -f "$6")}
work=$(mktemp -d)
background_pid=
cleanup() {
  if [ -n "$background_pid" ]; then
    kill -9 "$background_pid" 2>/dev/null
    wait "$background_pid" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# In sanitizer builds CLI_SANITIZER_PRELOAD names the sanitizer's runtime: the CLI gets it in
# LD_PRELOAD (and `poolcuda run` keeps it first for the programs it runs); this script and its
# helpers do not (a sanitizer runtime preloaded into bash crashes it).
sanitizer_preload=${CLI_SANITIZER_PRELOAD:-}
# CLI_FAILING_READ: tests/cli/failing_read.cpp, built (report-target-exits preloads it).
failing_read=${CLI_FAILING_READ:-}
unset CLI_FAILING_READ POOLCUDA_CLI_TEST_FAIL_READ
unset POOLCUDA_CONF POOLCUDA_LIBRARY POOLCUDA_CLI_TEST_MARKER POOLCUDA_RUN_SUMMARY
unset CLI_TARGET_CONSTRUCTOR CLI_TARGET_MARKER LD_LIBRARY_PATH LD_PRELOAD CLI_SANITIZER_PRELOAD
gpu=0
{ [ -e /dev/nvidiactl ] || [ -e /proc/driver/nvidia/version ]; } && gpu=1

fail() {
  echo "FAIL [$case_name]: $*"
  for file in out err target.out target.err; do
    [ -e "$work/$file" ] && { echo "--- $file:"; cat "$work/$file"; }
  done
  exit 1
}

# cli ARGS...: runs poolcuda (with the sanitizer runtime preloaded, if any). In the background
# (`cli ... &`, a subshell) the exec keeps $! the process's own ID.
cli() {
  local preload=$sanitizer_preload
  [ -n "${LD_PRELOAD:-}" ] && preload=${preload:+$preload:}$LD_PRELOAD
  LD_PRELOAD=$preload exec "$poolcuda" "$@"
}

# run_cli EXPECTED_STATUS ARGS...: runs poolcuda, keeping stdout and stderr in $work/out, err.
run_cli() {
  local expected=$1
  shift
  (cli "$@") >"$work/out" 2>"$work/err"
  local status=$?
  [ "$status" -eq "$expected" ] || fail "poolcuda $* exited $status, expected $expected"
}

# has FILE TEXT: FILE (out, err, target.out, target.err) contains TEXT literally.
has() { grep -qF -- "$2" "$work/$1" || fail "$1 lacks: $2"; }
lacks() { ! grep -qF -- "$2" "$work/$1" || fail "$1 should not contain: $2"; }
is_empty() { [ ! -s "$work/$1" ] || fail "$1 should be empty"; }
# count FILE TEXT: how many lines of FILE contain TEXT.
count() { grep -cF -- "$2" "$work/$1"; }

# wait_for FILE TEXT: waits up to 10 s for FILE to contain TEXT.
wait_for() {
  for _ in $(seq 100); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 never contained: $2"
}

# start_target [RUN OPTIONS] -- MODE SECONDS: runs TARGET under `poolcuda run` in the
# background (output in $work/target.out, err) and waits until it is set up and the library's
# reporter listens (its readiness mark is in /proc/PID/maps).
start_target() {
  rm -f "$work/target.out" "$work/target.err"
  cli run "$@" >"$work/target.out" 2>"$work/target.err" &
  background_pid=$!
  wait_for "$work/target.out" ready
}
wait_ready_mark() {
  wait_for "/proc/$background_pid/maps" "poolcuda-ready."
}
stop_target() {
  kill -0 "$background_pid" 2>/dev/null || fail "the target died"
  kill -9 "$background_pid"
  wait "$background_pid" 2>/dev/null
  background_pid=
}

keys="pools persistent free_fence fence_slack report_signal report_format report_path
      report_at_exit log capture_share limit managed managed_slab memgetinfo confirm"

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
  # An answer that cannot reach standard output is a failure, said on standard error.
  status=0
  (cli check-conf "" >/dev/full) 2>"$work/err" || status=$?
  [ "$status" -eq 1 ] || fail "check-conf into a full device exited $status, expected 1"
  has err "cannot write standard output"
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
  run_cli 0 check-conf "report_path:stdout"
  is_empty err
  long_name=$(printf 'r%.0s' $(seq 256))
  run_cli 1 check-conf "report_path:$work/reports/$long_name"
  has err "the file name is 256 bytes, longer than the 255 a name in '$work/reports' may have"
  # The keyword in any case: not a file named STDERR (here a directory, which would be refused).
  mkdir "$work/STDERR"
  (cd "$work" && run_cli 0 check-conf "report_path:STDERR") || exit 1
  is_empty err
  # FIFOs and character devices (links followed) are written in place; a socket cannot be.
  mkfifo "$work/fifo"
  run_cli 0 check-conf "report_path:$work/fifo"
  is_empty err
  ln -s /dev/null "$work/null-link"
  run_cli 0 check-conf "report_path:$work/null-link"
  is_empty err
  ln -s /proc/self/fd/987 "$work/closed-link"
  run_cli 1 check-conf "report_path:$work/closed-link"
  has err "it is a link into /proc to nothing"
  python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
    "$work/socket" || fail "cannot make a socket"
  run_cli 1 check-conf "report_path:$work/socket"
  has err "'$work/socket' is a socket, which cannot be opened; reports would be lost"
  # A directory that takes no new file even from root: check-conf makes a file there to know.
  run_cli 1 check-conf "report_path:/proc/r-%p.txt"
  has err "directory '/proc' does not take new files"
  ls -A "$work/reports" | grep -q . && fail "check-conf left a file in $work/reports"
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
    for command in "run [OPTIONS]" "report [OPTIONS] PID" "trim [OPTIONS] PID" "check-conf STR" \
                   "help [COMMAND | conf]"; do
      has out "$command"
    done
    # One screen: at most 24 lines of at most 80 columns.
    [ "$(wc -l <"$work/out")" -le 24 ] || fail "--help is longer than one screen"
    awk 'length($0) > 80 { exit 1 }' "$work/out" || fail "--help has lines over 80 columns"
    lacks out "managed_slab"
  done
  run_cli 0 help conf
  for key in $keys; do has out "  $key:"; done
  has out "  managed_slab:64MiB"
  has out "  free_fence:auto"
  # Every pool kind and preset the parser accepts.
  for kind in "sliced(" "exclusive(" "split(" "direct(" "subslices|split|exclusive|"; do
    has out "$kind"
  done
  # Every command has its own help, as `COMMAND --help` and as `help COMMAND`.
  for command in run report trim check-conf; do
    run_cli 0 "$command" --help
    has out "usage: poolcuda $command"
    cp "$work/out" "$work/help-$command"
    run_cli 0 help "$command"
    cmp -s "$work/out" "$work/help-$command" || fail "help $command differs from $command --help"
  done
  run_cli 0 run -h
  has out "it REPLACES any"
  has out "--quiet"
  has out "--no-stand-in"
  run_cli 0 report --help
  for option in --json --wide "--to FILE" --keep-stderr "--timeout SECONDS"; do
    has out "$option"
  done
  run_cli 2 help frobnicate
  has err "no help on 'frobnicate'"
  # The manual page is built from the same texts, and the build's copy is that page.
  run_cli 0 help --man
  has out ".TH POOLCUDA 1"
  for section in ".SS run" ".SS report" ".SS trim" ".SS check-conf" ".SH CONFIGURATION"; do
    has out "$section"
  done
  has out "managed_slab:64MiB"
  cmp -s "$work/out" "$man_page" || fail "the built manual page $man_page is not 'help --man'"
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
  # A library that is not there, or is not libpoolcuda.so, is refused before anything runs.
  POOLCUDA_LIBRARY=$work/missing.so run_cli 127 run -- touch "$work/ran"
  has err "POOLCUDA_LIBRARY is '$work/missing.so', which is not a file"
  POOLCUDA_LIBRARY=/etc/passwd run_cli 127 run -- touch "$work/ran"
  has err "/etc/passwd is not an ELF file"
  libc=$(grep -m1 -o '/[^ ]*/libc\.so[^ ]*' /proc/$$/maps)
  POOLCUDA_LIBRARY=$libc run_cli 127 run -- touch "$work/ran"
  has err "$libc is a shared object but not libpoolcuda.so"
  has err "(it does not export poolcuda_library_marker)"
  POOLCUDA_LIBRARY=$work run_cli 127 run -- touch "$work/ran"
  has err "which is not a file"
  [ ! -e "$work/ran" ] || fail "the program ran without its library"
  ;;
run-environment)
  export POOLCUDA_LIBRARY=$stand_in
  run_cli 0 run --conf "log:full , free_fence:sync" -- env
  has out "POOLCUDA_CONF=log:full , free_fence:sync"
  has out "LD_PRELOAD=$stand_in"
  # One start line: the library, the configuration, where CUDA comes from.
  [ "$(wc -l <"$work/err")" -eq 1 ] || fail "more than the start line on stderr"
  has err "poolcuda: run: library $stand_in; configuration: log:full , free_fence:sync; CUDA: "
  # The summary variable names the process run becomes (exec keeps the pid).
  run_cli 0 run -- sh -c 'echo "pid:$$"; env'
  pid=$(sed -n 's/^pid://p' "$work/out")
  has out "POOLCUDA_RUN_SUMMARY=$pid"
  has err "configuration: defaults;"
  # --quiet: no start line, no summary variable (not even an inherited one).
  POOLCUDA_RUN_SUMMARY=1 run_cli 0 run --quiet -- env
  is_empty err
  lacks out "POOLCUDA_RUN_SUMMARY"
  run_cli 0 run -q -- true
  is_empty err
  # --report-at-exit writes the whole configuration out with report_at_exit:1.
  run_cli 0 run --report-at-exit --conf=log:full -- env
  has out "POOLCUDA_CONF=pools:subslices,"
  has out ",report_at_exit:1,log:full,"
  has err "configuration: log:full + report at exit;"
  # --conf replaces an inherited configuration; without --conf the inherited one is kept.
  POOLCUDA_CONF=log:off run_cli 0 run --conf confirm:1 -- env
  has out "POOLCUDA_CONF=confirm:1"
  lacks out "log:off"
  POOLCUDA_CONF=log:off run_cli 0 run -- env
  has out "POOLCUDA_CONF=log:off"
  # The library goes first, after sanitizer runtimes; other preloads follow and a second copy
  # of ours is dropped.
  LD_PRELOAD="$stand_in" run_cli 0 run -- env
  grep -qxF "LD_PRELOAD=$stand_in" "$work/out" || fail "LD_PRELOAD duplicated the library"
  mkdir "$work/sanitizer"
  cp "$stand_in" "$work/sanitizer/libasan.so.8"
  cp "$stand_in" "$work/sanitizer/other.so"
  LD_PRELOAD="$work/sanitizer/other.so $work/sanitizer/libasan.so.8" run_cli 0 run -- env
  has out "LD_PRELOAD=$work/sanitizer/libasan.so.8:$stand_in:$work/sanitizer/other.so"
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
  [ $gpu -eq 1 ] || has err "CUDA: no GPU found and no CUDA stand-in beside the library"
  # Build tree: build/tools/cli/poolcuda finds build/interpose/libpoolcuda.so, and without a
  # GPU the CUDA stand-in in build/tests/simcuda.
  mkdir -p "$work/build/tools/cli" "$work/build/interpose" "$work/build/tests/simcuda"
  cp "$poolcuda" "$work/build/tools/cli/poolcuda"
  cp "$stand_in" "$work/build/interpose/libpoolcuda.so"
  touch "$work/build/tests/simcuda/libcudart.so.13"
  poolcuda=$work/build/tools/cli/poolcuda
  LD_LIBRARY_PATH=/elsewhere run_cli 0 run -- env
  has out "LD_PRELOAD=$work/build/interpose/libpoolcuda.so"
  if [ $gpu -eq 1 ]; then
    has err "CUDA: the GPU driver"
    has out "LD_LIBRARY_PATH=/elsewhere"
  else
    has err "CUDA: no GPU found, using the CUDA stand-in in $work/build/tests/simcuda"
    has out "LD_LIBRARY_PATH=$work/build/tests/simcuda:/elsewhere"
    LD_LIBRARY_PATH=/elsewhere run_cli 0 run --no-stand-in -- env
    has err "CUDA: no GPU found, stand-in not used (--no-stand-in)"
    grep -qx "LD_LIBRARY_PATH=/elsewhere" "$work/out" || fail "--no-stand-in changed the path"
  fi
  # POOLCUDA_LIBRARY wins over both.
  POOLCUDA_LIBRARY=$stand_in run_cli 0 run -- env
  has out "LD_PRELOAD=$stand_in"
  # Nothing found: a clear error naming what was tried, and the program does not run.
  rm "$work/build/interpose/libpoolcuda.so"
  run_cli 127 run -- touch "$work/ran"
  has err "cannot find libpoolcuda.so (tried $work/build/interpose/libpoolcuda.so)"
  has err "set POOLCUDA_LIBRARY"
  [ ! -e "$work/ran" ] || fail "the program ran without its library"
  # Neither installed nor in a build tree: no made-up path, the reason instead.
  mkdir "$work/loose"
  cp "$poolcuda" "$work/loose/poolcuda"
  poolcuda=$work/loose/poolcuda
  run_cli 127 run -- touch "$work/ran"
  has err "cannot find libpoolcuda.so: $work/loose/poolcuda is neither installed with it nor in"
  lacks err "tried"
  [ ! -e "$work/ran" ] || fail "the program ran without its library"
  ;;
report-refuses)
  run_cli 2 report
  has err "usage: poolcuda report [--json | --wide] [--to FILE | --keep-stderr]"
  has err "[--timeout SECONDS] PID"
  run_cli 2 report 12x
  has err "'12x' is not a process ID"
  run_cli 2 report --bogus 1
  has err "unexpected argument '--bogus'"
  run_cli 2 report --timeout 0 1
  has err "--timeout takes a whole number of seconds"
  run_cli 2 report --timeout=0 1
  has err "--timeout takes a whole number of seconds from 1 to 3600, not '0'"
  run_cli 2 report --timeout= 1
  has err "--timeout needs a value"
  run_cli 2 report --json=1 1
  has err "unexpected argument '--json=1'"
  run_cli 2 trim --to=x 1
  has err "unexpected argument '--to=x'"
  run_cli 2 report --keep-stderr --json 1
  has err "cannot be combined with --json, --wide or --to"
  run_cli 2 report --json --wide 1
  has err "choose one"
  run_cli 2 trim --json 1
  has err "unexpected argument '--json'"
  # A PID that no process has (beyond the largest PID the kernel hands out).
  run_cli 1 report 2147483646
  has err "no process with PID 2147483646"
  run_cli 1 trim 2147483646
  has err "no process with PID 2147483646"
  # A process without the library: refused, and the signal (fatal to it) is not sent.
  sleep 30 &
  background_pid=$!
  run_cli 1 report "$background_pid"
  has err "process $background_pid has not loaded libpoolcuda.so"
  has err "nothing was sent"
  sleep 0.2
  kill -0 "$background_pid" 2>/dev/null || fail "the process without the library was signalled"
  stop_target
  # The library mapped with report_signal:none: refused.
  POOLCUDA_LIBRARY=$stand_in POOLCUDA_CLI_TEST_MARKER=$work/marker \
    cli run --conf report_signal:none -- sleep 30 2>/dev/null &
  background_pid=$!
  wait_for "$work/marker" loaded
  run_cli 1 report "$background_pid"
  has err "report_signal:none"
  has err "nothing was sent"
  stop_target
  # The library mapped but no readiness mark, and the program handles the signal itself (this
  # stand-in installs handlers for both signals): refused, never signalled.
  for signal in USR1 USR2; do
    POOLCUDA_LIBRARY=$stand_in POOLCUDA_CLI_TEST_MARKER=$work/marker-$signal \
      cli run --conf report_signal:$signal -- sleep 30 2>/dev/null &
    background_pid=$!
    wait_for "$work/marker-$signal" loaded
    run_cli 1 report "$background_pid"
    has err "process $background_pid has its own SIG$signal handler"
    run_cli 1 trim "$background_pid"
    has err "has its own SIG$signal handler"
    sleep 0.2
    [ "$(cat "$work/marker-$signal")" = loaded ] || fail "the process was signalled"
    stop_target
  done
  ;;
report-target-exits)
  # The process exits while the CLI reads its /proc files: a read that fails with ESRCH (made to
  # fail here every time) is that exit, and the CLI says so with status 1; it used to abort on
  # an exception.
  [ -n "$failing_read" ] || { echo "skipped: CLI_FAILING_READ is not set"; exit 77; }
  sleep 30 &
  background_pid=$!
  for file in status maps environ; do
    POOLCUDA_CLI_TEST_FAIL_READ=/proc/$background_pid/$file LD_PRELOAD=$failing_read \
      run_cli 1 report "$background_pid"
    has err "process $background_pid exited before it answered"
  done
  POOLCUDA_CLI_TEST_FAIL_READ=/proc/$background_pid/maps LD_PRELOAD=$failing_read \
    run_cli 1 trim "$background_pid"
  has err "process $background_pid exited before it answered"
  # A thread's name that cannot be read only means that thread is not the reporter.
  POOLCUDA_CLI_TEST_FAIL_READ=/proc/$background_pid/task/$background_pid/comm \
    LD_PRELOAD=$failing_read run_cli 1 report "$background_pid"
  has err "process $background_pid has not loaded libpoolcuda.so"
  stop_target
  ;;
real-report)
  start_target -- "$target" cuda 60
  wait_ready_mark
  pid=$background_pid
  # The report comes back to the caller; the program's own output sees nothing of it.
  run_cli 0 report "$pid"
  has out "poolcuda report #1 (pid $pid, request)"
  has out "device 0:"
  is_empty err
  # JSON: a reader of the report's numbers (reserved counts the freed 64 MiB until a trim).
  json_number() {
    python3 -c '
import json, sys
print(json.load(open(sys.argv[1]))["devices"][0]["memory"][sys.argv[2]])' "$work/out" "$1" ||
      fail "report --json is not the JSON report"
  }
  run_cli 0 report --json "$pid"
  [ "$(json_number bytes_in_use)" -eq $((1 << 20)) ] || fail "1 MiB is not in use"
  [ "$(json_number bytes_reserved)" -ge $((65 << 20)) ] || fail "the freed 64 MiB are not held"
  run_cli 0 report --wide "$pid"
  has out "poolcuda report #3"
  run_cli 0 report --to "$work/report.txt" "$pid"
  is_empty out
  grep -qF "poolcuda report #4 (pid $pid, request)" "$work/report.txt" ||
    fail "--to wrote no report"
  lacks target.err "poolcuda report #"
  # A file that cannot be written is refused before the process is asked: the next report is
  # still #5.
  run_cli 1 report --to "$work/missing/report.txt" "$pid"
  has err "cannot write $work/missing/report.txt"
  # --keep-stderr: the process writes it where its configuration says, and the CLI says where.
  run_cli 0 report --keep-stderr "$pid"
  has out "process $pid: report #5 written to standard error"
  wait_for "$work/target.err" "poolcuda report #5 (pid $pid, request)"
  # trim: the freed 64 MiB go back to the driver, the kept 1 MiB stays.
  run_cli 0 trim "$pid"
  has out "device 0: released 64.0 MiB"
  has out "(in use 1.00 MiB, waiting for fences 0 B)"
  run_cli 0 report --json "$pid"
  [ "$(json_number bytes_reserved)" -lt $((64 << 20)) ] || fail "the trim released nothing"
  # Values attached with '='.
  run_cli 0 report --timeout=5 --to="$work/attached.txt" "$pid"
  grep -qF "(pid $pid, request)" "$work/attached.txt" || fail "--to=FILE wrote no report"
  stop_target
  ;;
real-refusals)
  # Its own handler, installed before the library loaded: the library leaves it alone.
  CLI_TARGET_CONSTRUCTOR=handler start_target -- "$target" sleep 60
  has target.out "constructor: handler"
  run_cli 1 report "$background_pid"
  has err "process $background_pid has its own SIGUSR1 handler"
  stop_target
  # Its own handler, installed after the library's: the mark goes within a second (a request
  # sent before then reaches the program's handler and goes unanswered).
  start_target -- "$target" handler 60
  sleep 1.2
  for _ in $(seq 20); do
    (cli report --timeout 1 "$background_pid") >"$work/out" 2>"$work/err"
    grep -qF "has its own SIGUSR1 handler" "$work/err" && break
  done
  has err "process $background_pid has its own SIGUSR1 handler"
  stop_target
  # The signal set back to its default action after the library's handler: refused for good,
  # never signalled (the signal would kill it).
  start_target -- "$target" default 60
  run_cli 1 report "$background_pid"
  has err "process $background_pid was ready, but SIGUSR1 no longer has a handler"
  wait_for "$work/target.err" "the program set SIGUSR1 back to the default: report requests"
  stop_target
  # The signal ignored (inherited through exec).
  start_target -- sh -c 'trap "" USR1; exec "$0" sleep 60' "$target"
  run_cli 1 report "$background_pid"
  has err "process $background_pid ignores SIGUSR1"
  stop_target
  # The library mapped, its constructor not run yet (a constructor of the program's own
  # libraries sleeps first): refused, never killed; it answers once the library is ready.
  CLI_TARGET_CONSTRUCTOR=sleep:2000 CLI_TARGET_MARKER=$work/constructor \
    cli run -- "$target" sleep 60 >"$work/target.out" 2>"$work/target.err" &
  background_pid=$!
  wait_for "$work/constructor" constructor
  run_cli 1 report "$background_pid"
  has err "process $background_pid has loaded libpoolcuda.so but is not ready to answer"
  wait_for "$work/target.out" ready
  wait_ready_mark
  run_cli 0 report "$background_pid"
  has out "poolcuda report #1"
  stop_target
  # report_signal:none.
  start_target --conf report_signal:none -- "$target" sleep 60
  run_cli 1 report "$background_pid"
  has err "runs with report_signal:none"
  stop_target
  # The first CUDA call made by a constructor of the program's own libraries, which run before
  # the library's: the process answers all the same.
  CLI_TARGET_CONSTRUCTOR=cuda start_target -- "$target" nocuda 60
  wait_ready_mark
  run_cli 0 report "$background_pid"
  has out "poolcuda report #1"
  stop_target
  # A process that has made no CUDA call has no handler and no thread of the library's: refused,
  # and the report signal ends it as it ends the plain program.
  start_target -- "$target" nocuda 60
  run_cli 1 report "$background_pid"
  has err "process $background_pid has loaded libpoolcuda.so but is not ready to answer (it has"
  has err "(it has made no CUDA call the library intercepts yet"
  kill -USR1 "$background_pid"
  wait "$background_pid"
  status=$?
  [ "$status" -eq $((128 + 10)) ] || fail "SIGUSR1 left the process with status $status"
  background_pid=
  # A privilege-dropping tool that sets its capabilities back on its own thread between
  # setresuid and setresgid: the C library aborts a set-ID call that fails on any other thread.
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    cli run -- setpriv --reuid=65534 --regid=65534 --clear-groups true >"$work/out" 2>"$work/err" ||
      fail "setpriv under the library exited $?"
  fi
  # A process the library's answer could not come back from (it opens this command's pipe
  # through /proc): refused at once, nothing sent, instead of a wait for the timeout.
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    # Another user's (this command runs as root).
    start_target -- setpriv --reuid=65534 --regid=65534 --clear-groups "$target" sleep 60
    wait_ready_mark
    run_cli 1 report --timeout 30 "$background_pid"
    has err "process $background_pid runs as "
    has err "which may not open the reply pipe of this command (uid 0); nothing was sent"
    stop_target
  fi
  if [ "$(id -u)" = 0 ] && unshare --pid --fork true 2>/dev/null; then
    # One in a PID namespace below this command's.
    start_target -- unshare --pid --fork "$target" sleep 60
    inner=$(pgrep -P "$background_pid")
    wait_for "/proc/$inner/maps" "poolcuda-ready."
    run_cli 1 report --timeout 30 "$inner"
    has err "process $inner runs in another PID namespace (a container's, where it is PID 1)"
    stop_target
  fi
  # The same with a copy of the library under another name: still the library (its marker).
  build=$(dirname "$(dirname "$(dirname "$poolcuda")")")
  mkdir -p "$work/renamed/interpose" "$work/renamed/tests"
  cp "$build/interpose/libpoolcuda.so" "$work/renamed/interpose/site-allocator.so"
  ln -s "$build/tests/simcuda" "$work/renamed/tests/simcuda"
  POOLCUDA_LIBRARY=$work/renamed/interpose/site-allocator.so \
    start_target --conf report_signal:none -- "$target" sleep 60
  run_cli 1 report "$background_pid"
  has err "runs with report_signal:none"
  stop_target
  ;;
real-eintr)
  # Requests go to the reporter thread: the program's blocking calls are never interrupted.
  start_target -- "$target" poll 3
  wait_ready_mark
  for _ in 1 2 3 4 5; do run_cli 0 report "$background_pid"; done
  wait "$background_pid"
  status=$?
  background_pid=
  [ "$status" -eq 0 ] || fail "the target exited $status"
  has target.out "eintr 0"
  ;;
real-run)
  # Without LD_LIBRARY_PATH, the program finds CUDA (the stand-in, when there is no GPU).
  run_cli 0 run -- "$target" cuda 0
  has out ready
  build_dir=$(cd "$(dirname "$poolcuda")/../.." && pwd)
  has err "poolcuda: run: library $build_dir/interpose/libpoolcuda.so"
  [ $gpu -eq 1 ] || has err "CUDA: no GPU found, using the CUDA stand-in in"
  # One summary line from the program itself, at exit.
  [ "$(count err "poolcuda: device 0: peak in use 65.0 MiB, peak reserved")" -eq 1 ] ||
    fail "no summary, or more than one"
  has err "cudaMalloc/cudaFree calls saved;"
  run_cli 0 run --quiet -- "$target" cuda 0
  is_empty err
  # The summary is the process run became; its children keep quiet.
  run_cli 0 run -- sh -c '"$0" cuda 0; "$0" cuda 0' "$target"
  [ "$(count err "poolcuda:")" -eq 1 ] || fail "children wrote a summary or a log line"
  ;;
real-report-at-exit)
  # A wrapper script: only the process that made CUDA calls writes its exit report; the shell
  # and the other commands say nothing.
  run_cli 0 run --quiet --report-at-exit -- sh -c 'true; "$0" cuda 0; ls / >/dev/null; true' \
    "$target"
  [ "$(count err "poolcuda report #")" -eq 1 ] || fail "not exactly one report"
  has err "device 0:"
  lacks err "no device has pools yet"
  [ "$(count err "poolcuda")" -eq 1 ] || fail "other lines from the library"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "PASS [$case_name]"
