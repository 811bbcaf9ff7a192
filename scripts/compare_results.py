"""Compare two ``book/results`` folders: every number must be equal except wall-clock and provenance fields.

    .venv/bin/python scripts/compare_results.py OLD_RESULTS_DIR NEW_RESULTS_DIR

Prints, per results file, the values that differ (keys matching `TIMING` are skipped: seconds, throughputs,
head-cost ratios, commit, date, versions, model sha256, cache counters) and the total; exit status 1 if any differ.
Used to show that a code change (e.g. the package's move into layers, issue 21) leaves every computed number of
the book unchanged: run `make book` before and after, then compare.
"""
import json, math, re, sys
from pathlib import Path
TIMING = re.compile(r"(seconds|_s$|^s$|wallclock|per_s|throughput|minutes|created|commit|versions|computed|hits|misses|speedup_vs_probing|head_over_forward|_over_forward|probing_s|mdm_forward_s|head_s|models|timed|device|eval_cache)", re.I)
def walk(a, b, path, out):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if TIMING.search(str(k)):
                continue
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'new' if k in b else 'old'}"); continue
            walk(a[k], b[k], f"{path}/{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} vs {len(b)}"); return
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", out)
    else:
        if isinstance(a, float) and isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b))):
            return
        if a != b:
            out.append(f"{path}: {a!r} -> {b!r}")
old, new = Path(sys.argv[1]), Path(sys.argv[2])
total = 0
for p in sorted(old.glob("*.json")):
    q = new / p.name
    if not q.exists():
        print(p.name, "MISSING in new"); continue
    out = []
    walk(json.loads(p.read_text()), json.loads(q.read_text()), p.stem, out)
    total += len(out)
    print(f"{p.name}: {len(out)} differences")
    for line in out[:15]:
        print("   ", line)
print("total differences:", total)
sys.exit(1 if total else 0)
