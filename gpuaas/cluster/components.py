"""gpuaas's own components (extender, autoscaler) as processes beside a local control plane, the way a platform runs
them: a separate process, its own log in the cluster's work directory, ready when its /readyz says so."""
from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .pki import EXTENDER_SERVING, Pki
from .process import free_port, process_alive, spawn, terminate

REPO = Path(__file__).resolve().parents[2]


def _no_verify() -> ssl.SSLContext:
    # The readiness probe only asks "is it up"; the scheduler verifies the certificate for real.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class ComponentProcess:
    def __init__(self, name: str, args: list[str], workdir: Path, *, port: int | None = None,
                 env: dict[str, str] | None = None):
        self.name = name
        self.port = port or free_port()
        self.args = args
        self.log = Path(workdir) / "logs" / f"{name}.log"
        self.env = env or {}
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        scheme = "https" if any(k.endswith("TLS__CERT_FILE") for k in self.env) else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ComponentProcess:
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> ComponentProcess:
        """Start the process without waiting. From the thread that lives as long as the component should: the
        process is tied to its parent *thread* (PR_SET_PDEATHSIG), so spawning from a worker thread that ends kills
        it."""
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        self.popen = spawn(self.command(), self.log, append=True, env=env)
        return self

    def command(self) -> list[str]:
        """What spawn() runs: `gpuaas <args>`."""
        return [sys.executable, "-m", "gpuaas.cli", *self.args]

    def wait_ready(self, timeout: float = 30.0) -> ComponentProcess:
        assert self.popen, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; see {self.log}:\n"
                                   + "\n".join(self.log.read_text(errors="replace").splitlines()[-20:]))
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1, context=_no_verify()) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f}s; see {self.log}")

    def kill(self) -> None:
        """SIGKILL: the crash a component must survive."""
        if self.popen and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen:
            terminate(self.popen.pid, sys.executable, popen=self.popen, grace=10)

    def running(self) -> bool:
        return self.popen is not None and process_alive(self.popen.pid, sys.executable)


def extender_tls_env(pki: Pki) -> dict[str, str]:
    """The extender's TLS settings on a local cluster (GPUAAS_EXTENDER_TLS__*): its serving certificate from the
    cluster's PKI, and the cluster CA as the CA of the client certificate kube-scheduler presents (its own,
    CN system:kube-scheduler: the extender's default client_names)."""
    stem = EXTENDER_SERVING[0]
    return {"GPUAAS_EXTENDER_TLS__CERT_FILE": str(pki.path(f"{stem}.crt")),
            "GPUAAS_EXTENDER_TLS__KEY_FILE": str(pki.path(f"{stem}.key")),
            "GPUAAS_EXTENDER_TLS__CLIENT_CA_FILE": str(pki.ca_cert)}


def scheduler_extender_tls(pki: Pki) -> dict[str, str]:
    """kube-scheduler's side (extender_entry's ca_file, cert_file, key_file): it verifies the extender with the
    cluster CA and presents its own client certificate."""
    return {"ca_file": str(pki.ca_cert), "cert_file": str(pki.path("scheduler.crt")),
            "key_file": str(pki.path("scheduler.key"))}


def extender_process(workdir: Path, kubeconfig: Path, *, policy: str = "gpuaas", port: int | None = None,
                     extra: list[str] | None = None, env: dict[str, str] | None = None,
                     pki: Pki | None = None) -> ComponentProcess:
    """`pki`: serve mTLS with the local cluster's certificates (extender_tls_env); else plain HTTP on 127.0.0.1."""
    env = {**(extender_tls_env(pki) if pki is not None else {}), **(env or {})}
    proc = ComponentProcess("gpuaas-extender", [], workdir, port=port, env=env)
    proc.args = ["extender", "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", str(proc.port),
                 "--policy", policy, *(extra or [])]
    return proc


def nodescaler_process(workdir: Path, kubeconfig: Path, config: Path, *, identity: str = "gpuaas-nodescaler",
                       name: str = "gpuaas-nodescaler") -> ComponentProcess:
    proc = ComponentProcess(name, [], workdir)
    proc.args = ["nodescaler", "--config", str(config), "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1",
                 "--port", str(proc.port), "--identity", identity]
    return proc


def gangs_process(workdir: Path, kubeconfig: Path, config: Path | None = None, *, identity: str = "gpuaas-gangs",
                  name: str = "gpuaas-gangs") -> ComponentProcess:
    """`gpuaas gangs`; ready once its informers synced (its /readyz)."""
    proc = ComponentProcess(name, [], workdir)
    proc.args = ["gangs", "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--port", str(proc.port),
                 "--identity", identity, *(["--config", str(config)] if config is not None else [])]
    return proc


def autoscaler_process(workdir: Path, kubeconfig: Path, config: Path, *, port: int | None = None) -> ComponentProcess:
    """Ready once its first sync ran (its /readyz): past reading its config and checking its queries. `port`: of
    /metrics and the probes (default: a free one)."""
    proc = ComponentProcess("gpuaas-autoscaler", [], workdir, port=port)
    proc.args = ["autoscaler", "--config", str(config), "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1",
                 "--port", str(proc.port), "--verbose"]
    return proc
