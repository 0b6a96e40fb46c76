#!/usr/bin/env bash
# Session 20, call 3: upper bounds of a deferred split-K reduction (NOTES "Measured -> session 20"). explore30 (call 2)
# showed PDL's hand-off is ~0.4 us (a ready counter is no faster), so a launch's in-step cost is its own chain after
# the wait. Here the split-K arrival and finisher of one kernel kind at a time are cut out (the launches store their
# partial tiles and exit: their OUTPUTS ARE NOT WRITTEN, so the logits are garbage and only the timings mean
# anything): how much of each launch's in-step cost is that chain (explore26, the production step otherwise).
#   res: the residual GEMV (out_proj and down); qkv: the attention prologue; qkv_own: the prologue's arrival and
#   partial loads cut, its epilogue (rstd, RoPE, q / KV stores) run by split SPLIT-1 on its own partial; gu: gate/up.
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
e26() {  # label model
  (( SECONDS > 480 )) && { echo "skip e26 $*: ${SECONDS}s used"; return; }
  echo "== e26 $1 $2 (${SECONDS}s)"
  if timeout 60 python3 bench/explore/explore26.py --model $2 --order 1,6 > /tmp/e26.log 2>&1; then
    grep -v -i warn /tmp/e26.log | grep -E 'r(1|6) '
  else echo "e26 $1 failed"; tail -4 /tmp/e26.log; fi
}
ARR_RES='        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
        if finished:
            a0 = sum_partials'
CUT_RES='        finished = False
        if finished:
            a0 = sum_partials'
ARR_QKV='        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1'
ARR_GU='        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        finished = arrived == SPLIT - 1
        if finished:
            g0 = sum_partials'
CUT_GU='        finished = False
        if finished:
            g0 = sum_partials'
for m in Llama-3.2-1B SmolLM2-135M; do
  e26 base $m
  mutate lowlat/kernels/out_proj.py "$ARR_RES" "$CUT_RES"; e26 cut_res $m; unmutate
  mutate lowlat/kernels/attn_prologue.py "$ARR_QKV" '        finished = False'; e26 cut_qkv $m; unmutate
  mutate lowlat/kernels/attn_prologue.py "$ARR_QKV" '        finished = pid_k == SPLIT - 1'
  mutate_also() { python3 - "$@" <<'PY'
import sys
p, old, new = sys.argv[1:4]
s = open(p).read()
assert s.count(old) == 1, f"{old!r} occurs {s.count(old)} times in {p}"
open(p, "w").write(s.replace(old, new))
PY
  }
  mutate_also lowlat/kernels/attn_prologue.py '        if SPLIT > 1:                  # the last to arrive' \
    '        if SPLIT > 1000:                  # the last to arrive'
  e26 qkv_own $m; unmutate
  mutate lowlat/kernels/mlp.py "$ARR_GU" "$CUT_GU"; e26 cut_gu $m; unmutate
  e26 base $m
done
git status --short lowlat
echo "done at ${SECONDS}s"
