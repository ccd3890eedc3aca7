"""A trial worker that imports the training stack once and forks every trial of its slot from there.

A demo trial starting as a fresh `vit-ablate fit` process spends about 5 s importing torch,
Lightning and torchvision before it trains: a fifth of a 25 s trial. The local backend therefore
starts one worker per slot (in the slot's environment, its own session), which imports
`vit_lightning.commands.fit.main` and then waits on a socket. For each trial it forks a child that becomes
what `vit-ablate fit ...` would have been: its own session and process group (the supervisor
signals it as before), the trial's environment, stdout/stderr on the trial's log, the sweep's
run-directory lock under the same descriptor number, the same argv (so Lightning's DDP launcher
starts its other ranks with the same command), and the CLI's exit code. The worker reports the
child's pid, then its exit status in `subprocess.Popen.returncode` form (negative: killed by a
signal), so the supervisor treats both kinds of process alike.

Nothing runs in the worker but imports, so no thread, CUDA context or OpenMP pool exists to be
broken by fork. The worker exits when the sweep closes its end of the socket (or dies). A trial
that returns an exit code leaves with `leave` (no interpreter teardown, which costs seconds).

The worker ignores SIGTERM and SIGINT (its trials get their default handling back): a signal sent
to every process of a job (`scancel`, pre-emption) stops the trial, which the worker then reports,
instead of killing the worker first. A worker that dies anyway (SIGKILL, out of memory) leaves its
trial running without a parent that reports it: `Forked.wait` raises WorkerDied, and the supervisor
stops that trial itself.
"""

from __future__ import annotations

import array
import importlib
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys

