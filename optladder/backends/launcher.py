"""A server in a child process that never outlives us: port checked before start, health awaited with a
deadline, the log tail and exit code on failure, and the whole process group stopped on every exit path.

    with ServerProcess(cmd, "127.0.0.1", 8000, log_path, env=env) as server:
        server.wait_healthy(timeout_s=600)
        ... talk to server.url ...

Why each guard:
- The child gets a session (and so a process group) of its own, so stopping it reaches every process it
  spawned (vLLM forks an engine-core process and compile workers), and a terminal's Ctrl-C does not hit
  it before we can stop it in order.
- `__exit__` stops it on normal exit and on exceptions (KeyboardInterrupt included); SIGTERM to us is
  turned into an exception (`install_signal_handlers`) so the same path runs; `atexit` catches an
  interpreter exit that skipped both; PR_SET_PDEATHSIG covers a SIGKILL of us, which nothing can catch.
  It fires when the *thread* that started the server ends, so start servers from the main thread (or one
  that outlives them).
- The server runs under a small sh supervisor (SUPERVISOR) that passes one SIGTERM on to the whole group.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

log = logging.getLogger(__name__)
STOP_GRACE_S = 15.0  # SIGTERM first, so vLLM can stop its engine core; then SIGKILL the group
TAIL_LINES = 40
_LIVE: set["ServerProcess"] = set()  # every started, not yet stopped server, for atexit and signals
_LIVE_LOCK = threading.Lock()


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message carries its exit code and log tail."""


def port_in_use(host: str, port: int) -> bool:
    """True if something is bound to host:port. SO_REUSEADDR like a server sets it, so a socket merely in
    TIME_WAIT does not count as in use."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port(host: str) -> int:
    """A port the OS calls free now (another process could still take it before the server binds)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# The server runs under a small sh that turns its own SIGTERM into one for the whole group (once), then
# waits for the server and exits with its status. PR_SET_PDEATHSIG reaches only that one process when we
# die by SIGKILL; through the trap it reaches every process the server started, whatever the server does.
SUPERVISOR = ('trap \'if [ -z "$stopping" ]; then stopping=1; kill -TERM 0 2>/dev/null; fi\' TERM INT HUP\n'
              '"$@" &\npid=$!\nwhile :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || exit "$rc"; done\n')


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM the child if the parent dies, even by SIGKILL
    except OSError:  # not Linux: the other guards still hold
        pass


class ServerProcess:
    def __init__(self, cmd: list[str], host: str, port: int, log_path: Path, env: dict[str, str] | None = None,
                 health_path: str = "/health", name: str = "server"):
        if port_in_use(host, port):
            raise ValueError(f"port {port} on {host} is already in use: stop what holds it, or choose another "
                             f"with engine.server.port=N (0 picks a free port)")
        self.cmd, self.host, self.port, self.name = cmd, host, port, name
        self.url = f"http://{host}:{port}"
        self.health_url = self.url + health_path
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            # preexec_fn: setsid and the parent-death signal must both happen in the child before exec
            self.proc = subprocess.Popen(["/bin/sh", "-c", SUPERVISOR, "sh", *cmd], stdin=subprocess.DEVNULL,
                                         stdout=logf, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        self.pgid = self.proc.pid  # setsid made the supervisor its group's leader
        with _LIVE_LOCK:
            _LIVE.add(self)
        log.info("%s: started pid %d on port %d, log %s", name, self.proc.pid, port, self.log_path)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5, since: float | None = None) -> float:
        """Block until GET /health answers 200; seconds waited. Exit or timeout: stop it and raise. since: the
        time.monotonic() the timeout counts from (a server launched earlier and awaited now: its launch)."""
        t0 = time.monotonic() if since is None else since
        try:
            while not self._healthy():
                rc = self.proc.poll()
                if rc is not None:
                    raise ServerStartError(f"{self.name} exited with status {rc} before it was healthy "
                                           f"(command: {' '.join(self.cmd[:4])} ...). Last lines of "
                                           f"{self.log_path}:\n{self.log_tail()}")
                if time.monotonic() - t0 > timeout_s:
                    raise ServerStartError(f"{self.name} was not healthy at {self.health_url} within "
                                           f"{timeout_s:.0f} s (engine.server.startup_timeout_s); stopped it. "
                                           f"Last lines of {self.log_path}:\n{self.log_tail()}")
                time.sleep(poll_s)
        except BaseException:  # failure, timeout, Ctrl-C while waiting: nothing is left running
            self.stop()
            raise
        return time.monotonic() - t0

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, n: int = TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:]) or "(empty log)"

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the whole group, wait up to grace_s, then SIGKILL it. Idempotent; returns the exit code."""
        with _LIVE_LOCK:
            _LIVE.discard(self)
        _signal_group(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self._group_alive() and time.monotonic() < deadline:  # the whole group, not just the leader
            time.sleep(0.1)
        if self._group_alive():
            log.warning("%s: process group %d still alive %.0f s after SIGTERM; killing it", self.name, self.pgid,
                        grace_s)
        _signal_group(self.pgid, signal.SIGKILL)
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # unkillable (D state): report, do not hang the run
            log.error("%s: pid %d did not die after SIGKILL", self.name, self.proc.pid)
            return None

    def _group_alive(self) -> bool:
        self.proc.poll()  # reap the leader: a zombie still counts as a member of its group
        try:
            os.killpg(self.pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop(grace_s=5.0)


class Terminated(BaseException):
    """SIGTERM, raised where the main thread was, so every `with ServerProcess` and `finally` unwinds."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"signal {signum}")
        self.signum = signum


_SIGNALLED: list[int] = []  # the signals turned into Terminated in this process


def _on_sigterm(signum, frame) -> None:
    _SIGNALLED.append(signum)
    raise Terminated(signum)


def terminated() -> Terminated | None:
    """A Terminated for the SIGTERM this process received, or None. The exception can be lost on its way up: a
    library it unwinds through may raise its own error in a `finally` or re-raise it as one (Hydra's config
    composition did: "ConfigCompositionException: 'NoneType' object has no attribute '_invalidate_flags_cache'"),
    so code that catches Exception and goes on (a ladder's rung, a report) asks here first and ends instead."""
    return Terminated(_SIGNALLED[-1]) if _SIGNALLED else None


def raise_if_terminated(cause: BaseException) -> None:
    """Where an Exception is caught: raise the SIGTERM this process received (terminated()) in its place, from it."""
    if (stop := terminated()) is not None:
        raise stop from cause


def install_signal_handlers() -> None:
    """Turn SIGTERM into an exception (SIGINT already is one: KeyboardInterrupt), so the normal unwinding
    stops every server. Only the main thread may install handlers; elsewhere atexit and PDEATHSIG remain."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # e.g. started with nohup &: still stop cleanly
        signal.signal(signal.SIGINT, signal.default_int_handler)


atexit.register(stop_all)
