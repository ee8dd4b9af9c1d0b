#!/usr/bin/env bash
# Helpers shared by build_engine.sh and launch_triton.sh, which source this file from their own
# directory (the image puts both, and this file, in one folder on PATH). Callers set PROG first.

die() {
  echo "$PROG: error: $*" >&2
  exit 1
}
note() { echo "$PROG: $*" >&2; }

need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"; }

require_uint() { [[ $2 =~ ^[0-9]+$ && $2 -ge 1 ]] || die "$1 must be a positive integer, got '$2'"; }

# Quote for display the way a reader can paste it back into a shell: plain words stay bare.
shell_quote() {
  local out="" arg
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+="$arg "
    else
      out+="'${arg//\'/\'\\\'\'}' "
    fi
  done
  echo "${out% }"
}
