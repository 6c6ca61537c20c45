"""A real Kubernetes control plane on loopback, with KWOK playing the kubelets.

Five processes: etcd, kube-apiserver, kube-controller-manager (all default controllers), kube-scheduler (optionally
calling HTTP extenders) and the kwok controller. Everything lives in one work directory:

    <workdir>/pki/            certificates and keys (see pki.py)
    <workdir>/kubeconfig      admin kubeconfig (what kubectl and the tests use)
    <workdir>/logs/<c>.log    one log per component, kept after stop for debugging
    <workdir>/state.json      pids and ports, so `gpuaas cluster status|down` can find a cluster started by `up`

Flags follow what kwokctl's binary runtime passes (kwok v0.8.0, pkg/kwokctl/components), written out here so that
each one is visible and the harness does not depend on kwokctl.
"""
from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodescaler.provider import KWOK_NODE_ANNOTATION

from . import pki as pkimod
from .process import free_port, process_alive, spawn, terminate
from .stages import write_kwok_config
from .tools import Tools

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.128.0.0/9"  # room for 100k pods; kwok hands pod IPs out of it


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, or a component died."""


@dataclass
class ComponentState:
    pid: int
    argv: list[str]
    log: str
    port: int | None = None


@dataclass
class ControlPlaneState:
    name: str
    workdir: str
    apiserver_url: str
    components: dict[str, ComponentState] = field(default_factory=dict)
    started_at: float = 0.0

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ControlPlaneState:
        raw = json.loads(path.read_text())
        raw["components"] = {k: ComponentState(**v) for k, v in raw["components"].items()}
        return cls(**raw)


def scheduler_configuration(kubeconfig: Path, extenders: list[dict[str, Any]] | None = None,
                            profiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A KubeSchedulerConfiguration (v1). `extenders` are entries in the scheduler's own field names
    (urlPrefix, filterVerb, prioritizeVerb, bindVerb, weight, nodeCacheCapable, managedResources, ignorable, ...)."""
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 5000, "burst": 10000},
        "leaderElection": {"leaderElect": False},
    }
    if extenders:
        config["extenders"] = extenders
    if profiles:
        config["profiles"] = profiles
    return config


