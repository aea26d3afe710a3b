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
# null_corpus NAME SEED DOCS: a NullTokenizer corpus (--vocab-size 61) of DOCS documents of 3..20
# ids in 1..59 drawn with SEED, preprocessed to $tmp/NAME_text_document (end of document
# appended); exits on failure.
null_corpus() {
  python3 - "$tmp/$1.jsonl" "$2" "$3" <<'EOF'
import json, random, sys
rng = random.Random(int(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[3])):
        doc = [rng.randrange(1, 60) for _ in range(rng.randint(3, 20))]
        f.write(json.dumps({"text": " ".join(map(str, doc))}) + "\n")
EOF
  "$weft" data preprocess --input "$tmp/$1.jsonl" --output-prefix "$tmp/$1" --append-eod \
    --tokenizer-type NullTokenizer --vocab-size 61 >"$tmp/pre.log" 2>&1 ||
    { echo "preprocess $1 failed: $(tail -1 "$tmp/pre.log")"; exit 1; }
}
