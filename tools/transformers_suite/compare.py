"""Compare two junit XML reports of the same pytest run (CPU first, tpu second): pass counts, tests that
pass on the CPU but not on tpu, and tests only tpu runs (accelerator-only), with their failures."""
import collections
import sys
import xml.etree.ElementTree as ET


def load(p):
    out = {}
    for tc in ET.parse(p).getroot().iter("testcase"):
        name = tc.get("classname").split(".")[-1] + "::" + tc.get("name")
        st = "passed"
        for child in tc:
            if child.tag in ("failure", "error"): st = "failed"; msg = (child.get("message") or "")[:150]; break
            if child.tag == "skipped": st = "skipped"; msg = ""
        else:
            msg = ""
        out[name] = (st, msg)
    return out


cpu, tpu = load(sys.argv[1]), load(sys.argv[2])
c = collections.Counter(); t = collections.Counter()
for k, (s, _) in cpu.items(): c[s] += 1
for k, (s, _) in tpu.items(): t[s] += 1
print("cpu", dict(c), "tpu", dict(t))
both = [k for k in cpu if cpu[k][0] == "passed" and k in tpu]
print("tests passing on CPU: tpu passes", sum(tpu[k][0] == "passed" for k in both), "of", len(both))
for k in both:
    if tpu[k][0] != "passed": print("  tpu", tpu[k][0], k, tpu[k][1])
only_tpu = [k for k in tpu if k in cpu and cpu[k][0] == "skipped" and tpu[k][0] != "skipped"]
print("run on tpu only (skipped on CPU):", len(only_tpu), collections.Counter(tpu[k][0] for k in only_tpu))
for k in only_tpu:
    if tpu[k][0] != "passed": print("  ", tpu[k][0], k, tpu[k][1])
