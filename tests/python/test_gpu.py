"""The PyTorch part on GPUs: TP ranks in processes, one per GPU (tp2_worker.py),
with the spec given as fields. tp 1 needs one GPU (a group of one: both paths,
graphs, torch.compile, epilogues, select, the drop-ins' specs); tp 2 needs two.
Skipped without torch or without enough GPUs."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp2_worker.py")


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2])
def test_tp_against_all_gather(tp):
    if not torch.cuda.is_available() or torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPU(s)")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={tp}", WORKER], env=env, capture_output=True,
                          text=True, timeout=900)
    print(done.stdout)
    print(done.stderr[-4000:], file=sys.stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"ok: tp{tp} checks done, 0 failure(s)" in done.stdout
