"""What every script does with a failure: one line on stderr -- a user error exit status 2
(ours, :func:`one_line_errors`, and Hydra's composition errors, :func:`run_hydra`), any
other exception exit status 1 (``TINYMT_TRACEBACK=1`` shows its traceback instead).

Every script imports this module first: from then on, what escapes those two (a Ctrl-C
while the script still imports, a failing write of Hydra's ``--help``) is one line too
(:func:`_last_words`), and a Ctrl-C while a library imports waits for that import
(:func:`_ctrl_c`), so Hydra and the rest are imported below the hook and the handler."""

# ruff: noqa: E402  (the hook is set before the third-party imports)
from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from tinymt.errors import Stopped, TinyMTError, first_line

TRACEBACK = "TINYMT_TRACEBACK"  # set to 1: an internal fault shows its traceback
# before torch is imported: its OpenMP threads spin-wait, holding cores another process needs
# (two runs side by side: 0.27 steps/s each; 10,000 spins, then sleep: ~2; docs/speed.md)
os.environ.setdefault("GOMP_SPINCOUNT", "10000")


def _interrupted(e: BaseException | None) -> bool:
    """A Ctrl-C on ``e``'s way: a library's cleanup may fail on it, a Ctrl-C all the same."""
    return e is not None and (isinstance(e, KeyboardInterrupt) or _interrupted(e.__context__))


