#!/usr/bin/env python3
"""The grid's tables for docs/GRID.md and docs/BENCHMARKS.md, from the CSVs
of two runs on one GPU.

    python3 bench/grid_table.py KLBENCH_CSV [PYTHON_CSV] [--commit REV]
                                [--summary] [-o FILE | --into FILE]

KLBENCH_CSV: `klbench --grid --csv FILE`'s, the C run (klgen's kernels, the
copy bandwidth and launch floor, the noise reference, FlashInfer).
PYTHON_CSV: `python -m klgen.bench --grid --csv FILE`'s, the Python run
(klgen's calls, the torch path, FlashInfer through Python) on the same GPU.
A comparison never mixes the runs: klgen's figure of a run stands beside
that run's alternatives, roofline and noise reference only.

Writes Markdown: the runs (GPU, dates, commit, commands, roofline), the
targets (how each is judged, the cells that meet it per kernel, the worst
that do not), then for each kernel the C run's table and the Python run's
(rows: tokens; columns: width x dtype). --summary: the runs, the C and
Python tables of a few cells (SUMMARY), and the targets. --into FILE puts
the text between FILE's lines BEGIN and END (see below) in place of what
is there.

The targets, and the runs that judge them (a cell meets a target when it
meets it in every run that judges it; a cell without a figure, or whose
checks failed, meets none):

  best       no cell slower than the best alternative of the same run
             (C: FlashInfer; Python: the torch path and FlashInfer); each run
  roofline   from 64 tokens, gather, fused, argmax, topk8, topk64 and greedy
             within 1.5 x the roofline; the C run, which measures it
  noise      from 64 tokens, plain, filtered and minp within 1.5 x the
             larger of the roofline and the noise reference and within
             2.5 x the roofline; the C run, which measures both
  one token  at 1 token: 163840 columns greedy <= 3.5 us, plain <= 5,
             filtered <= 8; 20480 columns greedy <= 2.5, plain <= 3.0,
             filtered <= 6.0 (every dtype); each run
  fused      the fused epilogue within 1.2 x the same run's plain gather,
             every cell; each run

Exit status 0, or 2 for a file that is not such a CSV, runs that name
different GPUs, or an --into file without the BEGIN and END lines.
"""

import argparse
import csv
import math
import os
import shlex
import subprocess
import sys
import textwrap

KERNELS = ("gather", "fused", "argmax", "topk8", "topk64", "greedy", "plain", "filtered", "minp")
ROOFLINE_KERNELS = ("gather", "fused", "argmax", "topk8", "topk64", "greedy")
NOISE_KERNELS = ("plain", "filtered", "minp")
FROM_TOKENS = 64
ONE_TOKEN = {(163840, "greedy"): 3.5, (163840, "plain"): 5.0, (163840, "filtered"): 8.0,
             (20480, "greedy"): 2.5, (20480, "plain"): 3.0, (20480, "filtered"): 6.0}
C, PY = "C", "Python"
EACH_RUN = (C, PY)
# --summary's cells: (widths, dtype, tokens)
SUMMARY = ((20480, 163840), "bf16", (1, 64, 256))
WORST = 3  # misses listed per target and kernel
BEGIN = "<!-- BEGIN bench/grid_table.py --summary -->"
END = "<!-- END bench/grid_table.py --summary -->"
C_COLUMNS = ("width", "dtype", "tokens", "kernel", "roofline_us", "klgen_us", "klgen_path",
             "noise_us", "flashinfer_us", "flashinfer_call", "check")
PY_COLUMNS = ("width", "dtype", "tokens", "kernel", "klgen_us", "klgen_path", "torch_us",
              "torch_call", "flashinfer_us", "flashinfer_call", "check")


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


def grid(rows, alternatives):
    """{(width, dtype, tokens, kernel): cell} of one run; a cell's alts are
    [(label, us, call)] for the columns alternatives names {label: (us
    column, call column)}."""
    out = {}
    for r in rows:
        key = (int(r["width"]), r["dtype"], int(r["tokens"]), r["kernel"])
        alts = [(label, number(r[us]), r[call]) for label, (us, call) in alternatives.items()
                if known(number(r[us]))]
        out[key] = dict(us=number(r["klgen_us"]), roofline=number(r.get("roofline_us")),
                        noise=number(r.get("noise_us")), check=r["check"],
                        path=r["klgen_path"], alts=alts)
    return out


def c_grid(rows):
    return grid(rows, {"FI": ("flashinfer_us", "flashinfer_call")})


def py_grid(rows):
    return grid(rows, {"torch": ("torch_us", "torch_call"),
                       "FI": ("flashinfer_us", "flashinfer_call")})


