"""How stable is the order of near-tied finalists (issue 13's "same winner or one within 1%")?

The four s3/t256 configs that reach the finalist rounds of the 288 grid at 4096^3 are timed in interleaved
rounds as the tuner's finalists are (``time_callable`` 3/20, burst): 5 rounds six times and 25 rounds
twice, on a rested GPU and after 8 s of back-to-back GEMMs (the load a tune leaves). Prints each set's
fastest and medians; saves ``$OUT/finalist_noise.json``. About 100 s on an H200 (compiles included):

    . .gpu/setup.sh && python3 benchmarks/finalist_noise.py
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]
import torch  # noqa: E402

from autotuner.timing import time_callable  # noqa: E402
from templates import matmul as mm  # noqa: E402

problem = mm.MatmulProblem(4096, 4096, 4096)
cfgs = [dict(block_M=m, block_N=n, block_K=64, num_stages=3, thread_num=256, enable_rasterization=r)
        for m, n in ((128, 256), (256, 128)) for r in (True, False)]
names = [f"{c['block_M']}x{c['block_N']}{'r' if c['enable_rasterization'] else ''}" for c in cfgs]
t = time.time()
kernels = [mm.MATMUL.compile(problem, c) for c in cfgs]
print("compiled in", round(time.time() - t, 1), "s", flush=True)
a = torch.randn(problem.M, problem.K, device="cuda", dtype=torch.float16)
b = torch.randn(problem.N, problem.K, device="cuda", dtype=torch.float16)
for k in kernels:
    k(a, b)



def rounds(n):
    out = [[] for _ in kernels]
    for r in range(n):
        for j in [(r + i) % len(kernels) for i in range(len(kernels))]:
            out[j].append(time_callable(lambda k=kernels[j]: k(a, b), 3, 20, "cuda").median_ms)
    return [round(statistics.median(x), 5) for x in out]



def heat(s):
    end = time.time() + s
    while time.time() < end:
        for _ in range(20):
            torch.matmul(a, b.T)
        torch.cuda.synchronize()



res = {"names": names}
for label, pre in (("cold", 0), ("after 8 s load", 8)):
    for n, reps in ((5, 6), (25, 2)):
        rows = []
        for _ in range(reps):
            if pre:
                heat(pre)
            rows.append(rounds(n))
        res[f"{label}, {n} rounds"] = rows
        print(label, n, "rounds:", [names[min(range(4), key=lambda i: r[i])] for r in rows], rows, flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "finalist_noise.json"), "w"), indent=1)
