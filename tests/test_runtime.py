"""tinymt.runtime.CoreShare: a CPU training's threads give way to the processes beside it."""

import os
import subprocess
import sys
import time

import pytest
import torch

from tinymt.runtime import CoreShare

SPIN = "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="CoreShare reads /proc/stat (Linux)")
def test_threads_give_way_to_busy_processes_and_come_back():
    """Real processes keeping every core busy take the threads down to one at the next
    look (not before it); with cores to spare they go back to the count they started
    from, never above it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(os.cpu_count())]
    try:
        share = CoreShare(every=0.5)
        share()  # too soon: no look yet
        assert torch.get_num_threads() == 2
        time.sleep(0.7)
        share()
        assert torch.get_num_threads() == 1
        for p in spinners:
            p.kill()
        share.cores += 64  # a machine with cores to spare, whatever runs beside this test
        time.sleep(0.6)
        share()
        assert torch.get_num_threads() == 2
    finally:
        for p in spinners:
            p.kill()
            p.wait()
        torch.set_num_threads(threads)
