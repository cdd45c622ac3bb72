"""Whether every failed test of a ctest log failed only because LeakSanitizer's
own tracer crashed at the process's exit.

    python3 .ci/tracer-crash.py CTEST_OUTPUT_LOG

LeakSanitizer stops the process's threads from a tracer thread before it
looks for leaks, and that tracer can die of a signal of its own ("Tracer
caught signal 11 ... LeakSanitizer has encountered a fatal error"), a fault of
the sanitizer's runtime that neither a leak nor the test made
(google/sanitizers#1353). A test whose output has that and no report of ASan,
UBSan or LeakSanitizer, and no failure of its own, is worth one more run; any
other failure is not. Exit 0: every failed test is such a crash (their names
are printed); 1: otherwise, or no failed test found.
"""

import re
import sys

RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*(\S.*?)\s+[\d.]+ sec\s*$")
SECTION_END = re.compile(r"^\s+Start\s+\d+: |^\s*\d+/\d+ Test\s+#|^\d+% tests passed")
CRASH = ("Tracer caught signal", "LeakSanitizer has encountered a fatal error")
REPORTS = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|"
                     r"\bFAIL\b|\b[1-9]\d* failed\b")


def failed_sections(lines):
    """(name, output lines) of each test the log reports as not passed."""
    sections, current = [], None
    for line in lines:
        if current is not None and SECTION_END.match(line):
            current = None
        match = RESULT.match(line)
        if match:
            if match.group(2) != "Passed":
                current = []
                sections.append((match.group(1), current))
            continue
        if current is not None:
            current.append(line)
    return sections


def only_tracer_crash(output):
    text = "\n".join(output)
    return all(s in text for s in CRASH) and not REPORTS.search(text)


def main(path):
    with open(path, errors="replace") as f:
        sections = failed_sections(f.read().splitlines())
    if not sections:
        return 1
    for name, output in sections:
        if not only_tracer_crash(output):
            return 1
    print(" ".join(name for name, _ in sections))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
