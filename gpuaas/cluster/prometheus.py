"""A real Prometheus for the local cluster: scrapes what the tests and demos run on loopback (the load replayer).

    prom = PrometheusServer(workdir, targets=["127.0.0.1:9100"], scrape_interval="1s").start()
    prom.url            # http://127.0.0.1:<port>
    prom.stop()         # SIGTERM, SIGKILL after the grace period; logs stay in <workdir>/logs/prometheus.log

The configuration is generated into <workdir>/prometheus.yml, the TSDB goes to <workdir>/prometheus-data. The process
is started and stopped the way controlplane.py starts its components (own session, dies with the Python process that
owns it, pid checked against its binary before any signal).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from .controlplane import ControlPlaneError
from .process import answers_ok, free_port, process_alive, spawn, terminate
from .tools import Tools


class PrometheusServer:
    def __init__(self, workdir: Path, *, targets: list[str], scrape_interval: str = "15s",
                 tools: Tools | None = None, job: str = "gpuaas-loadgen", owned: bool = True,
                 scrape_configs: list[dict] | None = None):
        self.workdir = Path(workdir).resolve()
        self.targets = targets
        self.scrape_configs = list(scrape_configs or [])  # more jobs, as they stand in prometheus.yml
        self.scrape_interval = scrape_interval
        self.job = job
        self.owned = owned
        binary = (tools or Tools.locate()).prometheus
        if binary is None:
            raise ControlPlaneError("prometheus is not installed: run scripts/setup.sh (Debian package prometheus)")
        self.binary = Path(binary)
        self.port: int | None = None
        self.popen: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        assert self.port, "prometheus not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "logs" / "prometheus.log"

    @property
    def config_file(self) -> Path:
        return self.workdir / "prometheus.yml"

    def write_config(self) -> Path:
        jobs = [{
            "job_name": self.job,
            "scrape_interval": self.scrape_interval,
            "scrape_timeout": self.scrape_interval if self._seconds(self.scrape_interval) < 10 else "10s",
            # The replayer exports one series per pod with the pod's own namespace and pod labels: keep them.
            "honor_labels": True,
            "static_configs": [{"targets": list(self.targets)}],
        }] if self.targets else []
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": jobs + self.scrape_configs,
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.config_file

    @staticmethod
    def _seconds(duration: str) -> float:
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        for unit in ("ms", "s", "m", "h"):
            if duration.endswith(unit):
                return float(duration[: -len(unit)]) * units[unit]
        raise ValueError(f"not a duration: {duration}")

    def start(self, timeout: float = 60.0, port: int | None = None) -> PrometheusServer:
        self.write_config()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.port = port or self.port or free_port()
        argv = [str(self.binary), f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
                "--log.level=warn"]
        self.popen = spawn(argv, self.log, owned=self.owned, append=True, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise ControlPlaneError(f"prometheus exited with code {self.popen.returncode}; see {self.log}")
            if self.ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise ControlPlaneError(f"prometheus not ready after {timeout:.0f}s; see {self.log}")

    def ready(self) -> bool:
        return answers_ok(f"{self.url}/-/ready")

    @property
    def running(self) -> bool:
        return self.popen is not None and process_alive(self.popen.pid, str(self.binary))

    def pause(self) -> None:
        """SIGSTOP: Prometheus still accepts connections but answers nothing (a hung server)."""
        assert self.popen
        os.killpg(self.popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.popen
        os.killpg(self.popen.pid, signal.SIGCONT)

    def stop(self, grace: float = 5.0) -> None:
        popen, self.popen = self.popen, None
        if popen is not None:
            terminate(popen.pid, str(self.binary), popen=popen, grace=grace)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