class ControlPlane:
    """Start, inspect and stop one local control plane. Use `start()`/`stop()` or as a context manager."""

    def __init__(self, workdir: Path, *, name: str = "gpuaas", tools: Tools | None = None,
                 extenders: list[dict[str, Any]] | None = None, scheduler_profiles: list[dict[str, Any]] | None = None,
                 extra_args: dict[str, list[str]] | None = None, owned: bool = True):
        self.workdir = Path(workdir).resolve()
        self.name = name
        self.tools = tools or Tools.locate()
        self.extenders = extenders
        self.scheduler_profiles = scheduler_profiles
        self.extra_args = extra_args or {}
        self.owned = owned  # owned processes die with this Python process; `cluster up` leaves them running
        self.state: ControlPlaneState | None = None
        self._popen: dict[str, subprocess.Popen] = {}

    # ---- paths -------------------------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def pki(self) -> pkimod.Pki:
        return pkimod.Pki(self.workdir / "pki")

    @property
    def state_file(self) -> Path:
        return self.workdir / "state.json"

    @property
    def server(self) -> str:
        assert self.state, "control plane not started"
        return self.state.apiserver_url

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        if self.state_file.exists() and self.attach_existing():
            raise ControlPlaneError(f"a control plane is already running in {self.workdir}; stop it first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        pki = pkimod.create_pki(self.workdir / "pki")
        ports = {c: free_port() for c in COMPONENTS}
        etcd_peer = free_port()
        url = f"https://127.0.0.1:{ports['kube-apiserver']}"
        self.state = ControlPlaneState(name=self.name, workdir=str(self.workdir), apiserver_url=url,
                                       started_at=time.time())
        pkimod.write_kubeconfig(self.kubeconfig, server=url, pki=pki, client="admin")
        kc = {c: pkimod.write_kubeconfig(self.workdir / f"{c}.kubeconfig", server=url, pki=pki, client=c)
              for c in ("controller-manager", "scheduler", "kwok")}
        self.write_scheduler_config()
        write_kwok_config(self.workdir / "kwok.yaml", self.tools.kwok_stages)
        try:
            self._spawn("etcd", self._etcd_argv(ports["etcd"], etcd_peer), ports["etcd"])
            self._wait(lambda: self._http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), "etcd", timeout)
            self._spawn("kube-apiserver", self._apiserver_argv(ports), ports["kube-apiserver"])
            self._wait(lambda: self._http_ok(f"{url}/readyz", client="admin"), "kube-apiserver", timeout)
            self._spawn("kube-controller-manager", self._kcm_argv(ports["kube-controller-manager"],
                                                                  kc["controller-manager"]),
                        ports["kube-controller-manager"])
            self._spawn("kube-scheduler", self._scheduler_argv(ports["kube-scheduler"], kc["scheduler"]),
                        ports["kube-scheduler"])
            self._spawn("kwok", self._kwok_argv(ports["kwok"], kc["kwok"]), ports["kwok"])
            for comp in ("kube-controller-manager", "kube-scheduler"):
                port = ports[comp]
                self._wait(lambda p=port: self._http_ok(f"https://127.0.0.1:{p}/healthz"), comp, timeout)
            self._wait(lambda: self._http_ok(f"http://127.0.0.1:{ports['kwok']}/healthz"), "kwok", timeout)
            # Pods can only be created once the default ServiceAccount exists (ServiceAccount admission).
            self._wait(lambda: self._kubectl_ok("get", "serviceaccount", "default", "-n", "default"),
                       "the default ServiceAccount", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def write_scheduler_config(self) -> Path:
        path = self.workdir / "scheduler.yaml"
        config = scheduler_configuration(self.workdir / "scheduler.kubeconfig", self.extenders, self.scheduler_profiles)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def restart_scheduler(self, *, extenders: list[dict[str, Any]] | None = None,
                          profiles: list[dict[str, Any]] | None = None, timeout: float = 60.0) -> None:
        """Restart kube-scheduler with new extenders or profiles (what an operator does after editing its config)."""
        self.stop_scheduler()
        self.extenders, self.scheduler_profiles = extenders, profiles
        self.write_scheduler_config()
        self.start_scheduler(timeout)

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler only: pods created meanwhile queue up (benchmarks measure the drain)."""
        assert self.state
        self._terminate("kube-scheduler", self.state.components["kube-scheduler"])

    def start_scheduler(self, timeout: float = 60.0) -> None:
        assert self.state
        comp = self.state.components["kube-scheduler"]
        self._spawn("kube-scheduler", comp.argv, comp.port, append_log=True, extra=False)
        self._wait(lambda: self._http_ok(f"https://127.0.0.1:{comp.port}/healthz"), "kube-scheduler", timeout)

    def add_process(self, name: str, argv: list[str], port: int | None = None,
                    env: dict[str, str] | None = None) -> None:
        """Start a process beside the control plane (Karpenter: gpuaas/cluster/karpenter.py), recorded in state.json
        like the components: `stop`, `status` and `gpuaas cluster down` handle it (it is stopped first)."""
        self._spawn(name, argv, port, extra=False, env=env)

    def stop(self, grace: float = 5.0) -> None:
        """Stop every component (SIGTERM, then SIGKILL after `grace`); logs stay in the work directory."""
        if self.state is None and self.state_file.exists():
            self.state = ControlPlaneState.load(self.state_file)
        if self.state is None:
            return
        for name, added in list(self.state.components.items()):  # processes added beside the control plane first
            if name not in COMPONENTS:
                self._terminate(name, added, grace)
        for name in reversed(COMPONENTS):
            comp = self.state.components.get(name)
            if comp:
                self._terminate(name, comp, grace)
        self.state.components.clear()
        self.state_file.unlink(missing_ok=True)

    def attach_existing(self) -> bool:
        """Load state.json; True when at least one of its processes still runs."""
        if not self.state_file.exists():
            return False
        self.state = ControlPlaneState.load(self.state_file)
        return any(process_alive(c.pid, c.argv[0]) for c in self.state.components.values())

    def status(self) -> dict[str, dict[str, Any]]:
        assert self.state
        out = {}
        for name in (*COMPONENTS, *(c for c in self.state.components if c not in COMPONENTS)):
            comp = self.state.components.get(name)
            out[name] = {"pid": comp.pid if comp else None,
                         "running": bool(comp and process_alive(comp.pid, comp.argv[0])),
                         "port": comp.port if comp else None,
                         "log": comp.log if comp else None}
        return out

    def check_alive(self) -> None:
        """Raise, pointing at the log, if a component has died."""
        for name, st in self.status().items():
            if not st["running"]:
                raise ControlPlaneError(f"{name} is not running; see {st['log']}:\n{self.tail_log(name)}")

    def tail_log(self, component: str, lines: int = 30) -> str:
        path = self.logs / f"{component}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- process plumbing ----------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], port: int | None, append_log: bool = False,
               extra: bool = True, env: dict[str, str] | None = None) -> None:
        assert self.state
        if extra:  # (a restart reuses the recorded argv, extra arguments included)
            argv = argv + self.extra_args.get(name, [])
        log = self.logs / f"{name}.log"
        popen = spawn(argv, log, owned=self.owned, append=append_log, cwd=self.workdir, env=env)
        self._popen[name] = popen
        self.state.components[name] = ComponentState(pid=popen.pid, argv=argv, log=str(log), port=port)
        self.state.save(self.state_file)

    def _terminate(self, name: str, comp: ComponentState, grace: float = 5.0) -> None:
        terminate(comp.pid, comp.argv[0], popen=self._popen.pop(name, None), grace=grace)

    def _wait(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, popen in self._popen.items():
                if popen.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {popen.returncode} while waiting for {what}; "
                        f"log {self.logs / (name + '.log')}:\n{self.tail_log(name)}"
                    )
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.logs}")

    def _ssl_context(self, client: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        if client:
            ctx.load_cert_chain(self.pki.path(f"{client}.crt"), self.pki.path(f"{client}.key"))
        else:  # kube-controller-manager and kube-scheduler serve self-signed certificates
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _http_ok(self, url: str, client: str | None = None) -> bool:
        try:
            ctx = self._ssl_context(client) if url.startswith("https") else None
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError, OSError):
            return False

    def _kubectl_ok(self, *args: str) -> bool:
        return self.kubectl(*args, check=False).returncode == 0

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.tools.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, check=check, input=input)

    # ---- component flags -------------------------------------------------------------------------------------------
    def _etcd_argv(self, port: int, peer: int) -> list[str]:
        client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
        return [
            str(self.tools.etcd), "--name=node0", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=node0={peer_url}", "--listen-metrics-urls=", "--auto-compaction-retention=1",
            "--quota-backend-bytes=8589934592",
            "--unsafe-no-fsync=true",  # a throwaway test cluster: durability is not worth the fsync latency
            "--log-level=warn",
        ]

    def _apiserver_argv(self, ports: dict[str, int]) -> list[str]:
        p = self.pki
        return [
            str(self.tools.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{ports['etcd']}", "--etcd-prefix=/registry",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['kube-apiserver']}",
            f"--tls-cert-file={p.path('apiserver.crt')}", f"--tls-private-key-file={p.path('apiserver.key')}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-key-file={p.path('sa.pub')}",
            f"--service-account-signing-key-file={p.path('sa.key')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            # The `kubernetes` Service may not point at a loopback address, and nothing in-cluster dials it.
            "--endpoint-reconciler-type=none",
            # Aggregated APIs (custom.metrics.k8s.io) authenticate the apiserver by this front-proxy client cert.
            f"--requestheader-client-ca-file={p.front_proxy_ca_cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p.path('front-proxy-client.crt')}",
            f"--proxy-client-key-file={p.path('front-proxy-client.key')}",
            # Aggregator routing stays off: there is no kube-proxy, so a local aggregated API server (custom metrics)
            # is registered behind an ExternalName Service `localhost`, which only the cluster-IP resolver follows.
            # One client, hundreds of fake nodes: no inflight limits, as kwokctl's --disable-qps-limits does.
            "--max-requests-inflight=0", "--max-mutating-requests-inflight=0", "--enable-priority-and-fairness=false",
            "--profiling=false", "--v=1",
        ]

    def _kcm_argv(self, port: int, kubeconfig: Path) -> list[str]:
        p = self.pki
        return [
            str(self.tools.kube_controller_manager),
            f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--root-ca-file={p.ca_cert}", f"--service-account-private-key-file={p.path('sa.key')}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p.ca_cert}", f"--cluster-signing-key-file={p.path('ca.key')}",
            "--leader-elect=false", "--kube-api-qps=5000", "--kube-api-burst=10000",
            "--profiling=false", "--v=1",
        ]

    def _scheduler_argv(self, port: int, kubeconfig: Path) -> list[str]:
        return [
            str(self.tools.kube_scheduler), f"--config={self.workdir / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", "--profiling=false", "--v=1",
        ]

    def _kwok_argv(self, port: int, kubeconfig: Path) -> list[str]:
        return [
            str(self.tools.kwok), f"--kubeconfig={kubeconfig}", f"--config={self.workdir / 'kwok.yaml'}",
            "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40", f"--cidr={POD_CIDR}", "--node-ip=10.127.0.1",
            f"--server-address=127.0.0.1:{port}",
        ]
