"""bench/grid_table.py on hand-made CSVs: each target judged in the runs it
names and met or missed where that run's figures say, never a figure of one
run against another's; a failed check meets nothing; its tables and summary;
--into; files that are no grid CSV, or runs on two GPUs, refused. Then the
committed docs/GRID.md and the grid block of docs/BENCHMARKS.md are what the
script makes from the committed CSVs.

    python3 test_grid_table.py PATH/TO/bench/grid_table.py"""

import importlib.util
import os
import subprocess
import sys
import tempfile

C_HEAD = ("width,dtype,tokens,kernel,bytes,copy_gbps,floor_us,roofline_us,klgen_us,pct_roofline,"
          "klgen_path,noise_us,flashinfer_us,flashinfer_call,steps,check\n")
# width, dtype, tokens, kernel, roofline, klgen, noise, FlashInfer, check
C_ROWS = [
    (20480, "bf16", 64, "gather", 8.0, 10.0, "", "", ""),       # 1.25x roofline: met
    (20480, "bf16", 64, "fused", 7.0, 11.9, "", "", ""),        # <= 1.2 x 10: met; 1.7x roof
    (20480, "fp32", 64, "gather", 8.0, 13.0, "", "", ""),       # 1.625x: missed
    (20480, "fp32", 64, "fused", 9.0, 16.0, "", "", ""),        # > 1.2 x 13: missed in C
    (20480, "bf16", 64, "plain", 10.0, 24.0, 20.0, "", ""),     # <= 30 and <= 25: met
    (20480, "fp32", 64, "plain", 10.0, 29.0, 20.0, "", ""),     # <= 30 but > 25: missed
    (20480, "bf16", 128, "filtered", 10.0, 17.0, 12.0, "", ""),  # <= 1.5 x 12, <= 25: met
    (20480, "bf16", 128, "minp", 10.0, 16.0, 9.0, "", ""),      # > 1.5 x 10: missed
    (20480, "bf16", 64, "argmax", 4.0, 5.0, "", 6.0, ""),       # FI slower: met in C
    (20480, "bf16", 64, "topk8", 7.0, 8.0, "", 7.5, ""),        # FI faster: missed in C
    (20480, "bf16", 64, "topk64", 7.0, 8.0, "", 9.0, "values differ"),  # checks failed
    (163840, "bf16", 1, "greedy", 2.0, 3.4, "", "", ""),        # <= 3.5: met in C
    (163840, "bf16", 1, "plain", 2.0, 4.9, 2.5, "", ""),        # <= 5: met in C
    (20480, "bf16", 1, "plain", 2.0, 3.1, 2.5, "", ""),         # > 3.0: missed
    (20480, "bf16", 8, "gather", 2.0, 9.0, "", "", ""),         # no target applies in C
    (20480, "bf16", 1, "greedy", 2.0, 2.2, "", 3.0, ""),        # 4 misses of best in Python
    (20480, "bf16", 2, "greedy", 2.0, 2.2, "", 3.0, ""),
    (20480, "bf16", 4, "greedy", 2.0, 2.2, "", 3.0, ""),
    (20480, "bf16", 8, "greedy", 2.0, 2.2, "", 3.0, ""),
]
PY_HEAD = ("width,dtype,tokens,kernel,copy_gbps,klgen_us,klgen_path,torch_us,torch_call,"
           "flashinfer_us,flashinfer_call,steps,check\n")
