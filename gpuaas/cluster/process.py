"""Processes the harness runs (control-plane components, gpuaas components, Prometheus): started in a session of their
own with a log file, stopped with SIGTERM then SIGKILL, and recognised by pid *and* binary so that a recycled pid is
never signalled."""
from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port to listen on later, below the kernel's ephemeral range. A port the kernel hands out for `bind(0)` is
    one it also gives to outgoing connections, and the harness opens thousands of those (components talking to the
    apiserver): between choosing a port and the component binding it, one of them took it ("address already in
    use" for the demo's extender once). Ports below the range are only ever taken by listeners."""
    low, _ = _ephemeral_range()
    if low > 21000:
        rng = random.SystemRandom()
        for _ in range(50):
            port = rng.randrange(20000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the range, or all tries taken: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a test run that crashes takes the processes it started with it. (The signal comes when the
    # spawning *thread* ends: spawn owned processes from a thread that outlives them.)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)


def process_alive(pid: int, argv0: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    # A zombie has exited; a recycled pid runs another binary.
    return cmdline == argv0 and stat.rsplit(")", 1)[1].split()[0] != "Z"


def spawn(argv: list[str], log: Path, *, owned: bool = True, append: bool = False, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `argv` in its own session, stdout and stderr to `log`. `owned`: it dies with this Python process."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=env, start_new_session=True, preexec_fn=die_with_parent if owned else None)


def terminate(pid: int, argv0: str, *, popen: subprocess.Popen | None = None, grace: float = 5.0) -> None:
    """SIGTERM the process group (after SIGCONT: a stopped process cannot handle SIGTERM), SIGKILL after `grace`."""
    if process_alive(pid, argv0):
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and process_alive(pid, argv0):
            if popen is not None and popen.poll() is not None:
                break
            time.sleep(0.05)
        if process_alive(pid, argv0):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    if popen is not None:
        popen.wait(timeout=10)


def answers_ok(url: str, timeout: float = 2.0) -> bool:
    """A component's health endpoint answers 200 (not up, refusing or slow: False)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
