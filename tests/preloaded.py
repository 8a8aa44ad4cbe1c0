"""Commands the tests run as a user runs them (``python -m t2s ...``, ``python tests/SCRIPT.py ...``), each in a process
of its own, started by forking an interpreter that has already imported the heavy libraries instead of a fresh one.

Importing torch, transformers, vLLM and TRL takes 10 to 15 s of CPU on a 2-core machine, and dozens of the suite's
processes used to pay it before doing a second of work. :func:`run` and :func:`start` hand a command to a *preloaded*
interpreter of this pytest worker (one per :data:`PRELOADS` entry and environment, started at its first use, each
forked from the one before it and importing more), which forks; the child takes the command's standard streams,
working folder, environment, ``sys.argv`` and ``sys.path``, runs it as ``__main__`` the way ``python -m MODULE`` or
``python SCRIPT`` would, and ends as the interpreter ends: non-daemon threads joined, ``atexit`` handlers run, streams
flushed; its exit status (or the signal that killed it) is the command's.

What differs from a fresh interpreter, and why it does not change what a test sees:
- the preloaded modules are already imported. A test names a preload only of modules its command imports anyway (so
  ``tests.vllm_support``'s runs, which must play transformers before vLLM is imported, preload ``torch`` alone);
- an interpreter serves only commands whose environment equals the one it was started with, except the variables in
  :data:`READ_LATER` (read after start-up, or by this module). Variables that libraries read as they are imported
  (``OMP_NUM_THREADS``, ``HF_HUB_OFFLINE``, ...) are therefore the command's own;
- what the preloaded imports set in the environment (vLLM's ``TORCHINDUCTOR_COMPILE_THREADS``, ...) is set again in
  the child, where the command's environment lacks it or the import had replaced a value;
- what a library printed while being imported (a one-time notice) is not in the command's output, and a warning shown
  once there is not shown again; Python's teardown after the exit handlers (module cleanup) does not run;
- the interpreters live until the worker ends (about 1 GB of memory for a chain of three);
- a library is never first imported inside the command's own frames. That once mattered: vLLM keeps an optional
  import's error at module level, and its traceback held the frame that had built a trainer, which then outlived
  ``del trainer``. Every process started by a launcher (``torchrun``, ``accelerate launch``, the Slurm job, ``make
  serve``) still starts fresh, so a training run that imports vLLM as it builds its trainer still runs in the suite:
  the two-rank colocated run, the torchrun and Slurm jobs.

``T2S_TEST_FRESH_PROCESSES=1`` runs every command in a fresh interpreter instead, as before; so does a preloaded
interpreter that fails to start (with a warning saying why).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The preloads, each importing more on top of the one before it (an interpreter of one is forked from the one before,
# so that each import is paid once): a command names the last whose modules it imports anyway
PRELOADS = {
    "torch": ("torch", "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto"),
    "vllm": ("vllm.entrypoints.llm",),
    "grpo": ("trl.trainer.grpo_trainer",),
}
# Variables a command may set otherwise than its preloaded interpreter: pytest's own (the current test's name), the
# search path (set again in the child), and ones read only when a command uses them, after start-up (vLLM reads its
# own through ``vllm.envs`` as it uses them)
READ_LATER = ("PYTEST_CURRENT_TEST", "PYTHONPATH", "TOKENIZERS_PARALLELISM", "VLLM_NO_USAGE_STATS", "VLLM_HOST_IP",
              "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")
READ_LATER_PREFIXES = ("T2S_",)
FRESH = "T2S_TEST_FRESH_PROCESSES"
START_TIMEOUT_S = 600
INTERRUPTED = "SIGINT"  # how a command ended by an uncaught KeyboardInterrupt ends: killed by SIGINT, as Python does


def _import_key(env: dict) -> tuple:
    return tuple(sorted((key, value) for key, value in env.items()
                        if key not in READ_LATER and not key.startswith(READ_LATER_PREFIXES)))


class Started:
    """A command started in a forked, preloaded interpreter: its pid, and :meth:`poll`, :meth:`wait` and
    :meth:`kill` as ``subprocess.Popen`` has them."""

    def __init__(self, args: list[str], pid: int, status: socket.socket, new_session: bool):
        self.args, self.pid, self.returncode = args, pid, None
        self._status, self._new_session = status, new_session

    def poll(self) -> int | None:
        if self.returncode is None:
            self._status.setblocking(False)
            try:
                self._read_status()
            except BlockingIOError:
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._status.setblocking(True)
            self._status.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.killpg(self.pid, 9) if self._new_session else os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def _read_status(self) -> None:
        data = self._status.recv(64)
        if not data:
            raise RuntimeError(f"the preloaded interpreter ended before reporting how {self.args} ended")
        self.returncode = int(data.decode().split()[-1])
        self._status.close()


def _ready(control: socket.socket, what: str, log=None) -> None:
    control.settimeout(START_TIMEOUT_S)
    try:
        ready = control.recv(4096)
    except TimeoutError:
        ready = b""
    control.settimeout(None)
    if ready != b"ready":
        tail = ""
        if log is not None:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-1500:]
        raise RuntimeError(f"the {what} preloaded interpreter did not start ({ready[:500]!r}): {tail}")


class _Interpreter:
    """One preloaded interpreter and the socket that hands it commands. The first of an environment is started as
    ``python -c 'from tests.preloaded import serve; serve(...)'``; each later preload is forked from the one before."""

    def __init__(self, preload: str, env: dict, before: _Interpreter | None):
        self.preload, self.process, self.log = preload, None, None
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        if before is None:
            self.log = tempfile.TemporaryFile()
            code = f"from tests.preloaded import serve; serve({theirs.fileno()}, {PRELOADS[preload]!r})"
            self.process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                            pass_fds=[theirs.fileno()], stdout=self.log, stderr=subprocess.STDOUT)
        else:
            socket.send_fds(before.control, [json.dumps({"extend": PRELOADS[preload]}).encode()], [theirs.fileno()])
        theirs.close()
        try:
            _ready(self.control, repr(preload), self.log)
        except RuntimeError:
            if self.process is not None:
                self.process.kill()
            raise

    def start(self, argv: list[str], env: dict, cwd: Path, files: tuple, new_session: bool) -> Started:
        request = json.dumps({"argv": argv[1:], "env": env, "cwd": str(cwd), "new_session": new_session}).encode()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        socket.send_fds(self.control, [request], [f.fileno() for f in files] + [theirs.fileno()])
        theirs.close()
        mine.settimeout(START_TIMEOUT_S)
        line = b""
        while not line.endswith(b"\n"):
            chunk = mine.recv(1)
            if not chunk:
                raise RuntimeError(f"the preloaded interpreter did not start {argv}: {line!r}")
            line += chunk
        if line.startswith(b"exit"):
            raise RuntimeError(f"{argv} ended before it started: {line!r}")
        return Started(argv, int(line), mine, new_session)

    def close(self) -> None:
        self.control.close()  # the interpreter ends when its control socket does
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


_interpreters: dict[tuple, _Interpreter | str] = {}


@atexit.register
def _close_all() -> None:
    for interpreter in reversed(list(_interpreters.values())):
        if isinstance(interpreter, _Interpreter):
            interpreter.close()


def _interpreter(preload: str, env: dict) -> _Interpreter | None:
    """This worker's interpreter of ``preload`` for ``env`` (and those before it), started at the first use; None
    where commands run fresh."""
    if os.environ.get(FRESH) == "1":
        return None
    before = None
    for name in PRELOADS:
        key = (name, _import_key(env))
        if key not in _interpreters:
            try:
                _interpreters[key] = _Interpreter(name, env, before)
            except (OSError, RuntimeError) as error:
                _interpreters[key] = str(error)
                warnings.warn(f"commands run in fresh interpreters: {error}", stacklevel=3)
        before = _interpreters[key]
        if not isinstance(before, _Interpreter):
            return None
        if name == preload:
            return before
    raise AssertionError(preload)


def start(argv: list[str], *, preload: str, env: dict, stdout, stderr, cwd: Path = ROOT,
          new_session: bool = False):
    """Start ``argv`` (``[sys.executable, "-m", MODULE, ...]`` or ``[sys.executable, SCRIPT, ...]``) with its output
    in the files ``stdout`` and ``stderr``: a :class:`Started` from the ``preload`` interpreter, else a ``Popen``."""
    assert argv[0] == sys.executable and preload in PRELOADS, argv
    interpreter = _interpreter(preload, env)
    if interpreter is None:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                start_new_session=new_session)
    with open(os.devnull, "rb") as stdin:
        return interpreter.start(argv, env, cwd, (stdin, stdout, stderr), new_session)


def run(argv: list[str], *, preload: str, env: dict, timeout: float, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, ...)``, the command started by :func:`start`."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = start(argv, preload=preload, env=env, stdout=out, stderr=err, cwd=cwd)
        try:
            process.wait(timeout=timeout)
        except BaseException:  # a timeout, pytest-timeout's failure, an interrupt: the command ends with the test
            process.kill()
            process.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, process.returncode, out.read(), err.read())


# ------------------------------------------------------------------------------------ the preloaded interpreter
def serve(control_fd: int, modules: tuple[str, ...]) -> None:
    """The interpreter of the first preload: import ``modules``, then :func:`_serve`."""
    _serve(socket.socket(fileno=control_fd), modules, None, {})


def _serve(control: socket.socket, modules: tuple[str, ...], search_path: list[str] | None, imported: dict) -> None:
    """Import ``modules`` and say ``ready`` on ``control``; then, for each command received on it, fork a child that
    runs it and report the child's pid, then its exit status, on the socket that came with the command; for each
    ``extend`` request, fork the interpreter of the next preload on the socket that came with it. Ends when the worker
    closes ``control``."""
    import importlib
    import threading

    before = dict(os.environ)
    for name in modules:
        importlib.import_module(name)
    # what the imports set in the environment (vLLM sets TORCHINDUCTOR_COMPILE_THREADS, ...), for each child to set
    # again: (value, whether it replaced a value the environment had)
    imported = imported | {key: (value, key in before) for key, value in os.environ.items() if before.get(key) != value}
    search_path = _search_path_tail() if search_path is None else search_path
    if threading.active_count() != 1 or search_path is None:
        control.send(b"not forkable: " + repr((threading.enumerate(), sys.path)).encode()[:3000])
        return
    sys.stdout.flush()
    sys.stderr.flush()
    control.send(b"ready")
    control.settimeout(0.1)
    children: dict[int, socket.socket | None] = {}  # a command's status socket; None for an extension
    while True:
        try:
            request, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        except TimeoutError:
            request = None
        if request == b"":
            return
        if request:
            asked = json.loads(request)
            reply = socket.socket(fileno=fds[-1])
            pid = os.fork()
            if pid == 0:
                control.close()
                for other in children.values():
                    if other is not None:
                        other.close()
                if "extend" in asked:
                    _serve(reply, tuple(asked["extend"]), search_path, imported)
                    os._exit(0)
                _child(asked, fds[:3], reply, search_path, imported)  # never returns
            for fd in fds[:-1]:
                os.close(fd)
            if "extend" in asked:
                reply.close()
                children[pid] = None
            else:
                children[pid] = reply  # the child says its pid on it once started, this loop its exit status
        while children:
            pid, code = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            status = children.pop(pid, None)
            if status is not None:
                try:
                    status.sendall(f"exit {os.waitstatus_to_exitcode(code)}\n".encode())
                except OSError:  # nobody waits for it any more
                    pass
                status.close()


def _search_path_tail() -> list[str] | None:
    """``sys.path`` without what this interpreter's start put first (its ``''`` for ``-c``, then ``PYTHONPATH``'s
    entries), or None where it does not start that way."""
    head = ["", *_search_path_entries()]
    return sys.path[len(head):] if sys.path[:len(head)] == head else None


def _search_path_entries() -> list[str]:
    """``PYTHONPATH``'s entries as the interpreter puts them on ``sys.path`` (absolute, from the working folder)."""
    return [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _child(request: dict, fds: list[int], started: socket.socket, search_path: list[str], imported: dict) -> None:
    """The forked child: say its pid on ``started`` once in its own session (if asked for one), become the command
    and end as its interpreter would."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        started.sendall(f"{os.getpid()}\n".encode())
        started.close()
        for fd, target in zip(fds, (0, 1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for key, (value, replaced) in imported.items():  # as the command's own imports would set them
            if replaced or key not in os.environ:
                os.environ[key] = value
        argv = request["argv"]
        if argv[0] == "-m":
            sys.argv, first = argv[1:], os.getcwd()
        else:
            sys.argv, first = argv, os.path.dirname(os.path.realpath(argv[0]))
        sys.path[:] = [first, *_search_path_entries(), *search_path]
        code = _run_main(argv)
    except BaseException:  # noqa: BLE001 - the child must end here, whatever happened
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        _end(code)


def _run_main(argv: list[str]) -> int:
    import builtins
    import runpy

    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __loader__=None,
                         __builtins__=builtins)
    try:
        if argv[0] == "-m":
            runpy._run_module_as_main(argv[1], alter_argv=True)
        else:
            path = os.path.abspath(argv[0])
            main.__dict__.update(__file__=path, __cached__=None)
            source = Path(path).read_bytes()
            exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
    except SystemExit as done:
        return _exit_code(done.code)
    except KeyboardInterrupt:  # printed, then the interpreter ends and kills itself with SIGINT (see _end)
        _print_trimmed()
        return INTERRUPTED
    except BaseException:  # noqa: BLE001 - an uncaught exception, printed as the interpreter prints it
        _print_trimmed()
        return 1
    return 0


def _print_trimmed() -> None:
    """The exception being handled, as the interpreter prints it, without this module's frames."""
    kind, error, trace = sys.exc_info()
    while trace is not None and trace.tb_frame.f_code.co_filename == __file__:
        trace = trace.tb_next  # the frames of this module, which a fresh interpreter does not have
    sys.excepthook(kind, error.with_traceback(trace), trace)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _end(code: int | str) -> None:
    """As the interpreter ends: join non-daemon threads, run ``atexit`` handlers, flush the streams, exit."""
    import threading

    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to flush
                pass
        if code == INTERRUPTED:
            import signal

            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code & 0xFF if isinstance(code, int) else 1)
