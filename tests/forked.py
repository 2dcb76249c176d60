"""``python scripts/X.py ...`` in a process of its own, started by forking a process that
has already imported torch and the rest (a fork server, as ``multiprocessing``'s
``forkserver``): the suite starts dozens of scripts and servers, and each plain start
spends 2-3 s of CPU importing the same libraries.

:class:`ForkedPopen` is :class:`subprocess.Popen` with another way to start the child:
the test's pipes, the exit status (a signal's too), ``pid`` for ``send_signal`` are
those of a real process running the script as ``__main__``. What a fork cannot give is
what an interpreter reads as it starts (``PYTHON*`` variables, the locale, OpenMP's and
the allocator's settings, a fresh hash seed): a run whose environment changes one of those
starts plainly (:func:`forkable`), and so do the tests whose point is a fresh interpreter
(the same draws in *another* process, a Ctrl-C while it imports, the tour's kernel). The
child ends as Python ends: its exit functions, the last flush of stdout (a failed one: exit
status 120). ``torchrun`` is forked, and so are its ranks (:func:`_rank_popen`: a plain
rank spends ~7 of its ~9 s of CPU importing); test_sampling.py checks that a fresh
interpreter draws a rank's pieces, and each rank's losses are compared with a run in the
test's own process, whose hash seed and random state are not the server's.

The server is one per pytest process, started on first use, or one for all of
pytest-xdist's workers, started by their controller (:func:`share`); it ends when the
process that started it closes its end of the control socket.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading

# what a plain start reads from the environment before the script's first line...
_STARTUP = ("PYTHON", "LC_", "LANG", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC", "LD_",
            "CUDA_", "TORCH", "PYTORCH", "MPL", "XDG_")
# ...but these: the child applies the first two itself (_child); the last is read when a
# compile writes its cache
_REDONE = ("PYTHONUNBUFFERED", "OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR")
# ...nor these, which torch.distributed reads as a rank joins (torchrun sets them for each)
_AT_JOIN = ("TORCHELASTIC_", "TORCH_NCCL_")
_SET_BY_CLI = {"GOMP_SPINCOUNT": "10000"}  # tinymt.cli's default, set before torch is imported
# what the scripts import, preloaded: not tinymt.cli (its first lines set the environment
# and sys.excepthook, which a script's own import of it must do)
_NOT_PRELOADED = ("tinymt.cli", "tinymt.bench.main")


def forkable(args: list, env: dict | None) -> bool:
    """``args`` (``python script ...`` or ``python -c code ...``) in ``env`` runs forked as
    a plain start would run it."""
    if len(args) < 2 or args[0] != sys.executable or (args[1].startswith("-") and
                                                      args[1] != "-c"):
        return False
    env = os.environ if env is None else env  # (a test may have changed ours since)
    started = _the_server().env  # what the server's interpreter started with
    env, started = {**_SET_BY_CLI, **env}, {**_SET_BY_CLI, **started}
    return all(env.get(k) == started.get(k) for k in set(env) | set(started)
               if k.startswith(_STARTUP) and k not in _REDONE and not k.startswith(_AT_JOIN))


class _Server:
    """A client's side: the control socket (and the server process, where this process
    started it)."""

    def __init__(self) -> None:
        self.lock, self.proc = threading.Lock(), None
        address = _ADDRESS or (_address(int(os.environ[SHARED])) if SHARED in os.environ else "")
        if address:  # a child of the server, or an xdist worker: its own connection to it
            self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.ctl.settimeout(120)  # (a server stuck in its imports: an error, not a hang)
            self.ctl.connect(address)
            self.env = json.loads(self.ctl.recv(1 << 20))  # what the server started with
            self.ctl.settimeout(None)
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = os.environ.copy()
        self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, env=self.env)
        theirs.close()
        self.ctl = mine

    def start(self, argv: list[str], cwd: str | None, env: dict | None,
              fds: tuple[int, int, int], session: bool = False) -> socket.socket:
        """The child's status socket; it first sends the child's pid."""
        status, theirs = socket.socketpair()
        request = json.dumps({"argv": argv, "cwd": cwd or os.getcwd(), "session": session,
                              "env": dict(os.environ if env is None else env)}).encode()
        with self.lock:
            socket.send_fds(self.ctl, [request], [theirs.fileno(), *fds])
        theirs.close()
        return status


_ADDRESS = ""  # the server's own address, set in its children (a benchmark's servers)
SHARED = "TINYMT_TESTS_FORK_SERVER"  # the pid of the server xdist's workers share (share)
_server: _Server | None = None


def _the_server() -> _Server:
    global _server
    if _server is None or (_server.proc and _server.proc.poll() is not None):
        _server = _Server()
    return _server


def share() -> None:
    """Start the server here (pytest-xdist's controller, which runs no test) for the worker
    processes started after it: one server's imports (~8 s of CPU), not one a worker."""
    os.environ[SHARED] = str(_the_server().proc.pid)


def _address(pid: int) -> str:
    return f"\0tinymt-tests-fork-{pid}"  # (abstract: no file to clean up)


class ForkedPopen(subprocess.Popen):
    """``subprocess.Popen([sys.executable, script, *args], ...)`` through the fork server
    (``python -c code`` too)."""

    def __init__(self, args, *, start_new_session: bool = False, **kwargs):
        self._session = start_new_session  # (the child calls setsid)
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, *rest):
        fds = tuple(i if fd == -1 else fd for i, fd in enumerate((p2cread, c2pwrite, errwrite)))
        self._status = _the_server().start([os.fsdecode(a) for a in args[1:]],
                                           os.fsdecode(cwd) if cwd else None, env, fds,
                                           self._session)
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._status.settimeout(120)  # (the server forks at once, unless it is stuck)
        self.pid = int.from_bytes(self._recv(4), "little")
        self._status.settimeout(None)

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._status.recv(n - len(data))
            if not chunk:
                raise ChildProcessError("the fork server lost the child")
            data += chunk
        return data

    def _internal_poll(self, _deadstate=None, **_):
        return self._wait(0, block=False)

    def _wait(self, timeout, block=True):
        if self.returncode is None:
            ready, _, _ = select.select([self._status], [], [], timeout)
            if ready:
                status = int.from_bytes(self._recv(4), "little", signed=True)
                self.returncode = os.waitstatus_to_exitcode(status)
                self._status.close()
            elif block:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


