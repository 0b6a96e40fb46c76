"""Print the MoE router's and route / plan kernel's in-step costs (and the layer totals) from a
`lowlat bench --sections moe,profile --out F.json` file (session 29-30 device scripts).

    python bench/explore/plan_profile.py F.json
"""

import json
import sys

doc = json.load(open(sys.argv[1]))
for e in doc["results"]:
    if e.get("section") == "profile" and e["op"] in ("moe_router", "moe_route_plan"):
        print(f"  r{e['rows']} {e['op'][:44]:44} {e['us']:7.2f} us x{e['launches']:3d}")
    elif e.get("section") != "profile":
        print(f"  r{e.get('rows')} {e.get('op')} {e.get('variant')} {e.get('us')}")
for x in doc.get("errors", []):
    print("error", x["where"], str(x.get("error", x))[:300])
