#!/usr/bin/env python3
"""The grid's tables for docs/BENCHMARKS.md, from the CSVs of one run.

    python3 bench/grid_table.py KLBENCH_CSV [PYTHON_CSV] [--commit REV] [-o FILE]

KLBENCH_CSV: `klbench --grid --csv FILE`'s (klgen's figures, the roofline,
the noise reference, FlashInfer); PYTHON_CSV: `python -m klgen.bench --grid
--csv FILE`'s (torch's ways and FlashInfer through Python, on the same GPU
in the same session). Writes Markdown: the run (GPU, date, commit, commands,
bandwidth, floor), one table per kernel (rows: tokens; columns: width x
dtype; a cell: klgen's us, its % of the roofline, the best alternative and
its us, and a mark where a target applies: met, or not), then each target
with the cells that miss it. The targets (met when):

  roofline   from 64 tokens, gather, fused, argmax, topk8, topk64 and greedy
             take at most 1.5 x the roofline
  noise      from 64 tokens, plain, filtered and minp take at most 1.5 x the
             larger of the roofline and the noise reference, and at most
             2.5 x the roofline
  one token  at 1 token: 163840 columns, greedy <= 3.5 us, plain <= 5,
             filtered <= 8; 20480 columns, greedy <= 2.5, plain <= 3.0,
             filtered <= 6.0 (every dtype)
  fused      the fused epilogue at most 1.2 x the plain gather, every cell
  best       no cell slower than the best alternative measured in it

A cell without a figure, or whose checks failed, meets no target. Exit
status 0, or 2 for a file that is not such a CSV.
"""

import argparse
import csv
import math
import os
import subprocess
import sys

KERNELS = ("gather", "fused", "argmax", "topk8", "topk64", "greedy", "plain", "filtered", "minp")
ROOFLINE_KERNELS = ("gather", "fused", "argmax", "topk8", "topk64", "greedy")
NOISE_KERNELS = ("plain", "filtered", "minp")
FROM_TOKENS = 64
ONE_TOKEN = {(163840, "greedy"): 3.5, (163840, "plain"): 5.0, (163840, "filtered"): 8.0,
             (20480, "greedy"): 2.5, (20480, "plain"): 3.0, (20480, "filtered"): 6.0}
TARGETS = {
    "roofline": "from 64 tokens, gather, fused, argmax, topk8, topk64 and greedy within 1.5x "
                "of the roofline",
    "noise": "from 64 tokens, plain, filtered and minp within 1.5x of max(roofline, noise "
             "reference) and within 2.5x of the roofline",
    "one token": "at 1 token: 163840 columns greedy <= 3.5 us, plain <= 5, filtered <= 8; "
                 "20480 columns greedy <= 2.5, plain <= 3.0, filtered <= 6.0",
    "fused": "the fused epilogue within 1.2x of the plain gather",
    "best": "no cell slower than the best alternative",
}


class Bad(Exception):
    pass


def number(text):
    return float(text) if text not in (None, "") else math.nan


def known(x):
    return not math.isnan(x)


def read(path, need):
    """('# key: value' lines as a dict, rows) of a grid CSV with columns need."""
    meta, lines = {}, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith("# ") and ":" in line and not lines:
                key, _, value = line[2:].partition(":")
                meta[key.strip()] = value.strip()
            elif not line.startswith("#"):
                lines.append(line)
    rows = list(csv.DictReader(lines))
    if not rows or any(c not in rows[0] for c in need):
        raise Bad(f"{path}: not a grid CSV (columns {', '.join(need)} wanted)")
    return meta, rows


def cells(c_rows, py_rows):
    """{(width, dtype, tokens, kernel): cell} from both runs."""
    out = {}
    for r in c_rows:
        key = (int(r["width"]), r["dtype"], int(r["tokens"]), r["kernel"])
        alts = []
        if known(number(r["flashinfer_us"])):
            alts.append((number(r["flashinfer_us"]), f"FlashInfer {r['flashinfer_call']}"))
        out[key] = dict(us=number(r["klgen_us"]), roofline=number(r["roofline_us"]),
                        noise=number(r["noise_us"]), check=r["check"], alts=alts,
                        path=r["klgen_path"])
    for r in py_rows:
        key = (int(r["width"]), r["dtype"], int(r["tokens"]), r["kernel"])
        cell = out.setdefault(key, dict(us=math.nan, roofline=math.nan, noise=math.nan,
                                        check="", alts=[], path=""))
        for us, call in ((r["torch_us"], r["torch_call"]),
                         (r["flashinfer_us"], f"FlashInfer {r['flashinfer_call']} (Python)")):
            if known(number(us)):
                cell["alts"].append((number(us), call if call.startswith("FlashInfer")
                                     else f"torch {call}"))
        if r["check"]:
            cell["check"] = "; ".join(x for x in (cell["check"], "Python: " + r["check"]) if x)
    return out


