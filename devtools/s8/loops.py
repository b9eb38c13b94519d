"""Backward-branch loops of a SASS dump (innermost first): start, length in instructions, and mix.
usage: python devtools/s8/loops.py FILE.sass"""
import collections
import re
import sys

ins = []
for line in open(sys.argv[1]):
    m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
loops = []
for a, t in ins:
    if "BRA" in t:
        tgt = re.search(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", t)
        if tgt and int(tgt.group(1), 16) < a:
            loops.append((int(tgt.group(1), 16), a))
inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
tot = 0
for lo, hi in inner:
    body = [t for a, t in ins if lo <= a <= hi]
    c = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", b).split()[0].split(".")[0] for b in body)
    tot += len(body)
    print(f"{lo:#x} {len(body):5d}  " + ", ".join(f"{o} {n}" for o, n in c.most_common(8)))
print("innermost loops:", len(inner), "total instructions:", tot)
