"""torchrun (env:// rendezvous through its store) runs a weft job unchanged."""

import os
import subprocess
import sys

from harness import free_port


def test_torchrun():
    script = os.path.join(os.path.dirname(__file__), "torchrun_script.py")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), script],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0 of 2: ok" in out.stdout and "rank 1 of 2: ok" in out.stdout, out.stdout