def verdicts(grid):
    """{key: {target: (met, why)}} for the targets that apply to each cell."""
    out = {}
    for key, c in grid.items():
        width, dtype, tokens, kernel = key
        v = {}
        fine = known(c["us"]) and not c["check"]
        us, roof = c["us"], c["roofline"]
        why_not = "checks failed" if c["check"] else "not measured"
        if tokens >= FROM_TOKENS and kernel in ROOFLINE_KERNELS:
            v["roofline"] = (fine and known(roof) and us <= 1.5 * roof,
                             f"{us:.2f} us > 1.5 x {roof:.2f}" if fine else why_not)
        if tokens >= FROM_TOKENS and kernel in NOISE_KERNELS:
            bar = max(roof, c["noise"]) if known(c["noise"]) else math.nan
            v["noise"] = (fine and known(bar) and us <= 1.5 * bar and us <= 2.5 * roof,
                          f"{us:.2f} us vs 1.5 x {bar:.2f} and 2.5 x {roof:.2f}" if fine
                          else why_not)
        if tokens == 1 and (width, kernel) in ONE_TOKEN:
            most = ONE_TOKEN[(width, kernel)]
            v["one token"] = (fine and us <= most, f"{us:.2f} us > {most}" if fine else why_not)
        if kernel == "fused":
            gather = grid.get((width, dtype, tokens, "gather"), {}).get("us", math.nan)
            v["fused"] = (fine and known(gather) and us <= 1.2 * gather,
                          f"{us:.2f} us > 1.2 x {gather:.2f}" if fine else why_not)
        if c["alts"]:
            best, name = min(c["alts"])
            v["best"] = (fine and us <= best, f"{us:.2f} us > {name} {best:.2f}" if fine
                         else why_not)
        out[key] = v
    return out


def fmt(us):
    return f"{us:.2f}" if known(us) else "-"


def cell_text(c, v):
    if not known(c["us"]):
        text = "-"
    else:
        pct = f" ({100 * c['roofline'] / c['us']:.0f}%)" if known(c["roofline"]) else ""
        text = fmt(c["us"]) + pct
    if c["alts"]:
        best, name = min(c["alts"])
        text += f" · {name} {fmt(best)}"
    if c["check"]:
        text += " · CHECK FAILED"
    if v:
        text += " ✓" if all(met for met, _ in v.values()) else " ✗"
    return text


def commit_of(path):
    here = os.path.dirname(os.path.abspath(path))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(c_meta, py_meta, grid, commit):
    v = verdicts(grid)
    settings = sorted({(k[0], k[1]) for k in grid})
    lines = [f"{c_meta.get('gpu', 'GPU unknown')}, {c_meta.get('date', 'date unknown')}, "
             f"commit `{commit}`, `build/klbench {c_meta.get('command', '')}`"
             + (f" and `{py_meta.get('command', '')}` (torch {py_meta.get('torch', '?')})"
                if py_meta else "")
             + f"; FlashInfer: {c_meta.get('flashinfer', 'absent')}.",
             "",
             f"Copy bandwidth {c_meta.get('copy_gbps', '?')} GB/s, launch floor "
             f"{c_meta.get('floor_us', '?')} µs; roofline = bytes / bandwidth + floor. A cell: "
             "klgen's µs per step (% of the roofline) · the best alternative and its µs; "
             "✓ where every target that applies is met, ✗ where one is not."]
    for kernel in KERNELS:
        keys = [k for k in grid if k[3] == kernel]
        if not keys:
            continue
        tokens = sorted({k[2] for k in keys})
        lines += ["", f"### {kernel}", "",
                  "| tokens | " + " | ".join(f"{w} {d}" for w, d in settings) + " |",
                  "|---:|" + "---|" * len(settings)]
        for t in tokens:
            row = [cell_text(grid[(w, d, t, kernel)], v[(w, d, t, kernel)])
                   if (w, d, t, kernel) in grid else "" for w, d in settings]
            lines.append(f"| {t} | " + " | ".join(row) + " |")
    lines += ["", "### Targets", ""]
    for name, what in TARGETS.items():
        applies = [(k, vk[name]) for k, vk in sorted(v.items()) if name in vk]
        missed = [(k, why) for k, (met, why) in applies if not met]
        lines.append(f"- {what}: {len(applies) - len(missed)} of {len(applies)} cells met"
                     + ("." if not missed else "; not met:"))
        lines += [f"  - {k[3]}, {k[0]} {k[1]}, {k[2]} token{'s' * (k[2] != 1)}: {why}"
                  for k, why in missed]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="grid_table.py", description=__doc__.split("\n")[0])
    p.add_argument("klbench_csv")
    p.add_argument("python_csv", nargs="?")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse of this tree)")
    p.add_argument("-o", "--output", help="write here (default: stdout)")
    a = p.parse_args(argv)
    try:
        c_meta, c_rows = read(a.klbench_csv, ("width", "dtype", "tokens", "kernel", "roofline_us",
                                              "klgen_us", "klgen_path", "noise_us",
                                              "flashinfer_us", "flashinfer_call", "check"))
        py_meta, py_rows = read(a.python_csv, ("width", "dtype", "tokens", "kernel", "torch_us",
                                               "torch_call", "flashinfer_us", "flashinfer_call",
                                               "check")) if a.python_csv else ({}, [])
        grid = cells(c_rows, py_rows)
    except (OSError, Bad, ValueError) as e:
        print(f"grid_table.py: {e}", file=sys.stderr)
        return 2
    text = markdown(c_meta, py_meta, grid, a.commit or commit_of(__file__))
    if a.output:
        with open(a.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
