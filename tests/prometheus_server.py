"""A real Prometheus for tests (Debian's ``prometheus`` binary): a temp config scraping the
given targets every second, a temp TSDB, a free loopback port, polled until ``/-/ready``
answers, always killed.

    async with PrometheusServer(tmp_path, targets=["127.0.0.1:9901"]) as prometheus:
        prometheus.url  # http://127.0.0.1:<port>
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx
import yaml

from tests.components import require_binary
from tests.envoy_process import free_port

__all__ = ["PrometheusServer"]


class PrometheusServer:
    def __init__(
        self, workdir: Path, *, targets: list[str], metrics_path: str = "/stats/prometheus"
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "envoy",
                    "metrics_path": metrics_path,
                    "scrape_interval": "1s",
                    "scrape_timeout": "900ms",
                    "static_configs": [{"targets": targets}],
                }
            ],
        }
        self._process: subprocess.Popen[bytes] | None = None
        self._log = workdir / "prometheus.log"

    async def start(self, timeout: float = 20.0) -> None:
        prometheus = require_binary("prometheus", "a real Prometheus server in a test")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self._config))
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(trust_env=False, timeout=1.0) as client:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RuntimeError(f"prometheus exited: {self.log_tail()}")
                try:
                    if (await client.get(f"{self.url}/-/ready")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"prometheus not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self._log.read_text(errors="replace")[-2000:] if self._log.exists() else ""

    async def query(self, promql: str) -> list[dict[str, object]]:
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            response = await client.get(f"{self.url}/api/v1/query", params={"query": promql})
        body = response.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)

    async def __aenter__(self) -> PrometheusServer:
        try:
            await self.start()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
