#!/usr/bin/env bash
# `weft mesh` (app/cmd_mesh.cpp) against the worked examples of DESIGN.md, in both outputs:
#   world 8, pp 2, ep 2: dp [0,1,2,3] [4,5,6,7]; pp [0,4] [1,5] [2,6] [3,7];
#     ep [0,1] [2,3] [4,5] [6,7]; edp [0,2] [1,3] [4,6] [5,7]; embedding = pp groups.
#   HSDP pp 2, dp_outer 2: shard [0,1] [2,3] [4,5] [6,7]; replicate [0,2] [1,3] [4,6] [5,7].
# The --json output is read with sed/grep only (one line, compact); the table is checked per
# rank: every member of every expected group lists exactly that group. A bad layout exits 2
# with one stderr line naming the flag and prints nothing on stdout.
# Usage: mesh_cmd.sh WEFT [MPIRUN...] (the mesh needs no MPI; MPIRUN is ignored)
set -u
weft=$1
fails=0
failed() { echo "FAIL: $*"; fails=$((fails + 1)); }

# The JSON array of arrays of one group kind, e.g. [[0,4],[1,5]], from the "groups" object.
json_groups() {  # json_groups JSON KIND
  printf '%s\n' "$1" | sed 's/.*"groups":{//' | grep -oE "\"$2\":\[[][0-9,]*\]" |
    sed "s/^\"$2\"://"
}
json_size() {  # json_size JSON AXIS: the axis size from the "sizes" object
  printf '%s\n' "$1" | sed 's/.*"sizes":{\([^}]*\)}.*/\1/' | tr ',' '\n' |
    sed -n "s/^\"$2\":\([0-9]*\)$/\1/p"
}
# expect_json JSON KIND "a,b a,b ...": the groups of KIND, in this order.
expect_json() {
  local want got
  want="[$(printf '[%s],' $3 | sed 's/,$//')]"
  got=$(json_groups "$1" "$2")
  [ "$got" = "$want" ] && echo "ok   json $2 $got" || failed "json $2: got '$got', wanted '$want'"
}
# expect_table TABLE KIND "a,b a,b ...": in the table, each member r of each group lists, under
# its "rank r:" block, KIND with exactly that group ("[a, b]").
expect_table() {
  local g r got n=0 bad=0
  for g in $3; do
    for r in ${g//,/ }; do
      got=$(printf '%s\n' "$1" | awk -v r="$r" -v k="$2" '
        /^rank / { cur = $2; sub(":", "", cur); next }
        cur == r && $1 == k { $1 = ""; sub(/^ /, ""); print }')
      [ "$got" = "[${g//,/, }]" ] || { failed "table rank $r $2: got '$got', wanted '[${g//,/, }]'"; bad=1; continue; }
      n=$((n + 1))
    done
  done
  [ "$bad" -eq 0 ] && echo "ok   table $2: $n ranks"
}

layout=(mesh --world-size 8 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2)
json=$("$weft" "${layout[@]}" --json) || failed "mesh --json exit $?"
[ "$(printf '%s\n' "$json" | wc -l)" -eq 1 ] || failed "--json is not one line"
printf '%s' "$json" | grep -q '^{"world":8,"order":"tp-cp-ep-dp-pp",' || failed "json head: $json"
for a in tp:1 cp:1 pp:2 dp:4 ep:2 etp:1 edp:2 dp_outer:1; do
  [ "$(json_size "$json" "${a%%:*}")" = "${a#*:}" ] || failed "json size ${a%%:*} is not ${a#*:}"
done
dp="0,1,2,3 4,5,6,7"
pp="0,4 1,5 2,6 3,7"
ep="0,1 2,3 4,5 6,7"
edp="0,2 1,3 4,6 5,7"
expect_json "$json" dp "$dp"
expect_json "$json" pp "$pp"
expect_json "$json" ep "$ep"
expect_json "$json" edp "$edp"
expect_json "$json" embedding "$pp"
expect_json "$json" fsdp_shard "$dp"
expect_json "$json" expert_fsdp_shard "$edp"
expect_json "$json" fsdp_replicate "0 1 2 3 4 5 6 7"

table=$("$weft" "${layout[@]}") || failed "mesh exit $?"
printf '%s\n' "$table" | head -1 |
  grep -qE '^world 8 +order tp-cp-ep-dp-pp +tp 1 cp 1 pp 2 dp 4 +ep 2 etp 1 edp 2 +dp_outer 1$' ||
  failed "table head: $(printf '%s\n' "$table" | head -1)"
[ "$(printf '%s\n' "$table" | grep -c '^rank ')" -eq 8 ] || failed "table: not 8 rank blocks"
expect_table "$table" dp "$dp"
expect_table "$table" pp "$pp"
expect_table "$table" ep "$ep"
expect_table "$table" edp "$edp"
expect_table "$table" embedding "$pp"
# Coordinates: rank 5 is the second of dp [4,5,6,7], on stage 1, second of ep [4,5], first of
# edp [5,7].
printf '%s\n' "$table" | grep -qE '^rank +5: tp=0 cp=0 dp=1 pp=1 etp=0 ep=1 edp=0$' ||
  failed "rank 5 coordinates: $(printf '%s\n' "$table" | grep -E '^rank +5:')"

hsdp=$("$weft" mesh --world-size 8 --pipeline-model-parallel-size 2 \
  --num-distributed-optimizer-instances 2 --json) || failed "HSDP mesh exit $?"
expect_json "$hsdp" fsdp_shard "0,1 2,3 4,5 6,7"
expect_json "$hsdp" fsdp_replicate "0,2 1,3 4,6 5,7"
expect_json "$hsdp" dp "$dp"
expect_json "$hsdp" pp "$pp"

# bad_layout NEEDLE FLAGS...: exit 2, nothing on stdout, one stderr line containing NEEDLE.
bad_layout() {
  local needle=$1 out err rc
  shift
  out=$("$weft" mesh "$@" 2>"$dir_err")
  rc=$?
  err=$(cat "$dir_err")
  if [ "$rc" -ne 2 ] || [ -n "$out" ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] ||
     ! printf '%s' "$err" | grep -q '^weft: error: ' || ! printf '%s' "$err" | grep -qF -- "$needle"; then
    failed "mesh $*: exit $rc, stdout '${out:0:80}', stderr '$err', wanted '$needle'"
  else
    echo "ok   bad layout ($*): $err"
  fi
}
dir_err=$(mktemp /tmp/weft-mesh-cmd-XXXXXX)
trap 'rm -f "$dir_err"' EXIT
bad_layout "tp*cp*pp = 1*1*3 = 3 (--tensor-model-parallel-size, --context-parallel-size, --pipeline-model-parallel-size)" \
  --world-size 8 --pipeline-model-parallel-size 3
bad_layout "etp*ep*pp = 1*8*2 = 16 (--expert-tensor-parallel-size, --expert-model-parallel-size, --pipeline-model-parallel-size)" \
  --world-size 8 --pipeline-model-parallel-size 2 --expert-model-parallel-size 8
bad_layout "--num-distributed-optimizer-instances 3 does not divide" \
  --world-size 8 --num-distributed-optimizer-instances 3
bad_layout "--tensor-model-parallel-size must be >= 1" --world-size 8 --tensor-model-parallel-size 0
bad_layout "--world-size must be >= 1" --world-size 0
bad_layout "--world-size must be <= 1048576 (got 2147483647)" --world-size 2147483647
bad_layout "not divisible by tp*cp*pp = 1048576*1048576*1 = 1099511627776" --world-size 1048576 \
  --tensor-model-parallel-size 1048576 --context-parallel-size 1048576
bad_layout "--pipeline-model-parallel-size" --world-size 8 --pipeline-model-parallel-size x
bad_layout "--json" --world-size 8 --json=maybe

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all mesh checks passed"