# what a trial imports before it trains: torch, Lightning, torchvision, the model; wandb (fit checks its credentials)
PRELOAD = ("vit_lightning.commands.fit.main", "vit_lightning.analysis.evaluate", "wandb")
MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def _recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One message and the descriptors sent with it; (None, []) at end of file."""
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(16 * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return (json.loads(data) if data else None), list(fds)


class Worker:
    """The sweep's handle on one worker process: start() forks a trial there and returns a Popen-like handle."""

    def __init__(self, env: dict[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vit_lightning.commands.sweep.forkserver", str(theirs.fileno())],
            env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        ready, _ = _recv(self.sock)  # the stack is imported (or the worker died trying)
        if not ready or not ready.get("ready"):
            self.close()
            raise OSError("the trial worker could not import the training stack")

    def start(self, argv: list[str], env: dict[str, str], stdout=None, pass_fds=()) -> Forked:
        """Fork `vit-ablate ...` (argv as trials.executable gives it) as a trial, output to `stdout` or the sweep's."""
        if os.path.basename(argv[0]) == "vit-ablate":
            script, args = argv[0], argv[1:]
        elif argv[1:3] == ["-m", "vit_lightning.cli"]:
            script, args = None, argv[3:]  # the child runs vit_lightning/cli.py as the script
        else:
            raise ValueError(f"a trial worker runs vit-ablate commands only, not {argv[0]}")
        if args[:1] not in (["fit"], ["eval"]):
            raise ValueError(f"a trial worker runs `vit-ablate fit` and `eval` only, not {' '.join(args[:1])}")
        out = stdout.fileno() if stdout is not None else sys.stdout.fileno()
        err = stdout.fileno() if stdout is not None else sys.stderr.fileno()
        request = {"script": script, "args": args, "env": env, "fds": [1, 2, *pass_fds]}
        _send(self.sock, request, [out, err, *pass_fds])
        reply, _ = _recv(self.sock)
        if not reply or "pid" not in reply:
            raise OSError("the trial worker stopped before it started the trial")
        return Forked(self, reply["pid"])

    def died(self) -> str | None:
        """How the worker process ended ('signal 9', 'exit code 1'), or None while it lives."""
        code = self.process.poll()
        if code is None:
            return None
        return f"signal {-code}" if code < 0 else f"exit code {code}"

    def close(self) -> None:
        self.sock.close()  # the worker reads end of file and exits
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class WorkerDied(Exception):
    """The trial's worker died while the trial ran: the trial lives on without a parent that reports it."""


class Forked:
    """A forked trial as the supervisor sees a subprocess: pid, poll(), wait() -> returncode.

    Once its worker died (WorkerDied), the trial is watched through a pidfd: `gone()` says whether it has exited.
    """

    def __init__(self, worker: Worker, pid: int):
        self.worker, self.sock, self.pid, self.returncode = worker, worker.sock, pid, None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already exited and reaped by the worker
            self.pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and self.sock.fileno() < 0:  # the worker is closed: the trial is an orphan
            return -9 if self.gone() else None
        if self.returncode is None and select.select([self.sock], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._read()
        return self.returncode

    def gone(self, timeout: float = 0.0) -> bool:
        """Whether the trial process has exited (waiting up to `timeout` seconds)."""
        return self.pidfd is None or bool(select.select([self.pidfd], [], [], timeout)[0])

    def _read(self) -> None:
        try:
            reply, _ = _recv(self.sock)
        except OSError:
            reply = None
        if not reply or "returncode" not in reply:
            try:
                self.worker.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            raise WorkerDied(f"its worker died ({self.worker.died() or 'hung up'})")
        self.returncode = reply["returncode"]
        self.close()

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _child(sock: socket.socket, request: dict, fds: list[int]) -> int:
    """In the forked process: become `vit-ablate ARGS` and return its exit code (SystemExit and
    KeyboardInterrupt propagate to the interpreter's top level, as in a fresh process)."""
    sock.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker ignores them; a trial handles them as fit does
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd, wanted in zip(fds, request["fds"]):  # each descriptor under the number the trial expects
        if fd != wanted:
            os.dup2(fd, wanted)
    for fd in set(fds) - set(request["fds"]):
        os.close(fd)
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):  # buffered as a fresh process's would be
        stream.reconfigure(line_buffering=stream is sys.stderr or os.isatty(fd))
    os.environ.clear()
    os.environ.update(request["env"])
    if request["args"][:1] == ["eval"]:  # an evaluation the trial's profile declares (ablation.Evaluations)
        from vit_lightning.analysis import evaluate

        sys.argv = [request["script"] or "vit-ablate", *request["args"]]
        return evaluate.main(request["args"][1:])
    from vit_lightning.commands.fit import main as train

    # Lightning starts the other DDP ranks with `python sys.argv[0] ARGS` when __main__ has no module spec
    # (else `python -m <__main__'s module>`, which here would be this worker): they run the trial's own command
    # (the `vit-ablate` script, or the cli module's file: located, not imported, as it sits above the sweep)
    script = request["script"] or importlib.util.find_spec("vit_lightning.cli").origin
    sys.argv = [script, *request["args"]]
    sys.modules["__main__"].__spec__ = None
    return train.main(request["args"][1:])  # after `fit`


def serve(fd: int) -> int | None:
    """The worker's loop; returns None when the sweep hangs up, or, in a forked trial, the trial's exit code."""
    sock = socket.socket(fileno=fd)
    for sig in (signal.SIGTERM, signal.SIGINT):  # a job-wide signal is the trial's to handle; the sweep reports it
        signal.signal(sig, signal.SIG_IGN)
    for module in PRELOAD:
        importlib.import_module(module)

    _send(sock, {"ready": True})
    while True:
        request, fds = _recv(sock)
        if request is None:
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        started, went = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(started)
            os.setsid()  # before the sweep learns the pid: it signals the trial's process group
            os.close(went)
            return _child(sock, request, fds)
        os.close(went)
        os.read(started, 1)  # end of file once the child has its own session (or died)
        os.close(started)
        for received in fds:
            os.close(received)
        try:
            _send(sock, {"pid": pid})
        except OSError:  # the sweep is gone: the trial runs on alone, as a spawned one would
            return None
        _, status = os.waitpid(pid, 0)
        try:
            _send(sock, {"returncode": os.waitstatus_to_exitcode(status)})
        except OSError:
            return None


def leave(code: int) -> None:
    """End a forked trial once its run is written: streams flushed, W&B's service released, logging shut down,
    then os._exit. The interpreter's own shutdown (tearing down every module of the stack) would add about
    2.4 s to each trial; the trial's atexit work is done here or by fit itself (it finishes its W&B run)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if "wandb" in sys.modules:
        import wandb

        wandb.teardown()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    code = serve(int(sys.argv[1]))
    if code is None:  # the worker itself: the sweep hung up
        sys.exit(0)
    leave(code)  # a forked trial that returned (an exception or SystemExit ends it as any process ends)
