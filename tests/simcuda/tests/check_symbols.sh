#!/usr/bin/env bash
# Checks that the stand-in libraries export what the real ones export: every libcudart.so.13
# symbol with the version node libcudart.so.13, every libcuda.so.1 symbol (unversioned), and the
# same SONAMEs. usage: check_symbols.sh STANDIN_DIR TOOLKIT_LIB64
set -euo pipefail
standin=$1
toolkit=$2
fail=0

exports() {  # file -> "name version" lines of defined dynamic symbols (global or weak: the
             # stand-in's entry points that only report "not supported" are weak)
  objdump -T "$1" | awk '$2 ~ /^[gw]$/ && $4 != "*UND*" && NF >= 6 {print $NF, (NF >= 7 ? $(NF-1) : "Base")}' | sort -u
}

check() {  # real standin label
  local missing
  missing=$(comm -23 <(exports "$1") <(exports "$2"))
  if [[ -n "$missing" ]]; then
    echo "FAIL: $3: $(wc -l <<<"$missing") symbols differ, e.g.:"
    head -5 <<<"$missing"
    fail=1
  else
    echo "ok: $3: every real export present with the same version"
  fi
  local soname_real soname_ours
  soname_real=$(objdump -p "$1" | awk '$1 == "SONAME" {print $2}')
  soname_ours=$(objdump -p "$2" | awk '$1 == "SONAME" {print $2}')
  if [[ "$soname_real" != "$soname_ours" ]]; then
    echo "FAIL: $3: SONAME $soname_ours, expected $soname_real"
    fail=1
  else
    echo "ok: $3: SONAME $soname_ours"
  fi
}

check "$toolkit/libcudart.so.13" "$standin/libcudart.so.13" libcudart
check "$toolkit/stubs/libcuda.so" "$standin/libcuda.so.1" libcuda
if ! exports "$standin/libcudart.so.13" | grep -x 'simcuda_counter libcudart.so.13' >/dev/null; then
  echo "FAIL: libcudart: simcuda_counter is not exported"
  fail=1
fi
exit $fail
