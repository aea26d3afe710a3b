#!/usr/bin/env bash
# Writes the main job's corpus: every English fortune that Debian's `fortunes` package ships
# (/usr/share/games/fortunes, records separated by lines holding a single "%"), one document
# per line (the .txt input of `weft data preprocess`): line breaks and tabs inside a fortune
# become spaces, other control characters are dropped. Usage: fortunes_corpus.sh OUT.txt
set -euo pipefail
DIR=/usr/share/games/fortunes
OUT=${1:?usage: fortunes_corpus.sh OUT.txt}
[ -d "$DIR" ] || { echo "fortunes_corpus.sh: $DIR missing (apt-get install fortunes)" >&2; exit 2; }
for f in "$DIR"/*; do
  case $f in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] || continue
  cat "$f"
  printf '\n%%\n'
done | awk 'BEGIN { RS = "\n%\n" }
  { gsub(/[\t\n]/, " "); gsub(/[\001-\037]/, ""); gsub(/  +/, " "); gsub(/^ +| +$/, "");
    if (length($0) > 0) print }' > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
