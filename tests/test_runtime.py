"""tinymt.runtime: a CPU training's threads give way to the processes beside it
(``CoreShare``); a decoding batch's size by device (``pick_batch_tokens``)."""

import os
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tinymt.config import MAX_BATCH_TOKENS, MAX_BEAM, MAX_BEAM_TOKENS
from tinymt.runtime import CoreShare, pick_batch_tokens

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


@given(st.integers(0, MAX_BATCH_TOKENS), st.integers(1, MAX_BEAM), st.sampled_from(["cpu", "cuda"]))
def test_a_decoding_batch_is_the_one_asked_for_or_the_devices_within_the_bound(asked, beam, kind):
    """``decode.batch_tokens=N`` is N (the config bounds N x beam); 0 is 4,096 source tokens
    on a CPU and 16,384 on a GPU, cut so that beam x tokens stays within MAX_BEAM_TOKENS."""
    tokens = pick_batch_tokens(asked, torch.device(kind), beam)
    if asked:
        assert tokens == asked
    else:
        assert tokens == min({"cpu": 4096, "cuda": 16384}[kind], MAX_BEAM_TOKENS // beam) >= 1
        assert tokens * beam <= MAX_BEAM_TOKENS
