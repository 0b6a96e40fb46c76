#!/usr/bin/env bash
# Session 41 (one GPU, no carry, ends by END, default 230 s): the cluster prologue's GPU tests, broken on purpose (each
# must fail): M1 the head's sum of squares takes only its first program's partial (the cluster exchange dropped);
# M2 the cluster barrier dropped (a race: the partials may be read before they are stored).
cd "$(dirname "$0")/../.."
source bench/device/common.sh
exec > >(tee "$OUT/all.log") 2>&1
END=${END:-230}
K=lowlat/kernels/attn_prologue_held.py
run_cluster_tests() {
  echo "== $1 (${SECONDS}s)"
  timeout "$(cap 110)" python3 -m pytest -q -n 4 -p no:cacheprovider -m gpu -x tests/unit/test_attn_prologue.py \
    -k cluster > "$OUT/$1.log" 2>&1; echo "pytest rc $? (a mutation must fail: rc 1)"
  grep -E "passed|failed|^FAILED" "$OUT/$1.log" | cut -c1-240 | tail -5
}
mutate $K "for r in gl.static_range(1, PH):" "for r in gl.static_range(1, 1):"
run_cluster_tests m1_first_partial_only; unmutate
mutate $K "dep = _cluster_barrier(dep, PH)" "dep = dep"
run_cluster_tests m2_no_cluster_barrier; unmutate
git diff --stat -- $K
echo "done at ${SECONDS}s"
