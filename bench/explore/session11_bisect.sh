#!/usr/bin/env bash
# Session 11 (issue 3): bisect of the SmolLM2-135M fused step at 6 rows: 670.4 / 677.3 us in sessions 4 / 5
# (session4/call6, session5/call4), 711.4 at 28e421d (session10/call8, after the L2-prefetch fix; 853.6 before
# it), 1 row ~600-618 throughout. One device call:
#     run("bash bench/explore/session11_bisect.sh", carry=[".stage/bisect"])
# .stage/bisect/<sha>: detached `git worktree`s holding only lowlat/ of each commit (made on the CPU machine):
#   f297717  last commit before the prologue rewrite (session-4 kernels; 669-671 us in session 4)
#   ca66487  the attention prologue as a pair GEMV: session 5's call4 measured 677.3 us here
#   b610aa3  session-5 final review (prologue finisher, GemvWorkspace counters, rstd_of); the dense step is
#            the same code up to 2f7fd3e except the cached device properties
#   2f7fd3e  the commit right before a1f137f
#   a1f137f  draft position (FusedModel's new static buffers, imports of rms_norm / draft_sampling)
#   28e421d  the L2-prefetch fix (session 10 call8: 711.4 us)
#   8eeb60e  HEAD (prefetch without the masked-address select; FusedModel's KV checks)
#   work     the session-11 working tree's lowlat/ (copied to .stage/bisect/work): _gemv.rstd_of correctly
#            rounded (div.rn mean); call 1 of session 11 saw every norm-folding launch ~0.6-0.8 us slower
# Every run is that commit's own `python3 -m lowlat.bench --sections step --models SmolLM2-135M --rows 1,6`
# (random weights on the device, no download; the same bench_step / replay_time_us code at every commit) with
# cwd and PYTHONPATH = the worktree. Rows 1 and 6 in one process as sessions 4, 5 and 10 ran them (one
# FusedModel of widths (1, 6)).
#   phase 1: every commit once, oldest first; phase 2: every commit again, newest first (drift shows as an
#            order effect); phase 3 (as time allows): the pre-fix commits with the fix of 28e421d applied
#            (copies in /tmp, tag <sha>+pf) and a few commits as they are, each through a driver that runs
#            the same bench with the fused step graph also traced under CUPTI (what `--sections step,profile`
#            does at HEAD: each launch's cost in the step per role, and the replay's device span), the 20
#            event-timed samples kept, replays timed back to back (the bench synchronizes before each one, so
#            its number includes the graph launch) and the host time of one replay.
# Expected: ~8-15 s a run (Triton compiles in a commit's first run), ~2 x 7 runs + 6-8 in phase 3: ~240-280 s.
# No run starts when its estimated end passes BISECT_LIMIT_S (default 280 s of script time); every run is
# cut at BISECT_HARD_S (default 300). BISECT_ROUNDS (2), BISECT_PHASE3 (1 = on).
# Results: $OUT/bisect/<tag>/r<round>.json|log (round p: phase 3, with prof.json), $OUT/bisect/summary.json.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
ROOT=$PWD
BIS=$ROOT/.stage/bisect
LIMIT=${BISECT_LIMIT_S:-280}
HARD=${BISECT_HARD_S:-300}
ROUNDS=${BISECT_ROUNDS:-2}
PHASE3=${BISECT_PHASE3:-1}
COMMITS=(f297717 ca66487 b610aa3 2f7fd3e a1f137f 28e421d 8eeb60e work)
# phase 3, in order of priority ("+pf": the commit with 28e421d's predicated prefetch_l2)
PHASE3_TAGS=(work 8eeb60e ca66487+pf a1f137f+pf ca66487 f297717+pf b610aa3+pf a1f137f 2f7fd3e+pf)
BENCH_ARGS=(--sections step --models SmolLM2-135M --rows 1,6 --budget-s 60)
mkdir -p "$OUT/bisect"
ok=()
for c in "${COMMITS[@]}"; do
  if [ -f "$BIS/$c/lowlat/bench.py" ]; then ok+=("$c"); else echo "missing worktree $BIS/$c (carry .stage/bisect)"; fi