# A target's bound for a cell of a run: (µs, how it is made) where the
# target applies, None where it does not; a NaN µs is a bound not measured.
def bound_best(key, c, run_cells):
    if not c["alts"]:
        return None
    label, us, _ = min(c["alts"], key=lambda a: a[1])
    return us, f"{label} {us:.2f}"


def bound_roofline(key, c, run_cells):
    if key[2] < FROM_TOKENS or key[3] not in ROOFLINE_KERNELS:
        return None
    return 1.5 * c["roofline"], f"1.5 × {c['roofline']:.2f}"


def bound_noise(key, c, run_cells):
    if key[2] < FROM_TOKENS or key[3] not in NOISE_KERNELS:
        return None
    roof, noise = c["roofline"], c["noise"]
    if not known(noise):
        return math.nan, "the noise reference"
    if 2.5 * roof < 1.5 * max(roof, noise):
        return 2.5 * roof, f"2.5 × {roof:.2f}"
    return 1.5 * max(roof, noise), (f"1.5 × n {noise:.2f}" if noise > roof else
                                    f"1.5 × {roof:.2f}")


def bound_one_token(key, c, run_cells):
    most = ONE_TOKEN.get((key[0], key[3])) if key[2] == 1 else None
    return None if most is None else (most, f"{most}")


def bound_fused(key, c, run_cells):
    if key[3] != "fused":
        return None
    gather = run_cells.get(key[:3] + ("gather",), {}).get("us", math.nan)
    return 1.2 * gather, f"1.2 × gather {gather:.2f}"


# name: (bound, the runs that judge it, what it asks, how it is judged)
TARGETS = {
    "best": (bound_best, EACH_RUN,
             "no cell slower than the best alternative measured in it",
             "in each run, against that run's alternatives (C: FlashInfer; Python: "
             "the torch path and FlashInfer through Python)"),
    "roofline": (bound_roofline, (C,),
                 "from 64 tokens, gather, fused, argmax, topk8, topk64 and greedy within "
                 "1.5× of the roofline",
                 "in the C run, which measures the roofline"),
    "noise": (bound_noise, (C,),
              "from 64 tokens, plain, filtered and minp within 1.5× of the larger of the "
              "roofline and the noise reference, and within 2.5× of the roofline",
              "in the C run, which measures both"),
    "one token": (bound_one_token, EACH_RUN,
                  "at 1 token, 163,840 columns: greedy ≤ 3.5 µs, plain ≤ 5, filtered ≤ 8; "
                  "20,480 columns: greedy ≤ 2.5, plain ≤ 3.0, filtered ≤ 6.0 (both dtypes)",
                  "in each run"),
    "fused": (bound_fused, EACH_RUN,
              "the fused epilogue within 1.2× of the plain gather, every cell",
              "in each run, against that run's gather"),
}


def judge(c, bound):
    """(met, how far over the bound, why) of a cell against a bound."""
    us, text = bound
    if c["check"]:
        return False, math.inf, "checks failed"
    if not known(us) or not known(c["us"]):
        return False, math.inf, "not measured"
    return c["us"] <= us, c["us"] / us, f"{c['us']:.2f} > {text}"


def verdicts(runs):
    """{key: {target: {run: (met, how far over, why)}}} for the targets that
    apply to each cell, each judged in the runs TARGETS names; runs is
    {run name: grid}."""
    out = {}
    for target, (bound_of, judged_in, _, _) in TARGETS.items():
        for name in judged_in:
            for key, c in runs.get(name, {}).items():
                b = bound_of(key, c, runs[name])
                if b is not None:
                    out.setdefault(key, {}).setdefault(target, {})[name] = judge(c, b)
    for name in runs:
        for key in runs[name]:
            out.setdefault(key, {})
    return out


def met(v):
    """A cell meets a target when it does in every run that judges it."""
    return all(m for m, _, _ in v.values())


def fmt(us):
    return f"{us:.2f}" if known(us) else "-"


def mark(v, run):
    """✓ or ✗ for the targets run judges in a cell, '' where none applies."""
    mine = [t[run] for t in v.values() if run in t]
    return "" if not mine else " ✓" if all(m for m, _, _ in mine) else " ✗"


def cell_text(c, v, run):
    if c is None:
        return ""
    text = fmt(c["us"]) + ("†" if c["path"] == "nccl" else "")
    if known(c["roofline"]) and known(c["us"]):
        text += f" ({100 * c['roofline'] / c['us']:.0f}%)"
    if known(c["noise"]):
        text += f" · n {fmt(c['noise'])}"
    for label, us, _ in c["alts"]:
        text += f" · {label} {fmt(us)}"
    if c["check"]:
        text += " · CHECK FAILED"
    return text + mark(v, run)


