"""Where a kernel's time goes: its stages read on the device with %globaltimer.

    python3 bench/stages.py stamp STAMPS OUT [--templates DIR]
    build/klbench SPEC ... --templates OUT > run.log
    python3 bench/stages.py summarize run.log

`stamp` copies the templates (default: this checkout's) to OUT with a
%globaltimer read at each place STAMPS names, and a line printed by every
CTA at a few steps; klbench --templates OUT renders and times the copy
against the same NCCL figures, so nothing is rebuilt. `summarize` gives the
median over the printed steps of each CTA's stamps, in ns from CTA 0's
stamp 0. The reads cost a few tens of ns each: compare stages, not totals.

A STAMPS file has one stamp a line, `#` comments and blank lines aside:

    FILE ||| ANCHOR ||| before|after ||| TEXT

with the separator ` ||| ` exactly. ANCHOR is taken as written, leading
spaces too, and must occur exactly once in FILE (`\\n` in it is a newline);
TEXT (e.g. `STAGE(3);`) goes on a line of its own before or after it.
STAGE(i) (i < 24) records thread 0's time in slot i of its CTA;
STAGES_PRINT(step, ctas) prints the slots of CTAs below `ctas` at steps
300, 812, ... (step % 512 == 300). bench/stages/*.stamps are the ones
docs/BENCHMARKS.md names.
"""
import os
import re
import shutil
import statistics
import sys

SLOTS = 24

# Rendered into the prelude, inside the spec's namespace.
PRELUDE = r"""
// ---- stage stamps (bench/stages.py): not part of the product ----
__device__ unsigned long long kl_stage_ts[64][%(slots)d];
__device__ __forceinline__ unsigned long long stage_now() {
  unsigned long long t;
  asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t));
  return t;
}
// A slot not stamped this step holds a former step's time (long before CTA
// 0's stamp 0: a step takes longer than that gap) or none: -1 in print (the
// timer's resolution is coarser than a nanosecond, so no stage reads -1).
#define STAGE(i) do { if (threadIdx.x == 0 && blockIdx.x < 64) kl_stage_ts[blockIdx.x][i] = stage_now(); } while (0)
#define STAGES_PRINT(step, ctas) do { \
  if (threadIdx.x == 0 && (step) %% 512 == 300 && blockIdx.x < (ctas) && blockIdx.x < 64) { \
    const unsigned long long *p = kl_stage_ts[blockIdx.x], z = kl_stage_ts[0][0]; \
    long long q[%(slots)d]; \
    for (int i = 0; i < %(slots)d; ++i) { \
      const long long d = (long long)(p[i] - z); \
      q[i] = p[i] && d > -2000 ? d : -1; \
    } \
    printf("stages step %%u cta %%u:%(fmt)s\n", (unsigned)(step), blockIdx.x, %(args)s); \
  } } while (0)
""" % {"slots": SLOTS, "fmt": " %lld" * SLOTS, "args": ", ".join("q[%d]" % i for i in range(SLOTS))}

ANCHOR_OF_PRELUDE = "namespace kl_<%= NAME %> {"


class StampError(Exception):
    pass


def insert(path, anchor, where, text):
    with open(path) as f:
        source = f.read()
    n = source.count(anchor)
    if n != 1:
        raise StampError("%s: the anchor %r occurs %d times, not once" % (path, anchor, n))
    if where == "after":
        source = source.replace(anchor, anchor + "\n" + text)
    else:
        source = source.replace(anchor, text + "\n" + anchor)
    with open(path, "w") as f:
        f.write(source)


def read_stamps(path):
    stamps = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split(" ||| ")
            if len(fields) != 4 or fields[2].strip() not in ("before", "after"):
                raise StampError("%s:%d: expected FILE ||| ANCHOR ||| before|after ||| TEXT"
                                 % (path, number))
            name, anchor, where, text = fields
            stamps.append((name.strip(), anchor.replace("\\n", "\n"), where.strip(), text.strip()))
    return stamps


def stamp(stamps_path, out, templates):
    stamps = read_stamps(stamps_path)
    if os.path.exists(out):
        raise StampError("%s exists: give a new directory" % out)
    shutil.copytree(templates, out)
    try:
        insert(os.path.join(out, "prelude.cuh.tmpl"), ANCHOR_OF_PRELUDE, "after", PRELUDE)
        for name, anchor, where, text in stamps:
            path = os.path.join(out, name)
            if not os.path.isfile(path):
                raise StampError("%s: no template %s" % (stamps_path, name))
            insert(path, anchor, where, text)
    except BaseException:
        shutil.rmtree(out)  # nothing half-written
        raise
    return len(stamps)


LINE = re.compile(r"^stages step (\d+) cta (\d+):((?: -?\d+)+)$")


def summarize(log):
    by_cta = {}
    with open(log) as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if m:
                values = [int(v) for v in m.group(3).split()]
                by_cta.setdefault(int(m.group(2)), []).append(values)
    if not by_cta:
        raise StampError("%s: no 'stages' lines (was it run with --templates of a stamped copy?)" % log)
    rows = []
    for cta in sorted(by_cta):
        runs = by_cta[cta]
        cells = []
        for i in range(SLOTS):
            seen = [r[i] for r in runs if r[i] != -1]
            cells.append("%d:%d" % (i, statistics.median(seen)) if seen else None)
        rows.append("cta %d (%d steps): %s" % (cta, len(runs), " ".join(c for c in cells if c)))
    return rows


def main(argv):
    usage = ("usage: stages.py stamp STAMPS OUT [--templates DIR]\n"
             "       stages.py summarize LOG\n")
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        if len(argv) in (3, 5) and argv[0] == "stamp" and (len(argv) == 3 or argv[3] == "--templates"):
            templates = argv[4] if len(argv) == 5 else os.path.join(here, os.pardir, "templates")
            n = stamp(argv[1], argv[2], templates)
            print("stages: %d stamps in %s" % (n, argv[2]))
            return 0
        if len(argv) == 2 and argv[0] == "summarize":
            print("\n".join(summarize(argv[1])))
            return 0
    except (StampError, OSError) as e:
        sys.stderr.write("stages: %s\n" % e)
        return 1
    sys.stderr.write(usage)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