def _say(e: BaseException) -> int:
    """One line on stderr for an exception nothing else handled; the exit status it means.
    An ``OSError`` is the machine's (a full disk, a closed pipe: ``| head``), not a fault
    of ours; a broken stdout is quiet, and replaced so that Python's last flush is too."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if _interrupted(e):
        print("interrupted", file=sys.stderr)
        return 130
    if not isinstance(e, BrokenPipeError):
        what, name = first_line(e), type(e).__name__  # (what: the name when it says nothing)
        print(f"error: {what}" if isinstance(e, OSError) else f"error: internal error ({name}"
              f"{'' if what == name else ': ' + what}); {TRACEBACK}=1 shows where", file=sys.stderr)
    return 1


def _last_words(kind, e, tb) -> None:
    """``sys.excepthook``: an exception that ends the script anywhere is one line."""
    if os.environ.get(TRACEBACK) == "1":
        sys.__excepthook__(kind, e, tb)
    elif _say(e) == 130 and not isinstance(e, KeyboardInterrupt):  # (Python: -SIGINT for it)
        os._exit(130)  # a Ctrl-C whose cleanup failed on its way out: 130, not Python's 1


sys.excepthook = _last_words


def _ctrl_c(signum, frame) -> None:
    """SIGINT: ``KeyboardInterrupt``, as Python's own handler (SIGTERM: :class:`Stopped`, so
    that what a Ctrl-C cleans up, a new run's claimed folder, is cleaned up: exit 143),
    except while a library is being imported: one there can abort Python (a C++ exception
    through pybind11, or a module half made, torch's or sentencepiece's, that crashes
    Python's teardown), so it comes again 50 ms later, until no import but tinymt's own is
    under way. A forked child (a pool's worker, which its pool ends with SIGTERM) dies of
    SIGTERM as by default."""
    if signum == signal.SIGTERM and os.getpid() != _PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if any(getattr(getattr(m, "__spec__", None), "_initializing", False)
           for name, m in list(sys.modules.items()) if name.split(".")[0] != "tinymt"):
        again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        again.daemon = True  # (a process ending meanwhile does not wait for it)
        again.start()
        return
    raise KeyboardInterrupt if signum == signal.SIGINT else \
        Stopped(signum, f"stopped by {signal.Signals(signum).name}")


_PID = os.getpid()  # the script's own process
for _sig, _default in ((signal.SIGINT, signal.default_int_handler),
                       (signal.SIGTERM, signal.SIG_DFL)):
    if threading.current_thread() is threading.main_thread() and signal.getsignal(_sig) is _default:
        signal.signal(_sig, _ctrl_c)

from hydra import compose
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback

_FAILED_JOBS: list[str] = []  # jobs of this ``-m`` sweep that ended in a TinyMTError


def _sweep_job() -> str | None:
    """``job <n> (<overrides>)`` when running inside a Hydra ``-m`` sweep, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    job = HydraConfig.get().job
    return f"job {job.num} ({job.override_dirname})"


def one_line_errors(fn):
    """Run ``fn`` (its output flushed); a :class:`TinyMTError` becomes ``error: <message>`` and
    exit code 2 (in a ``-m`` sweep: one line naming the job, the sweep goes on, exit 2 at its
    end), a :class:`~tinymt.errors.Stopped` run its message and 128 + the signal's number,
    Ctrl-C ``interrupted`` and 130, any other exception one line (:func:`_say`) and 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a full disk or a closed pipe: here, not at Python's exit
            return result
        except TinyMTError as e:
            job = _sweep_job()
            if job is not None:
                print(f"error: {job}: {e}", file=sys.stderr)
                _FAILED_JOBS.append(job)
                return None
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except Stopped as e:  # the work is saved: say where, exit 128 + the signal
            if e.message:
                print(e.message, file=sys.stderr)
            sys.exit(128 + e.signum)
        except (Exception, KeyboardInterrupt) as e:  # Ctrl-C, or a fault that is not the user's
            if os.environ.get(TRACEBACK) == "1":
                raise
            sys.exit(_say(e))

    return wrapper


class SweepCheck(Callback):
    """A Hydra callback (``hydra.callbacks``): before a ``-m`` sweep makes its folder, each
    job's config is composed and ``check``ed; when none passes, the sweep ends there."""

    def __init__(self, check: Callable[[Any], Any]) -> None:
        self.check = check

    def on_multirun_start(self, config, config_name=None, **kwargs) -> None:
        params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
        parser = OverridesParser.create(GlobalHydra.instance().config_loader())
        errors = []
        try:  # the jobs, as Hydra's BasicSweeper draws them
            overrides = parser.parse_overrides([*params, *config.hydra.overrides.task])
            for num, job in enumerate(BasicSweeper.split_arguments(overrides, None)[0]):
                try:
                    self.check(compose(config_name, job))
                    return  # a job to run: the sweep goes on, each bad job failing in its turn
                except TinyMTError as e:
                    errors.append(f"error: job {num} ({','.join(job)}): {e}")
        except HydraException:
            return  # Hydra's own error: the sweep reports it
        print(*errors, f"error: all {len(errors)} job(s) of the sweep failed: none was run",
              sep="\n", file=sys.stderr)
        sys.exit(2)


def _one_line(e: BaseException) -> str:
    """Hydra's multi-line composition message (plus its omegaconf cause) as one line."""
    out: list[str] = []
    detail = ("full_key:", "reference_type", "object_type")  # omegaconf's extra lines
    for part in (e, e.__cause__):
        for raw in str(part or "").split("Config search path:")[0].splitlines():
            line = raw.strip().rstrip(".")
            if not line or line in out or line.startswith(detail):
                continue
            if raw.startswith("\t") and out:  # a listed option: onto its header line
                out[-1] += (" " if out[-1].endswith(":") else ", ") + line
            else:
                out.append(line)
    return "; ".join(out)


def run_hydra(main: Callable[[], Any], sweeps: bool = False) -> Any:
    """Call a ``@hydra.main`` function; a composition error (``model.n_head=4``,
    ``model.d_model=wide``, ``model=huge``) is ``error: <one line>`` and exit status 2, and
    so is ``-m`` where the script does not sweep. A user's own ``HYDRA_FULL_ERROR=1`` keeps
    Hydra's full report."""
    if not sweeps and {"-m", "--multirun"} & set(sys.argv[1:]):
        print(f"error: -m: {os.path.basename(sys.argv[0])} runs once (scripts/train.py -m "
              "sweeps); run it once for each setting", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return main()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises instead of printing and exiting
    _FAILED_JOBS.clear()
    try:
        result = main()
        if _FAILED_JOBS:
            print(f"error: {len(_FAILED_JOBS)} job(s) of the sweep failed: "
                  f"{', '.join(_FAILED_JOBS)}", file=sys.stderr)
            sys.exit(2)
        return result
    except (HydraException, ValueError) as e:  # ValueError: Hydra's flags in conflict
        if _interrupted(e) or not isinstance(e, HydraException) and not str(e).startswith(
                "Only one of --run, --multirun, --cfg"):  # ("-m ... --cfg job"; a Ctrl-C: _say)
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        sys.exit(2)
    finally:
        os.environ.pop("HYDRA_FULL_ERROR", None)
        one_line_errors(sys.stdout.flush)()  # --help, --cfg: their text out here, not at exit
