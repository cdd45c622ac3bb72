"""The PyTorch part on GPUs: two ranks in two processes (tp2_worker.py), and the
spec given as a file. Skipped without torch or without two GPUs."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp2_worker.py")


@pytest.mark.gpu
def test_tp2_against_all_gather():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", WORKER], env=env, capture_output=True, text=True,
                          timeout=900)
    print(done.stdout)
    print(done.stderr[-4000:], file=sys.stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "ok: tp2 checks done, 0 failure(s)" in done.stdout