# width, dtype, tokens, kernel, klgen, torch, torch's call, FlashInfer, check
PY_ROWS = [
    (20480, "bf16", 64, "gather", 20.0, 21.0, "copy_", "", ""),
    (20480, "bf16", 64, "fused", 23.0, 30.0, "soft-cap ops", "", ""),   # <= 1.2 x 20: met
    (20480, "fp32", 64, "gather", 10.0, 11.0, "copy_", "", ""),
    (20480, "fp32", 64, "fused", 11.0, 30.0, "soft-cap ops", "", ""),   # met in Python
    (20480, "bf16", 64, "argmax", 3.5, 4.0, "torch.argmax", 9.0, ""),   # met (4.0 < C's 5.0)
    (20480, "bf16", 64, "topk8", 6.0, 20.0, "torch.topk(8)", 9.0, ""),  # met in Python
    (20480, "bf16", 64, "plain", 99.0, 50.0, "vLLM sampler", "", ""),   # slower than torch
    (163840, "bf16", 1, "greedy", 3.6, 9.0, "NCCL pairs", 9.0, ""),     # > 3.5 in Python
    (163840, "bf16", 1, "plain", 4.0, 9.0, "vLLM sampler", 9.0, ""),    # <= 5 in both
    (20480, "bf16", 8, "gather", 2.0, 3.0, "copy_", "", "output != input"),
    (20480, "bf16", 1, "greedy", 4.0, 3.0, "torch.argmax", 9.0, ""),    # 1.33x torch
    (20480, "bf16", 2, "greedy", 5.0, 3.0, "torch.argmax", 9.0, ""),    # 1.67x
    (20480, "bf16", 4, "greedy", 3.3, 3.0, "torch.argmax", 9.0, ""),    # 1.1x: not shown
    (20480, "bf16", 8, "greedy", 6.0, 3.0, "torch.argmax", 9.0, ""),    # 2x: worst
]
META = ("# gpu: {gpu}\n# date: 2026-12-06 0{n}:00 UTC\n# command: {cmd}\n"
        "# copy_gbps: 3000.0\n# floor_us: 2.000\n")

fails = 0


def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print(f"FAIL: {what}")


def write(dir, name, meta, head, lines):
    path = os.path.join(dir, name)
    with open(path, "w") as f:
        f.write(meta + head + "".join(lines))
    return path


def csvs(d, py_gpu="Test GPU"):
    c = write(d, "c.csv", META.format(gpu="Test GPU (sm_90)", n=1, cmd="--grid --csv c.csv"),
              C_HEAD, [f"{w},{dt},{t},{k},0,3000.0,2.000,{r},{u},,oneshot,{n},{fi},"
                       f"{'top_k(k=8)' if fi else ''},5,\"{chk}\"\n"
                       for w, dt, t, k, r, u, n, fi, chk in C_ROWS])
    py = write(d, "py.csv", META.format(gpu=py_gpu, n=2, cmd="python -m klgen.bench --grid"),
               PY_HEAD, [f"{w},{dt},{t},{k},3000.0,{u},oneshot,{tu},\"{tc}\",{fu},"
                         f"{'top_k(k=8)' if fu else ''},5,{chk}\n"
                         for w, dt, t, k, u, tu, tc, fu, chk in PY_ROWS])
    return c, py


def judged(gt, c, py):
    _, c_rows = gt.read(c, gt.C_COLUMNS)
    _, py_rows = gt.read(py, gt.PY_COLUMNS)
    return gt.verdicts({gt.C: gt.c_grid(c_rows), gt.PY: gt.py_grid(py_rows)})


def test_verdicts(gt, v):
    def met(w, dt, t, k, target, run=None):
        got = v[(w, dt, t, k)][target]
        return gt.met(got) if run is None else got[run][0]
    check(met(20480, "bf16", 64, "gather", "roofline"), "gather 1.25x roofline met")
    check(not met(20480, "fp32", 64, "gather", "roofline"), "gather 1.625x roofline missed")
    check(set(v[(20480, "bf16", 64, "gather")]["roofline"]) == {"C"},
          "the roofline is judged in the C run alone")
    check(met(20480, "bf16", 64, "fused", "fused"), "fused within 1.2x of its own run's gather")
    check(not met(20480, "bf16", 64, "fused", "roofline"), "fused 1.7x roofline missed")
    check(not met(20480, "fp32", 64, "fused", "fused", "C"), "fused 1.23x C's gather missed")
    check(met(20480, "fp32", 64, "fused", "fused", "Python"), "fused 1.1x Python's gather met")
    check(not met(20480, "fp32", 64, "fused", "fused"), "missed in one run: missed")
    check(met(20480, "bf16", 64, "plain", "noise"), "plain 1.2x noise, 2.4x roof met")
    check(not met(20480, "fp32", 64, "plain", "noise"), "plain 2.9x roofline missed")
    check(met(20480, "bf16", 128, "filtered", "noise"), "filtered 1.7x roofline, 1.4x noise met")
    check(not met(20480, "bf16", 128, "minp", "noise"), "minp 1.6x max(roofline, noise) missed")
    check(met(20480, "bf16", 64, "argmax", "best"),
          "argmax met in each run (no figure of one run against the other's)")
    check(not met(20480, "bf16", 64, "topk8", "best", "C"), "topk8 slower than C's FI missed")
    check(met(20480, "bf16", 64, "topk8", "best", "Python"), "topk8 faster in Python met")
    check(not met(20480, "bf16", 64, "topk8", "best"), "topk8 missed in the C run: missed")
    check(not met(20480, "bf16", 64, "plain", "best", "Python"), "plain slower than torch")
    check("best" not in v[(20480, "bf16", 64, "gather")] or
          set(v[(20480, "bf16", 64, "gather")]["best"]) == {"Python"},
          "no best target in the C run without an alternative")
    check(not met(20480, "bf16", 64, "topk64", "roofline"), "a failed check meets nothing")
    check(v[(20480, "bf16", 64, "topk64")]["roofline"]["C"][2] == "checks failed", "says why")
    check(v[(20480, "bf16", 8, "gather")]["best"]["Python"][2] == "checks failed",
          "a failed check of the Python run")
    check(met(163840, "bf16", 1, "greedy", "one token", "C"), "greedy 3.4 us at 163840 met")
    check(not met(163840, "bf16", 1, "greedy", "one token"), "greedy 3.6 us in Python missed")
    check(met(163840, "bf16", 1, "plain", "one token"), "plain <= 5 us in both runs met")
    check(not met(20480, "bf16", 1, "plain", "one token"), "plain 3.1 us at 20480 missed")
    check(set(v[(20480, "bf16", 8, "gather")]) == {"best"},
          "at 8 tokens only the best target applies to the gather")
    check("noise" not in v[(20480, "bf16", 64, "gather")], "the noise target is the samplers'")