def where(key):
    width, dtype, tokens, _ = key
    return f"{width:,} {dtype} ×{tokens}"


def setting(w, d):
    return f"{w:,} {d}"


def calls(grid, kernel):
    """{label: the calls a kernel's alternative label made in a run}."""
    seen = {}
    for key, c in grid.items():
        if key[3] == kernel:
            for label, _, call in c["alts"]:
                seen.setdefault(label, set()).add(f"`{call}`")
    return {label: sorted(s) for label, s in seen.items()}


def caption(grid, kernel, run):
    names = {"FI": "FlashInfer ", "torch": ""}
    alts = "".join(f" · {label}: {names[label]}" +
                   (made[0] if len(made) == 1 else
                    f"the faster of {', '.join(made[:-1])} and {made[-1]}")
                   for label, made in calls(grid, kernel).items())
    what = "klgen µs (% of the roofline)" if run == C else "klgen µs"
    if kernel in NOISE_KERNELS and run == C:
        what += " · n: the noise reference"
    return f"{run} run: {what}{alts}."


def table(lines, run, grid, v, rows, columns, cell_of):
    """A Markdown table: rows x columns, cell_of(row, column) -> key."""
    lines += ["| | " + " | ".join(h for h, _ in columns) + " |",
              "|---|" + "---|" * len(columns)]
    for head, r in rows:
        keys = [cell_of(r, col) for _, col in columns]
        lines.append(f"| {head} | " + " | ".join(
            cell_text(grid.get(k), v.get(k, {}), run) for k in keys) + " |")


def kernel_tables(lines, runs, v, kernel, h):
    keys = {k for g in runs.values() for k in g if k[3] == kernel}
    if not keys:
        return
    settings = sorted({(k[0], k[1]) for k in keys})
    tokens = sorted({k[2] for k in keys})
    lines += ["", f"{h} {kernel}"]
    for run, g in runs.items():
        if not any(k[3] == kernel for k in g):
            continue
        lines += ["", caption(g, kernel, run), ""]
        table(lines, run, g, v, [(f"{t} tok", t) for t in tokens],
              [(setting(w, d), (w, d)) for w, d in settings],
              lambda t, wd: wd + (t, kernel))


def summary_tables(lines, runs, v, h):
    widths, dtype, tokens = SUMMARY
    columns = [(f"{w:,} ×{t}", (w, t)) for w in widths for t in tokens]
    for run, g in runs.items():
        kernels = [k for k in KERNELS if any(key[3] == k for key in g)]
        lines += ["", f"{h} {run} run, {dtype}: µs per step at 1, 64 and 256 tokens", "",
                  cell_legend(run), ""]
        table(lines, run, g, v, [(k, k) for k in kernels], columns,
              lambda k, wt: (wt[0], dtype, wt[1], k))


def cell_legend(run):
    if run == C:
        return ("A cell: klgen's µs (its % of the roofline) · n the noise reference's µs "
                "(plain, filtered, minp) · FI FlashInfer's µs.")
    return ("A cell: klgen's µs · torch the torch path's µs · FI FlashInfer's µs, through "
            "Python.")


def header(c_meta, py_meta, commit, command):
    gpu = c_meta.get("gpu", "GPU unknown")
    lines = [f"{gpu}, one GPU at tp 1, commit `{commit}`; µs per step, CUDA graphs. "
             f"Made by `{command}`.", "",
             f"- C run, {c_meta.get('date', 'date unknown')}: "
             f"`build/klbench {c_meta.get('command', '')}`; FlashInfer: "
             f"{c_meta.get('flashinfer', 'absent')}."]
    if py_meta:
        lines.append(f"- Python run, {py_meta.get('date', 'date unknown')}: "
                     f"`{py_meta.get('command', '')}`; torch {py_meta.get('torch', '?')}, "
                     f"FlashInfer: {py_meta.get('flashinfer', 'absent')}.")
    lines += ["", "The roofline of a cell is the bytes its kernel must read and write once "
              "(T·W·e read for T tokens of W columns of e bytes; written: T·W·e by the gather, "
              "T·W·4 by the fused epilogue, each row's results and parameters by the others) "
              f"over the copy bandwidth ({c_meta.get('copy_gbps', '?')} GB/s), plus the launch "
              f"floor ({c_meta.get('floor_us', '?')} µs), both measured by the C run; "
              "% is the roofline over klgen's time. Each run's klgen figures stand beside "
              "that run's alternatives only. † the call took the NCCL path. ✓ every target "
              "judged in that run met in the cell, ✗ one missed; no mark where none applies."]
    return lines