def run(args: list, *, input=None, capture_output=False, timeout=None, check=False,
        env=None, **kwargs) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` with the child forked when :func:`forkable`."""
    if not forkable(args, env):
        return subprocess.run(args, input=input, capture_output=capture_output,
                              timeout=timeout, check=check, env=env, **kwargs)
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with ForkedPopen(args, env=env, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:  # a timeout, or the suite's own (pytest-timeout): as subprocess.run
            process.kill()
            process.wait()
            raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


def popen(args: list, *, env=None, **kwargs) -> subprocess.Popen:
    """:class:`subprocess.Popen`, the child forked when :func:`forkable`."""
    return (ForkedPopen if forkable(args, env) else subprocess.Popen)(args, env=env, **kwargs)


# ----------------------------------------------------------------------------- the server
def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python <argv...>`` and never return."""
    import atexit
    import io
    import runpy

    if request["session"]:
        os.setsid()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))  # python -u, whatever the server's
    for fd, name in ((1, "stdout"), (2, "stderr")):  # as Python makes them at its start
        old, raw = getattr(sys, name), io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(  # else: a buffer, by lines on a tty and on stderr
            raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding,
            errors=old.errors, write_through=unbuffered,
            line_buffering=not unbuffered and (name == "stderr" or raw.isatty())))
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # read by OpenMP as torch was imported
        import torch
        torch.set_num_threads(int(threads))
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = {"__name__": "__main__", "__builtins__": __builtins__}
            exec(compile(argv[1], "<string>", "exec"), main)
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -2
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # as Python's end (Py_RunMain): 120, whatever the script's status
            code = code if code == -2 else 120
    if code == -2:  # as the interpreter ends on a Ctrl-C it did not handle
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def _serve(ctl: socket.socket) -> None:
    """The server's loop: each request on ``ctl`` (or on a connection of a child's, at
    ``_ADDRESS``) forks a middle process, which forks the child, reports its pid, waits for
    it and reports its status."""
    global _ADDRESS
    import gc
    import importlib
    import pkgutil
    import signal

    _ADDRESS = _address(os.getpid())  # bound first: a client may connect while it imports
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(_ADDRESS)
    listener.listen()
    started_with = json.dumps(dict(os.environ)).encode()
    import tinymt

    for key, value in _SET_BY_CLI.items():  # as a script's first import sets them
        os.environ.setdefault(key, value)
    for module in pkgutil.walk_packages(tinymt.__path__, "tinymt."):
        if module.name not in _NOT_PRELOADED:
            importlib.import_module(module.name)
    importlib.import_module("tensorboard.default")  # (tensorboard's own plugins)
    importlib.import_module("datasets")  # (tinymt.data imports it where it prepares data)
    importlib.import_module("torch._dynamo")  # (an optimizer's first use imports it: 1.3 s)
    from tinymt.text import plan
    plan(["warm-up. 热身。"], "zh")  # py3langid's model, decompressed (~1 s a reading child)
    from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

    from tinymt.bench.serve_speed import ServerProcess
    ServerProcess.popen = staticmethod(popen)  # a benchmark's servers: forked here too
    SubprocessHandler._popen = _rank_popen  # torchrun's ranks: forked here too
    # what is imported lives on in every child: out of the cyclic GC's full passes, which
    # would walk it in each child (~0.26 s a pass); as the gc docs advise before a fork
    gc.collect()
    gc.freeze()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the middles
    clients = [ctl]
    while True:
        ready, _, _ = select.select([listener, *clients], [], [])
        if listener in ready:
            clients.append(listener.accept()[0])
            clients[-1].send(started_with)  # (the client's forkable compares with it)
        for client in (c for c in ready if c is not listener):
            try:
                msg, fds, _, _ = socket.recv_fds(client, 1 << 20, 4)
            except OSError:
                msg, fds = b"", []
            if not msg:  # a client closed its end; the test process: the server ends
                if client is ctl:
                    return
                clients.remove(client)
                client.close()
                continue
            if os.fork() == 0:  # the middle
                listener.close()
                for c in clients:
                    c.close()
                _middle(json.loads(msg), *fds)
            for fd in fds:
                os.close(fd)


def _rank_popen(self, args: tuple, env: dict) -> subprocess.Popen:
    """torchrun's start of a rank, ``python -u script ...`` in a session of its own (torchrun
    stops a rank's process group), forked when :func:`forkable`."""
    args, env = list(args), dict(env)
    if args[1:2] == ["-u"]:
        del args[1]
        env["PYTHONUNBUFFERED"] = "1"
    return popen(args, env=env, stdout=self._stdout, stderr=self._stderr, start_new_session=True)


def _middle(request: dict, status: int, *child_fds: int) -> None:
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        os.close(status)
        _child(request, list(child_fds))
    for fd in child_fds:
        os.close(fd)
    try:
        os.write(status, pid.to_bytes(4, "little"))
        _, wait_status = os.waitpid(pid, 0)
        os.write(status, wait_status.to_bytes(4, "little", signed=True))
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.path[0] = ""  # as a plain start from the test's folder: tinymt from the install
    _serve(socket.socket(fileno=int(sys.argv[1])))
