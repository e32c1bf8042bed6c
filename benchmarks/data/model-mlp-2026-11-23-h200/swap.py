"""table_new table_old out M: the new table with the old table's matmul configs at M."""
import json
import sys

new, old, out, M = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t, o = json.load(open(new)), json.load(open(old))
olds = {json.dumps(e["key"], sort_keys=True): e["config"] for e in o["kernels"]["tilecarve.matmul"]["entries"]}
for e in t["kernels"]["tilecarve.matmul"]["entries"]:
    if e["key"]["M"] == M:
        k = json.dumps(e["key"], sort_keys=True)
        print("swap", e["key"], e["config"], "->", olds[k])
        e["config"] = olds[k]
json.dump(t, open(out, "w"), indent=1)
