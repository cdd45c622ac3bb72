"""The CI's own judgement: .ci/tracer-crash.py runs a sanitized test again only
when LeakSanitizer's tracer crashing is all that went wrong."""

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", ".ci", "tracer-crash.py")

CRASH = ["Tracer caught signal 11: addr=0xbc0 pc=0x7f779fce80f0 sp=0x7f7796634d10",
         "==26051==LeakSanitizer has encountered a fatal error."]


def _script():
    spec = importlib.util.spec_from_file_location("tracer_crash", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _log(*tests):
    """A ctest log (--output-on-failure, -j2) of (name, status, output) tests."""
    lines = ["Test project /b", ""]
    for i, (name, status, output) in enumerate(tests, 1):
        lines += [f"      Start {i:2d}: {name}",
                  f"{i:2d}/{len(tests)} Test {'#' + str(i):>3}: {name} {'.' * 20}{status}  1.00 sec"]
        lines += output if status != "   Passed" else []
    lines += ["", "67% tests passed, 1 tests failed out of 3"]
    return "\n".join(lines) + "\n"


def _verdict(tmp_path, *tests):
    path = tmp_path / "ctest.log"
    path.write_text(_log(*tests))
    return _script().main(str(path))


PASS = ("test_layout", "   Passed", [])
ABORT = "Subprocess aborted***Exception:"


def test_a_tracer_crash_alone_is_run_again(tmp_path, capsys):
    assert _verdict(tmp_path, PASS, ("test_nvrtc_topk", ABORT, ["22 passed, 0 failed"] + CRASH),
                    ("test_host", "***Failed", CRASH)) == 0
    assert capsys.readouterr().out.split() == ["test_nvrtc_topk", "test_host"]


@pytest.mark.parametrize("output", [
    ["21 passed, 1 failed"] + CRASH,
    ["x.c:81: FAIL: a case"] + CRASH,
    ["==1==ERROR: LeakSanitizer: detected memory leaks"] + CRASH,
    ["==1==ERROR: AddressSanitizer: heap-buffer-overflow"] + CRASH,
    ["x.c:3:5: runtime error: signed integer overflow"] + CRASH,
    CRASH[:1],
    CRASH[1:],
    ["22 passed, 0 failed"],
])
def test_anything_else_fails(tmp_path, output):
    assert _verdict(tmp_path, PASS, ("test_nvrtc_topk", ABORT, output)) == 1


def test_one_real_failure_beside_a_crash_fails_both(tmp_path):
    assert _verdict(tmp_path, ("a", ABORT, CRASH), ("b", "***Failed", ["FAIL: it"])) == 1


def test_a_log_without_failures_is_no_crash(tmp_path):
    assert _verdict(tmp_path, PASS) == 1
