# The setup every script of tests/app shares, sourced first: `source "$(dirname "$0")/lib.sh" "$@"`
# with the script's arguments (WEFT [MPIRUN...]). It sets `weft` (the binary) and `mpirun` (the
# launcher and its options, possibly empty), a temporary folder `tmp` removed on exit, the
# failure count `fails`, and the reporters: `ok WHAT`, `bad WHAT` (counts a failure), `check WHAT
# GOT WANT` (a string comparison) and `finish` (the summary line; the exit status, 1 after any
# failure).
set -u
weft=$1
shift
mpirun=("$@")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-$(basename "$0" .sh)-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
check() {  # check WHAT GOT WANT (independent of `bad`, which a script may redefine)
  if [ "$2" == "$3" ]; then
    echo "ok   $1: $2"
  else
    echo "FAIL $1: got '$2', wanted '$3'"
    fails=$((fails + 1))
  fi
}
finish() {
  local name
  name=$(basename "$0" .sh)
  if [ "$fails" -eq 0 ]; then
    echo "$name: all passed"
    exit 0
  fi
  echo "$name: $fails failed"
  exit 1
}
