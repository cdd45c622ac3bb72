"""bench/grid_table.py on hand-made CSVs: each target met and missed where the
figures say, a failed check meets nothing, and a file that is no grid CSV is
refused.   python3 test_grid_table.py PATH/TO/grid_table.py"""

import importlib.util
import os
import subprocess
import sys
import tempfile

C_HEAD = ("width,dtype,tokens,kernel,bytes,copy_gbps,floor_us,roofline_us,klgen_us,pct_roofline,"
          "klgen_path,noise_us,flashinfer_us,flashinfer_call,steps,check\n")
# width, dtype, tokens, kernel, roofline, klgen, noise, FlashInfer, check
C_ROWS = [
    (20480, "bf16", 64, "gather", 8.0, 10.0, "", "", ""),       # 1.25x: met
    (20480, "bf16", 64, "fused", 7.0, 11.9, "", "", ""),        # <= 1.2 x 10: met; 1.7x roof
    (20480, "fp32", 64, "gather", 8.0, 13.0, "", "", ""),       # 1.625x: missed
    (20480, "fp32", 64, "fused", 9.0, 16.0, "", "", ""),        # > 1.2 x 13: missed
    (20480, "bf16", 64, "plain", 10.0, 24.0, 20.0, "", ""),     # <= 30 and <= 25: met
    (20480, "fp32", 64, "plain", 10.0, 29.0, 20.0, "", ""),     # <= 30 but > 25: missed
    (20480, "bf16", 128, "filtered", 10.0, 14.0, 9.0, "", ""),  # <= 15 and <= 25: met
    (20480, "bf16", 64, "argmax", 4.0, 5.0, "", 6.0, ""),       # FI slower; torch 4.0 faster
    (20480, "bf16", 64, "topk8", 7.0, 8.0, "", 9.0, ""),        # faster than FI: met
    (20480, "bf16", 64, "topk64", 7.0, 8.0, "", 9.0, "values differ"),  # checks failed
    (163840, "bf16", 1, "greedy", 2.0, 3.4, "", "", ""),        # <= 3.5: met
    (20480, "bf16", 1, "plain", 2.0, 3.1, 2.5, "", ""),         # > 3.0: missed
    (20480, "bf16", 8, "gather", 2.0, 9.0, "", "", ""),         # no target applies
]
PY_HEAD = ("width,dtype,tokens,kernel,copy_gbps,klgen_us,klgen_path,torch_us,torch_call,"
           "flashinfer_us,flashinfer_call,steps,check\n")
PY_ROWS = [
    (20480, "bf16", 64, "argmax", "4.0", "torch.argmax", ""),
    (20480, "bf16", 64, "topk8", "20.0", "torch.topk(8)", ""),
]

fails = 0


def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print(f"FAIL: {what}")


def write(dir, name, head, lines):
    path = os.path.join(dir, name)
    with open(path, "w") as f:
        f.write("# gpu: Test GPU (sm_90)\n# date: 2026-12-06 00:00 UTC\n"
                "# command: --grid --csv c.csv\n# copy_gbps: 3000.0\n# floor_us: 2.000\n")
        f.write(head + "".join(lines))
    return path


def main():
    script = sys.argv[1]
    spec = importlib.util.spec_from_file_location("grid_table", script)
    gt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gt)
    with tempfile.TemporaryDirectory() as d:
        c = write(d, "c.csv", C_HEAD, [
            f"{w},{dt},{t},{k},0,3000.0,2.000,{r},{u},,oneshot,{n},{fi},"
            f"{'top_k(k=8)' if fi else ''},5,\"{chk}\"\n"
            for w, dt, t, k, r, u, n, fi, chk in C_ROWS])
        py = write(d, "py.csv", PY_HEAD, [
            f"{w},{dt},{t},{k},3000.0,1.0,oneshot,{tu},{tc},{fu},,5,\n"
            for w, dt, t, k, tu, tc, fu in PY_ROWS])
        _, c_rows = gt.read(c, ("width", "klgen_us"))
        _, py_rows = gt.read(py, ("width", "torch_us"))
        v = gt.verdicts(gt.cells(c_rows, py_rows))

        def met(w, dt, t, k, target):
            return v[(w, dt, t, k)][target][0]
        check(met(20480, "bf16", 64, "gather", "roofline"), "gather 1.25x roofline met")
        check(not met(20480, "fp32", 64, "gather", "roofline"), "gather 1.625x roofline missed")
        check(met(20480, "bf16", 64, "fused", "fused"), "fused 1.19x gather met")
        check(not met(20480, "bf16", 64, "fused", "roofline"), "fused 1.7x roofline missed")
        check(not met(20480, "fp32", 64, "fused", "fused"), "fused 1.23x gather missed")
        check(met(20480, "bf16", 64, "plain", "noise"), "plain 1.2x noise, 2.4x roof met")
        check(not met(20480, "fp32", 64, "plain", "noise"), "plain 2.9x roofline missed")
        check(met(20480, "bf16", 128, "filtered", "noise"), "filtered 1.4x roofline met")
        check(not met(20480, "bf16", 64, "argmax", "best"), "argmax slower than torch missed")
        check(met(20480, "bf16", 64, "topk8", "best"), "topk8 faster than FI and torch met")
        check(not met(20480, "bf16", 64, "topk64", "roofline"), "a failed check meets nothing")
        check(v[(20480, "bf16", 64, "topk64")]["roofline"][1] == "checks failed", "says why")
        check(met(163840, "bf16", 1, "greedy", "one token"), "greedy 3.4 us at 163840 met")
        check(not met(20480, "bf16", 1, "plain", "one token"), "plain 3.1 us at 20480 missed")
        check(v[(20480, "bf16", 8, "gather")] == {}, "no target at 8 tokens without alternatives")
        check("noise" not in v[(20480, "bf16", 64, "gather")], "the noise target is the samplers'")
        out = subprocess.run([sys.executable, script, c, py, "--commit", "abc1234"],
                             capture_output=True, text=True)
        check(out.returncode == 0, f"grid_table.py exit {out.returncode}: {out.stderr}")
        text = out.stdout
        for want in ("Test GPU (sm_90), 2026-12-06 00:00 UTC, commit `abc1234`",
                     "### gather", "| tokens | 20480 bf16 | 20480 fp32 | 163840 bf16 |",
                     "| 64 | 10.00 (80%) ✓ | 13.00 (62%) ✗ |  |",
                     "5.00 (80%) · torch torch.argmax 4.00 ✗",
                     "CHECK FAILED ✗",
                     "within 1.5x of the roofline: 3 of 7 cells met; not met:",
                     "  - plain, 20480 bf16, 1 token: 3.10 us > 3.0",
                     "  - gather, 20480 fp32, 64 tokens: 13.00 us > 1.5 x 8.00",
                     "within 1.2x of the plain gather: 1 of 2 cells met",
                     "no cell slower than the best alternative: 1 of 3 cells met"):
            check(want in text, f"output lacks {want!r}:\n{text}")
        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write("a,b\n1,2\n")
        out = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
        check(out.returncode == 2 and "not a grid CSV" in out.stderr,
              f"a CSV of other columns: exit {out.returncode}, {out.stderr!r}")
    print(f"test_grid_table: {'failed' if fails else 'passed'} ({fails} failed)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
