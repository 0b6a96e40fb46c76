"""Session 16: write a GEMV plan table (the JSON that $LOWLAT_GEMV_PLANS names) = lowlat's TUNED_PLANS with some
entries replaced or added, for A/B runs of plans that are not in the committed table (explore26, the per-kernel
benches: every `plan_gemv` without forced fields then reads it).

    python bench/explore/plan_table.py [--flat] OUT.json 'residual:2048:2048=bn=16,split=1,stages=8,pf_k=2048,preload=0' ...

Each entry KIND:N:K=FIELD=VALUE,... starts from the plan `plan_gemv` gives now for (KIND, N, K) (the table's or the
default) and replaces the named fields; `plan_gemv` with every field forced recounts chunks_per_split and checks
the plan; the entry has no `by_row_blocks` (one weight stream at every width) unless groups @B:FIELD=VALUE,... follow
(session 17): the fields of row-block count B (1-3; `_gemv.ROW_BLOCK_FIELDS`, and bn for the kinds of
`_gemv.BN_BY_ROW_BLOCKS_KINDS`), e.g. 'qkv:1536:2048=bn=32@3:preload=0,stages=2,pf_k=256' or
'residual:2048:2048=bn=64@2:bn=32'. The entry is checked as `plan_gemv` checks a table entry (every width's plan,
bn by width refused for the other kinds).
--flat: every entry of the table without its `by_row_blocks` (the table as it was before session 16's width-dependent
weight streams).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lowlat.kernels import _gemv  # noqa: E402

FIELDS = ("block_k", "split", "bn", "preload", "warps", "stages", "pf_k")


def entry(spec: str) -> dict:
    """'KIND:N:K=f=v,...' -> one table entry {"kind", "n", "k", "plan"}."""
    key, _, body = spec.partition("=")
    body, *groups = body.split("@")
    kind, n, k = key.split(":")
    n, k = int(n), int(k)
    base = _gemv.plan_gemv(n, k, kind=kind)
    fields = {f: getattr(base, f) for f in FIELDS}
    for item in filter(None, body.split(",")):
        f, _, v = item.partition("=")
        if f not in FIELDS:
            raise SystemExit(f"{f!r} is not one of {FIELDS}")
        fields[f] = bool(int(v)) if f == "preload" else int(v)
    plan = _gemv.plan_gemv(n, k, kind=kind, **fields)          # every field forced: recounted and checked
    out = {f: getattr(plan, f) for f in FIELDS + ("chunks_per_split",)}
    if groups:
        rb = {}
        for g in groups:
            nmb, _, items = g.partition(":")
            rb[int(nmb)] = {f: (bool(int(v)) if f == "preload" else int(v))
                            for f, _, v in (i.partition("=") for i in items.split(",") if i)}
        checked = _gemv.GemvPlan(n=n, k=k, **out, by_row_blocks=rb)   # refuses fields outside ROW_BLOCK_FIELDS + bn
        for nmb in rb:
            _gemv.plan_gemv(n, k, kind=kind, **{f: getattr(checked.at(nmb), f) for f in FIELDS})
        _gemv.plan_gemv(n, k, kind=kind, table={(kind, n, k): dict(out, by_row_blocks=checked.by_row_blocks)})
        out["by_row_blocks"] = {str(b): dict(f) for b, f in checked.by_row_blocks}
    return dict(kind=kind, n=n, k=k, plan=out)


def main() -> None:
    args = sys.argv[1:]
    flat = "--flat" in args
    args = [a for a in args if a != "--flat"]
    out, specs = args[0], args[1:]
    table = {key: dict(kind=key[0], n=key[1], k=key[2],
                       plan={f: v for f, v in fields.items() if not (flat and f == "by_row_blocks")})
             for key, fields in _gemv.TUNED_PLANS.items()}
    for s in specs:
        e = entry(s)
        table[(e["kind"], e["n"], e["k"])] = e
        print("plan", json.dumps(e))
    Path(out).write_text(json.dumps(list(table.values()), indent=1))


if __name__ == "__main__":
    main()