def targets(lines, v, h):
    lines += ["", f"{h} Targets", "",
              "How each is judged: a cell meets a target when it meets it in every run "
              "that judges it; a cell without a figure, or whose checks failed, meets none.", ""]
    for name, (_, _, what, how) in TARGETS.items():
        lines.append(f"- **{name}**: {what}; judged {how}.")
    lines += ["", "| target | kernel | cells met | missed in C / Python | worst misses "
              "(µs > bound, run) |", "|---|---|---|---|---|"]
    for name in TARGETS:
        for kernel in KERNELS:
            cells = sorted((k, vk[name]) for k, vk in v.items() if k[3] == kernel and name in vk)
            if cells:
                lines.append(target_row(name, kernel, cells))


def target_row(name, kernel, cells):
    missed = [(k, t) for k, t in cells if not met(t)]
    per_run = [str(sum(1 for _, t in missed if not t.get(r, (True,))[0])) if
               any(r in t for _, t in cells) else "–" for r in EACH_RUN]
    worst = []
    for k, t in missed:
        run, (_, over, why) = max(((r, x) for r, x in t.items() if not x[0]),
                                  key=lambda rx: rx[1][1])
        worst.append((-over, k, f"{where(k)}: {why} ({run})"))
    shown = "; ".join(w for _, _, w in sorted(worst)[:WORST])
    return (f"| {name} | {kernel} | {len(cells) - len(missed)} of {len(cells)} | "
            f"{' / '.join(per_run)} | {shown} |")


def commit_of(path):
    here = os.path.dirname(os.path.abspath(path))
    try:
        return subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def wrapped(lines):
    """Prose and list items at most 80 columns, as the documents are; table
    rows and headings as they are."""
    out = []
    for line in lines:
        if line.startswith(("|", "#")) or len(line) <= 80:
            out.append(line)
        else:
            out += textwrap.wrap(line, 80, subsequent_indent="  " if line.startswith("- ")
                                 else "", break_long_words=False, break_on_hyphens=False)
    return out


def markdown(c_meta, py_meta, runs, commit, command, summary):
    v = verdicts(runs)
    h = "###" if summary else "##"
    lines = [] if summary else [
        "# The grid: every kernel at every size", "",
        "How it is measured: "
        "[BENCHMARKS.md](BENCHMARKS.md#every-kernel-at-every-size-the-grid).", ""]
    lines += header(c_meta, py_meta, commit, command)
    if summary:
        summary_tables(lines, runs, v, h)
    targets(lines, v, h)
    if not summary:
        for kernel in KERNELS:
            kernel_tables(lines, runs, v, kernel, h)
    return "\n".join(wrapped(lines)) + "\n"


def same_gpu(c_meta, py_meta):
    """The runs' GPUs, without the C run's '(sm_NN)', must be one name."""
    a, b = (m.get("gpu", "").split(" (")[0] for m in (c_meta, py_meta))
    if a != b:
        raise Bad(f"the runs name different GPUs: {a!r} and {b!r}")


def splice(path, text):
    with open(path) as f:
        old = f.read()
    start, end = old.find(BEGIN + "\n"), old.find(END)
    if start < 0 or end < start:
        raise Bad(f"{path}: no lines {BEGIN} and {END}")
    start += len(BEGIN) + 1
    with open(path, "w") as f:
        f.write(old[:start] + text + old[end:])


def main(argv=None):
    p = argparse.ArgumentParser(prog="grid_table.py", description=__doc__.split("\n")[0])
    p.add_argument("klbench_csv")
    p.add_argument("python_csv", nargs="?")
    p.add_argument("--commit", help="the commit measured (default: git rev-parse of this tree)")
    p.add_argument("--summary", action="store_true", help="the few cells of SUMMARY only")
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", help="write here (default: stdout)")
    out.add_argument("--into", help="replace the text between BEGIN and END in this file")
    a = p.parse_args(argv)
    a.commit = a.commit or commit_of(__file__)
    made = ["python3", "bench/grid_table.py", a.klbench_csv] + \
        ([a.python_csv] if a.python_csv else []) + ["--commit", a.commit] + \
        (["--summary"] if a.summary else [])
    try:
        c_meta, c_rows = read(a.klbench_csv, C_COLUMNS)
        py_meta, py_rows = read(a.python_csv, PY_COLUMNS) if a.python_csv else ({}, [])
        runs = {C: c_grid(c_rows)}
        if a.python_csv:
            same_gpu(c_meta, py_meta)
            runs[PY] = py_grid(py_rows)
        text = markdown(c_meta, py_meta, runs, a.commit, shlex.join(made), a.summary)
        if a.into:
            splice(a.into, text)
        elif a.output:
            with open(a.output, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
    except (OSError, Bad, ValueError) as e:
        print(f"grid_table.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