done
COMMITS=("${ok[@]}")
[ ${#COMMITS[@]} -gt 0 ] || { echo "no worktrees under $BIS"; exit 1; }

# the driver of phase 3: the bench of the lowlat on PYTHONPATH, its fused-step timing also traced under CUPTI
cat > /tmp/bisect_prof.py <<'PY'
"""python3 bisect_prof.py PROF_JSON BENCH_ARGS...: `python -m lowlat.bench BENCH_ARGS` of the lowlat on
PYTHONPATH, with bench_step's replay_time_us (the fused step's timing) replaced by the same median of
event_times_us that also keeps the samples, then traces 10 replays under torch.profiler (as HEAD's
`kernel_trace` / `launch_costs`, copied here because the older commits it runs lack them: each launch's cost
= its end minus the previous launch's end; span = first
start to last end of a replay), times the host side of single replays (`host_replay_us`) and replays queued
back to back (b2b_us; the bench's replay_time_us synchronizes before each replay)."""
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROLES = {"_attn_prologue_kernel": "attn_prologue", "_decode_attention_kernel": "decode_attention",
         "_gate_up_kernel": "gate_up", "_lm_head_kernel": "lm_head"}


def kernel_trace(run, iters, warmup=2):
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    ev = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    return sorted(((e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev), key=lambda k: k[1])


def roles_of(names):
    out, gemvs = [], 0
    for n in names:
        if n.startswith("_residual_gemv_kernel"):
            out.append("out_proj" if gemvs == 0 else "down")
            gemvs += 1
            continue
        role = next((r for k, r in ROLES.items() if n.startswith(k)), None)
        if role == "attn_prologue":
            gemvs = 0
        out.append(role or "other:" + n[:40])
    return out


def profile(run, replays=10):
    trace = kernel_trace(run, replays)
    n, rem = divmod(len(trace), replays)
    if n == 0 or rem:
        raise ValueError(f"{len(trace)} kernels in {replays} replays")
    names = [k[0] for k in trace[:n]]
    roles = roles_of(names)
    costs, spans = {}, []
    for r in range(replays):
        chunk = trace[r * n:(r + 1) * n]
        if [k[0] for k in chunk] != names:
            raise ValueError(f"replay {r} launched other kernels than replay 0")
        for i, (role, (_, start, end)) in enumerate(zip(roles, chunk)):
            costs.setdefault(role, []).append(end - (chunk[i - 1][2] if i else start))
        spans.append(max(k[2] for k in chunk) - chunk[0][1])
    per = {role: {"us": round(statistics.median(c), 2), "per_step_us": round(sum(c) / replays, 2),
                  "launches": len(c)} for role, c in costs.items()}
    return {"kernels_per_replay": n, "roles": per, "sum_per_step_us": round(sum(v["per_step_us"] for v in per.values()), 1),
            "span_us": round(statistics.median(spans), 1)}


def host_replay_us(g, n=8):
    """Host time (us) of one g.replay() call on an idle GPU (synchronized before each): the enqueue cost of
    the graph launch, which back-to-back event timing would show if it exceeded the GPU time of the step."""
    import time

    import torch

    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        out.append(round((time.perf_counter() - t0) * 1e6, 1))
    torch.cuda.synchronize()
    return out


def main():
    prof_json, argv = sys.argv[1], sys.argv[2:]
    import lowlat.bench as B
    import lowlat.benchmarking as BM

    doc = {"lowlat": str(Path(B.__file__).parent), "argv": argv, "runs": []}

    def save():
        Path(prof_json).write_text(json.dumps(doc, indent=1))

    def timed(g, *, iters=15, warmup=2):
        samples = BM.event_times_us(g.replay, iters=iters, warmup=warmup)
        us = statistics.median(samples)
        entry = {"rows": sys._getframe(1).f_locals.get("rows"), "us": round(us, 2),
                 "samples": [round(s, 2) for s in samples]}
        extras = (("profile", lambda: profile(g.replay)), ("host_replay_us", lambda: host_replay_us(g)),
                  # replays queued back to back (the bench's timing syncs before each: its span includes the launch)
                  ("b2b_us", lambda: round(statistics.median(
                      BM.event_times_us(g.replay, iters=20, warmup=2, sync_each=False)), 2)))
        for name, fn in extras:
            try:
                v = fn()
                entry.update(v) if name == "profile" else entry.__setitem__(name, v)
            except Exception as e:                                  # noqa: BLE001 - recorded
                entry[name + "_error"] = f"{type(e).__name__}: {e}"[:300]
        doc["runs"].append(entry)
        save()
        return us

    B.replay_time_us = timed                 # bench_step's only call: the fused step graph of each width
    rc = B.main(argv)
    save()
    sys.exit(rc)


if __name__ == "__main__":
    main()
PY

# one line per (run, rows): tag, round, rows, fused step us (+ the layers-only breakdown; phase 3: role costs)
summarize() {  # json [prof.json]
  python3 - "$@" <<'PY'
import json, sys, os
path = sys.argv[1]
tag, rnd = os.path.basename(os.path.dirname(path)), os.path.basename(path).split(".")[0]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"BISECT {tag:11s} {rnd:3s} no result ({type(e).__name__})"); sys.exit()
prof = {}
if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
    prof = {r["rows"]: r for r in json.load(open(sys.argv[2]))["runs"]}
res = [e for e in d.get("results", []) if e.get("model") == "SmolLM2-135M" and e.get("section") == "step"]
for rows in d.get("rows", []):
    us = {e["variant"]: e["us"] for e in res if e["rows"] == rows}
    line = (f"BISECT {tag:11s} {rnd:3s} rows {rows}  step {us.get('fused', float('nan')):7.1f} us  layers_only "
            f"{us.get('fused_layers_only', float('nan')):7.1f}  ref_graph {us.get('reference_graph', float('nan')):7.1f}")
    p = prof.get(rows)
    if p and "roles" in p:
        s = sorted(p["samples"])
        line += (f"  | samples {s[0]:.1f}-{s[-1]:.1f}  b2b {p.get('b2b_us')}  span {p['span_us']}  sum {p['sum_per_step_us']}  " +
                 " ".join(f"{k[:8]} {v['us']:.2f}" for k, v in p["roles"].items() if not k.startswith("other")) +
                 (f"  host {sorted(p['host_replay_us'])[len(p['host_replay_us']) // 2]:.0f}" if p.get("host_replay_us") else ""))
    elif p:
        line += f"  | profile_error {p.get('profile_error')}"
    print(line)
for x in d.get("errors", []):
    print(f"BISECT {tag:11s} {rnd:3s} error {x.get('where')}: {str(x.get('error', x))[:200]}")
PY
}

last_plain=25; last_prof=30            # estimated seconds of the next run (first cold runs: Triton compiles)
run_one() {  # kind(plain|prof) tag dir round
  local kind=$1 tag=$2 dir=$3 rnd=$4 est tmo t0 rc d
  [ "$kind" = plain ] && est=$last_plain || est=$last_prof
  if (( SECONDS + est > LIMIT )); then echo "skip $tag r$rnd ($kind): ${SECONDS} s + ~${est} s > ${LIMIT}"; return 1; fi
  tmo=$(( HARD - SECONDS )); (( tmo > 120 )) && tmo=120
  d="$OUT/bisect/$tag"; mkdir -p "$d"
  t0=$SECONDS
  if [ "$kind" = plain ]; then
    (cd "$dir" && PYTHONPATH="$dir" timeout "$tmo" python3 -m lowlat.bench "${BENCH_ARGS[@]}" --out "$d/r$rnd.json") \
      > "$d/r$rnd.log" 2>&1
  else
    (cd "$dir" && PYTHONPATH="$dir" timeout "$tmo" python3 /tmp/bisect_prof.py "$d/prof.json" "${BENCH_ARGS[@]}" \
      --out "$d/r$rnd.json") > "$d/r$rnd.log" 2>&1
  fi
  rc=$?
  local wall=$(( SECONDS - t0 ))
  [ "$kind" = plain ] && last_plain=$(( wall + 3 )) || last_prof=$(( wall + 3 ))
  echo "run $tag r$rnd ($kind): rc $rc, ${wall} s, at ${SECONDS} s"
  if [ "$kind" = plain ]; then summarize "$d/r$rnd.json"; else summarize "$d/r$rnd.json" "$d/prof.json"; fi
  [ $rc -eq 0 ] || tail -5 "$d/r$rnd.log"
  return 0
}

# a copy of a pre-fix worktree with 28e421d's prefetch_l2 (masked lanes predicated off) in /tmp
patched_dir() {  # sha -> prints the directory, or nothing when the patch does not apply
  local src=$BIS/$1 dst=/tmp/bisect_pf/$1
  rm -rf "$dst"; mkdir -p "$dst"; cp -r "$src/lowlat" "$dst/"
  python3 - "$dst/lowlat/kernels/_gemv.py" <<'PY' && echo "$dst"
import sys
p = sys.argv[1]
s = open(p).read()
old = ('    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,\n'
       '                              is_pure=False, pack=1)\n')
new = ('    tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; } // $0",\n'
       '                              "=r,l,r", [ptrs, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)\n')
if s.count(old) != 1:
    print(f"prefetch patch: {s.count(old)} matches in {p}", file=sys.stderr); sys.exit(1)
open(p, "w").write(s.replace(old, new))
PY
}

echo "commits: ${COMMITS[*]}; rounds $ROUNDS; phase 3 $PHASE3; limit $LIMIT s (hard $HARD s)"
for (( r = 1; r <= ROUNDS; r++ )); do
  if (( r % 2 )); then order=("${COMMITS[@]}"); else order=(); for (( i = ${#COMMITS[@]} - 1; i >= 0; i-- )); do order+=("${COMMITS[$i]}"); done; fi
  for c in "${order[@]}"; do run_one plain "$c" "$BIS/$c" "$r"; done
done
if [ "$PHASE3" = 1 ]; then
  for tag in "${PHASE3_TAGS[@]}"; do
    sha=${tag%+pf}
    [ -f "$BIS/$sha/lowlat/bench.py" ] || continue
    if [ "$tag" != "$sha" ]; then dir=$(patched_dir "$sha"); [ -n "$dir" ] || { echo "skip $tag: patch"; continue; }
    else dir=$BIS/$sha; fi
    run_one prof "$tag" "$dir" p || break
  done
fi

# all runs: per tag and rows, the fused step of every round
python3 - "$OUT/bisect" <<'PY'
import glob, json, os, sys
root = sys.argv[1]
table = {}
for path in sorted(glob.glob(os.path.join(root, "*", "r*.json"))):
    tag, rnd = os.path.basename(os.path.dirname(path)), os.path.basename(path)[1:-5]
    try:
        d = json.load(open(path))
    except Exception:
        continue
    for e in d.get("results", []):
        if (e.get("model") == "SmolLM2-135M" and e.get("section") == "step" and e.get("variant") == "fused"
                and e.get("op") == "decode_step"):
            table.setdefault(tag, {}).setdefault(str(e["rows"]), {})[rnd] = e["us"]
json.dump(table, open(os.path.join(root, "summary.json"), "w"), indent=1)
order = ["f297717", "ca66487", "b610aa3", "2f7fd3e", "a1f137f", "28e421d", "8eeb60e", "work"]
key = lambda t: (order.index(t.split("+")[0]) if t.split("+")[0] in order else 99, t)
print("tag          rows 1 (r1 r2 p)            rows 6 (r1 r2 p)")
for tag in sorted(table, key=key):
    cells = [" ".join(f"{table[tag].get(rows, {}).get(r, float('nan')):7.1f}" for r in ("1", "2", "p")) for rows in ("1", "6")]
    print(f"{tag:12s} {cells[0]}    {cells[1]}")
PY
echo "done at ${SECONDS} s"
