"""How a run stops early.

A non-finite loss or gradient norm: the step changes no weight, and the run stops or
(``nan_policy=skip``) goes on (:func:`skip_or_stop`).

A stop that loses nothing: SIGTERM or Ctrl-C while training lets the step under way
finish, publishes ``last.pt`` at that step and exits (status 143 or 130); a second signal
stops at once (:class:`StopRequest`, :func:`stop_here`). ``trainer.resume`` then goes on
exactly where the run stopped.

The checkpoint is marked ``stopped``: it is ``last.pt`` only, never a step checkpoint,
so a resumed run averages and keeps the same checkpoints as one never stopped.
"""

from __future__ import annotations

import signal
import threading

from tinymt import runtime
from tinymt.checkpoint import save_checkpoint
from tinymt.errors import Stopped, TinyMTError
from tinymt.rundir import checkpoint_path
from tinymt.trainer.state import checkpoint_state

MAX_SKIPS = 10  # nan_policy=skip: give up after this many non-finite steps in a row


class StopRequest:
    """While in its ``with`` block, SIGINT and SIGTERM only set :attr:`signum` (the loop
    reads it between steps); a second one raises ``KeyboardInterrupt`` at once. Outside the
    main thread (where Python cannot take signals) it does nothing.

    >>> with StopRequest() as stop:
    ...     stop.signum
    0
    """

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        if self.signum:
            raise KeyboardInterrupt  # asked twice: no waiting for the step
        self.signum = signum


def stop_here(t, signum: int) -> None:
    """Every rank, after the same step: rank 0 publishes ``last.pt`` (unless this step's
    validation just did), then all raise :class:`~tinymt.errors.Stopped`. ``t``: the
    loop's ``Training``."""
    step, message = t.state["step"], ""
    if t.rt.is_main:
        if t.saved_step != step:
            save_checkpoint({**checkpoint_state(t), "stopped": True},
                            checkpoint_path(t.run_dir, "last"))
        t.writer.flush()
        message = (f"stopped by {signal.Signals(signum).name} after step {step}: saved in "
                   f"{checkpoint_path(t.run_dir, 'last')}; go on with: "
                   f"python scripts/train.py trainer.resume={t.run_dir}")
    runtime.barrier(t.rt)
    raise Stopped(signum, message)


def skip_or_stop(t, what: str, step: int) -> None:
    """Step ``step``'s ``what`` (its loss or gradient norm) was not finite, so the step
    changed no weight: stop with the step named, or (``nan_policy=skip``) count it, at
    most ``MAX_SKIPS`` in a row. ``t``: the loop's ``Training``."""
    if t.cfg.trainer.nan_policy != "skip":
        kept = ("the last checkpoint is intact" if checkpoint_path(t.run_dir, "last").is_file()
                else "no checkpoint was written yet")
        raise TinyMTError(f"{what} at step {step}; {kept}. "
                          "Lower optim.lr or set trainer.nan_policy=skip")
    if t.state["skipped_in_a_row"] >= MAX_SKIPS:
        raise TinyMTError(f"loss non-finite for {MAX_SKIPS} steps in a row at step {step}; "
                          "lower optim.lr")
    t.state["skipped_in_a_row"] += 1
    t.state["skipped_steps"] += 1
    t.log(f"\nwarning: {what} at step {step}: step skipped")
