#!/usr/bin/env bash
# Prepared in session 12, run in session 13 (call1, at 2885ee0: 107 s). Since then lowlat's attention releases after
# its KV loop by default and sm_placement names the triggers after_kv / start / none (session 12: late / early /
# none); the lines below use the new names so that a re-run measures what call1 did. Each run is skipped once
# 440 / 520 s are used so the call ends inside 600 s; the gemv runs come last. Where
# every launch's programs run
# (bench/explore/sm_placement.py), and what undoes the CTA packing found in session 12 (out_proj's 36 programs on
# 6 SMs in the SmolLM2 6-row step):
#   SmolLM2 step, widths 1,6: as is; attention without its early PDL trigger / with it after the KV loop; out_proj
#   at 16 / 8 warps (at most 3 / 6 programs on one SM by registers, against 7 by shared memory at 4 warps);
#   SmolLM2 step, a server's widths 1..48 in order: as is and out_proj at 16 warps;
#   Llama-3.2-1B step, widths 1,6;
#   the per-kernel benches still under issue 3's 70% at 1 row (Llama out_proj / down / gate_up, Qwen3 out_proj):
#   are their programs spread one per SM, or packed? And Llama out_proj with two plans that can hold only 2 / 1
#   programs on one SM (against 5).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
i=0
step() {  # order model extra...
  (( SECONDS > 440 )) && { echo "skip step $*: ${SECONDS}s used"; return; }
  i=$((i + 1)); local f="$OUT/pl_${i}"
  timeout 100 python3 bench/explore/sm_placement.py step --order "$1" --model "$2" "${@:3}" --out "$f.json" > "$f.log" 2>&1 \
    || { echo "step $* failed"; tail -4 "$f.log"; return; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["model"], "order", d["order"], "attn_trigger", d["attn_trigger"], d["plan_o"].replace("GemvPlan", "")[:120],
      "logits", d["logits_check"][:2])
print("  resources capped / failed:", {k: v for k, v in d.get("resources", {}).items()
                                        if v.get("capped_to_maxnreg") or "error" in v} or "none")
for w, v in d["widths"].items():
    print(f"  r{w:<3} step {v['step_us']:7.1f} us |", "  ".join(
        f"{r}: {int(x['programs'])}p/{int(x['sms'])}sm/max{int(x['max_per_sm'])}" for r, x in v["roles"].items()))
PY
}
gemv() {  # kind n k
  (( SECONDS > 520 )) && { echo "skip gemv $*: ${SECONDS}s used"; return; }
  i=$((i + 1)); local f="$OUT/pl_${i}"
  timeout 60 python3 bench/explore/sm_placement.py gemv --kind "$1" --n "$2" --k "$3" "${@:4}" --out "$f.json" > "$f.log" 2>&1 \
    || { echo "gemv $* failed"; tail -4 "$f.log"; return; }
  python3 - "$f.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["kind"], d["n"], d["k"], "rows", d["rows"], f"{d['us_per_launch']:.2f} us/launch", d["wbytes"], "B", d["placement"],
      d["plan"].replace("GemvPlan", "")[:110], d.get("resources"))
PY
}
S=SmolLM2-135M
E="--attn-trigger start"                 # "as is" in session 12 = the release right after the wait
step 1,6 $S $E
step 1,6 $S --attn-trigger none
step 1,6 $S --attn-trigger after_kv
step 1,6 $S $E --plan-o '{"warps": 16}'
step 1,6 $S $E --plan-o '{"warps": 8}'
step 1,2,4,6,8,12,16,24,32,48 $S $E
step 1,2,4,6,8,12,16,24,32,48 $S $E --plan-o '{"warps": 16}'
step 1,6 Llama-3.2-1B $E
gemv residual 2048 2048
# Llama out_proj with plans that hold fewer programs on one SM (sm90_check-style CPU compile, session 12: the
# default preload bn64 split 8 holds 5; these 2 and 1, both with cp.async pipelining, no spills)
gemv residual 2048 2048 --plan '{"preload": false, "split": 4, "chunks_per_split": 4, "stages": 4, "pf_k": 512}'
gemv residual 2048 2048 --plan '{"preload": false, "bn": 128, "split": 4, "chunks_per_split": 4, "stages": 4, "pf_k": 512}'
gemv residual 2048 8192
gemv gate_up 8192 2048
gemv out_proj 2048 4096