def run(script, *args, **kw):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, **kw)


def unwrapped(text):
    """text with its wrapped paragraphs and list items each on one line."""
    lines = []
    for line in text.split("\n"):
        if lines and lines[-1] and line and not line.startswith(("|", "#", "- ")) and \
                not lines[-1].startswith(("|", "#")):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return "\n".join(lines)


def test_output(script, c, py):
    out = run(script, c, py, "--commit", "abc1234")
    check(out.returncode == 0, f"grid_table.py exit {out.returncode}: {out.stderr}")
    check(all(len(line) <= 80 for line in out.stdout.split("\n") if line[:1] not in "|#"),
          "prose wrapped at 80 columns")
    text = unwrapped(out.stdout)
    for want in (
            "Test GPU (sm_90), one GPU at tp 1, commit `abc1234`",
            f"`python3 bench/grid_table.py {c} {py} --commit abc1234`",
            "- C run, 2026-12-06 01:00 UTC: `build/klbench --grid --csv c.csv`",
            "- Python run, 2026-12-06 02:00 UTC: `python -m klgen.bench --grid`",
            "over the copy bandwidth (3000.0 GB/s), plus the launch floor (2.000 µs)",
            "judged in the C run, which measures the roofline",
            "## gather", "| | 20,480 bf16 | 20,480 fp32 | 163,840 bf16 |",
            "| 64 tok | 10.00 (80%) ✓ | 13.00 (62%) ✗ |\n",
            "| 64 tok | 20.00 · torch 21.00 ✓ | 10.00 · torch 11.00 ✓ |\n",
            "8.00 (88%) · FI 7.50 ✗", "6.00 · torch 20.00 · FI 9.00 ✓",
            "24.00 (42%) · n 20.00 ✓", "99.00 · torch 50.00 ✗",
            "torch: the faster of `NCCL pairs` and `torch.argmax`",
            "CHECK FAILED ✗",
            "| roofline | gather | 1 of 2 | 1 / – | 20,480 fp32 ×64: 13.00 > 1.5 × 8.00 (C) |",
            "| fused | fused | 1 of 2 | 1 / 0 | 20,480 fp32 ×64: 16.00 > 1.2 × gather 13.00 "
            "(C) |",
            "| noise | minp | 0 of 1 | 1 / – | 20,480 bf16 ×128: 16.00 > 1.5 × 10.00 (C) |",
            "| noise | plain | 1 of 2 | 1 / – | 20,480 fp32 ×64: 29.00 > 2.5 × 10.00 (C) |",
            "| one token | greedy | 0 of 2 | 0 / 2 | 20,480 bf16 ×1: 4.00 > 2.5 (Python); "
            "163,840 bf16 ×1: 3.60 > 3.5 (Python) |",
            "| best | greedy | 1 of 5 | 0 / 4 | 20,480 bf16 ×8: 6.00 > torch 3.00 (Python); "
            "20,480 bf16 ×2: 5.00 > torch 3.00 (Python); "
            "20,480 bf16 ×1: 4.00 > torch 3.00 (Python) |"):
        check(want in text, f"output lacks {want!r}:\n{text}")
    summary = run(script, c, py, "--commit", "abc1234", "--summary").stdout
    for want in ("### C run, bf16: µs per step at 1, 64 and 256 tokens",
                 "| | 20,480 ×1 | 20,480 ×64 | 20,480 ×256 | 163,840 ×1 |",
                 "| plain | 3.10 (65%) · n 2.50 ✗ | 24.00 (42%) · n 20.00 ✓ |  | "
                 "4.90 (41%) · n 2.50 ✓ |  |  |",
                 "| plain |  | 99.00 · torch 50.00 ✗ |  | 4.00 · torch 9.00 · FI 9.00 ✓ |",
                 "### Targets"):
        check(want in summary, f"--summary lacks {want!r}:\n{summary}")
    check("## gather" not in summary, "--summary has no kernel's whole table")


