"""The spec guide's examples are klgen's own output: each one is made again
by the klgen under test and compared with the guide's text.

    doc_examples.py KLGEN GUIDE            check (exit 1 on a difference)
    doc_examples.py KLGEN GUIDE --update   write klgen's output into GUIDE

An example is a line of GUIDE that begins with `$ build/klgen ARGS` (its
output follows, up to the end of the code block) or with `klgen: specs/F:`
(an error message, made from one of the inputs below). Spec files come from
GUIDE's ```lua blocks whose first line is `-- specs/NAME.lua`.
"""

import os
import re
import shlex
import subprocess
import sys
import tempfile

# Error examples: the guide's file name -> how its input is made (from the
# guide's spec files, or as given here).
ERROR_INPUTS = {
    # a typo of a field: the guide's example with vocab_size misspelt
    "specs/my_model_tp8.lua": lambda files: files["specs/my_model_tp8.lua"].replace(
        "vocab_size =", "vocab_sise =", 1),
    # GPT-2's vocabulary at a tp that does not divide its padding
    "specs/gpt2.lua": lambda files: (
        'return {\n  name = "gpt2",\n  vocab_size = 50257,\n  dtype = "fp16",\n'
        '  tp = 5,\n  max_tokens = 64,\n}\n'),
}


def spec_files(lines):
    """The guide's spec files: {"specs/NAME.lua": source}."""
    files, i = {}, 0
    while i < len(lines):
        if lines[i].strip() == "```lua" and i + 1 < len(lines):
            m = re.match(r"-- (specs/\w+\.lua)$", lines[i + 1].strip())
            end = lines.index("```\n", i + 1) if "```\n" in lines[i + 1:] else len(lines)
            if m:
                files[m.group(1)] = "".join(lines[i + 1:end])
            i = end
        i += 1
    return files


def run(klgen, args, files, cwd):
    for name, src in files.items():
        os.makedirs(os.path.join(cwd, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(cwd, name), "w") as f:
            f.write(src)
    done = subprocess.run([klgen] + args, cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    return done.stdout + done.stderr


def regenerate(klgen, lines):
    """The guide with every example's output made again by klgen."""
    files = spec_files(lines)
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        indent = line[:len(line) - len(line.lstrip())]
        cmd = re.match(r"\$ build/klgen (.*)$", line.strip())
        err = re.match(r"klgen: (specs/\w+\.lua):", line.strip())
        with tempfile.TemporaryDirectory() as cwd:
            if cmd:
                text = run(klgen, shlex.split(cmd.group(1)), files, cwd)
                while i < len(lines) and lines[i].strip() != "```":
                    i += 1
                out.extend(indent + t + "\n" for t in text.splitlines())
            elif err:
                name = err.group(1)
                if name not in ERROR_INPUTS:
                    sys.exit(f"doc_examples: no input for the example of {name}")
                text = run(klgen, [name, "-o", "out"], {name: ERROR_INPUTS[name](files)}, cwd)
                out[-1] = indent + text.rstrip("\n") + "\n"
    return out


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] != "--update"):
        sys.exit("usage: doc_examples.py KLGEN GUIDE [--update]")
    klgen, guide = os.path.abspath(argv[1]), argv[2]
    with open(guide) as f:
        lines = f.readlines()
    made = regenerate(klgen, lines)
    if len(argv) == 4:
        with open(guide, "w") as f:
            f.writelines(made)
        return 0
    wrong = [(k + 1, a, b) for k, (a, b) in enumerate(zip(lines, made)) if a != b]
    if len(made) != len(lines):
        wrong.append((min(len(lines), len(made)), "(length)", "(length)"))
    for k, a, b in wrong:
        print(f"FAIL: {guide}:{k}: the guide says\n  {a.rstrip()}\nklgen says\n  {b.rstrip()}",
              file=sys.stderr)
    examples = sum(1 for a in lines if re.match(r"\s*(\$ build/klgen |klgen: specs/)", a))
    print(f"doc_examples: {examples - len(wrong)} passed, {len(wrong)} failed")
    return 1 if wrong or not examples else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