def test_refusals(gt, script, d, c):
    bad = write(d, "bad.csv", "", "a,b\n", ["1,2\n"])
    out = run(script, bad)
    check(out.returncode == 2 and "not a grid CSV" in out.stderr,
          f"a CSV of other columns: exit {out.returncode}, {out.stderr!r}")
    _, other = csvs(os.path.join(d, "other"), py_gpu="Other GPU")
    out = run(script, c, other)
    check(out.returncode == 2 and "different GPUs" in out.stderr,
          f"runs on two GPUs: exit {out.returncode}, {out.stderr!r}")
    doc = os.path.join(d, "doc.md")
    with open(doc, "w") as f:
        f.write(f"# Doc\n\nbefore\n{gt.BEGIN}\nold\n{gt.END}\nafter\n")
    out = run(script, c, "--commit", "abc1234", "--summary", "--into", doc)
    made = run(script, c, "--commit", "abc1234", "--summary").stdout
    with open(doc) as f:
        got = f.read()
    check(out.returncode == 0 and
          got == f"# Doc\n\nbefore\n{gt.BEGIN}\n{made}{gt.END}\nafter\n",
          f"--into: exit {out.returncode} {out.stderr!r}, file:\n{got}")
    with open(doc, "w") as f:
        f.write("# Doc\n")
    out = run(script, c, "--into", doc)
    with open(doc) as f:
        kept = f.read() == "# Doc\n"
    check(out.returncode == 2 and "no lines" in out.stderr and kept,
          f"--into a file without the lines: exit {out.returncode}, {out.stderr!r}")


# The committed tables and the arguments that make them.
GRID_ARGS = ["bench/results/grid_h100.csv", "bench/results/grid_h100_python.csv",
             "--commit", "f3e6d1b"]


def test_committed(gt, script):
    root = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    out = run(script, *GRID_ARGS, cwd=root)
    with open(os.path.join(root, "docs", "GRID.md")) as f:
        check(out.returncode == 0 and f.read() == out.stdout,
              "docs/GRID.md is not what bench/grid_table.py makes of the committed CSVs "
              f"(run it with {' '.join(GRID_ARGS)} -o docs/GRID.md)")
    out = run(script, *GRID_ARGS, "--summary", cwd=root)
    with open(os.path.join(root, "docs", "BENCHMARKS.md")) as f:
        doc = f.read()
    start, end = doc.find(gt.BEGIN + "\n"), doc.find(gt.END)
    check(0 <= start < end and doc[start + len(gt.BEGIN) + 1:end] == out.stdout,
          "docs/BENCHMARKS.md's grid is not what bench/grid_table.py makes of the committed "
          f"CSVs (run it with {' '.join(GRID_ARGS)} --summary --into docs/BENCHMARKS.md)")


def main():
    script = sys.argv[1]
    spec = importlib.util.spec_from_file_location("grid_table", script)
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "other"))
        c, py = csvs(d)
        test_verdicts(gt, judged(gt, c, py))
        test_output(script, c, py)
        test_refusals(gt, script, d, c)
    test_committed(gt, script)
    print(f"test_grid_table: {'failed' if fails else 'passed'} ({fails} failed)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
