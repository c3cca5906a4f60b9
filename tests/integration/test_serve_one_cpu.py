"""``inferway serve`` started on one CPU (as ``taskset -c N`` or a one-CPU container would)
computes its CPU model's batches on the event loop's thread, and says so in its metrics; with
two CPUs the same model's batches go to the worker thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from inferway.devtools.demo_models import mlp_reference, write_demo_repository
from tests.envoy_process import free_port
from tests.prometheus_text import parse_exposition, sample_value
from tests.serve_process import wait_serve_ready

pytestmark = pytest.mark.integration

SIZES = (1024, 4096, 4096, 16)
"""About 21 million multiply-adds a row (an 84 MB model)."""
ROWS = 32
"""A request's rows: its batch takes about 15-20 ms on one of the CI's cores, inside the 5-50 ms
band in which a batch computes on the loop on one CPU, with room for a core 2.5x faster or
slower."""
REQUESTS = 8


def _serve_and_count(models: Path, cpus: set[int] | None) -> tuple[float, str]:
    """Serve ``models`` with the given affinity, send REQUESTS one at a time (answers checked),
    and return the model's ``inferway_backend_batches_on_loop`` and what the server printed."""
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", "--model-repository"]
    command += [str(models), "--http-port", str(http_port), "--grpc-port", str(grpc_port)]

    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pin
    )
    try:
        base = f"http://127.0.0.1:{http_port}"
        wait_serve_ready(proc, base)
        with httpx.Client(base_url=base, timeout=10) as client:
            for i in range(REQUESTS):
                x = np.random.default_rng(i).standard_normal((ROWS, SIZES[0])).astype(np.float32)
                body = {
                    "inputs": [
                        {"name": "x", "shape": [ROWS, SIZES[0]], "datatype": "FP32"}
                        | {"data": x.ravel().tolist()}
                    ]
                }
                answer = client.post("/v2/models/demo/infer", json=body)
                assert answer.status_code == 200, answer.text
                (output,) = answer.json()["outputs"]
                expected = mlp_reference(x, sizes=SIZES, seed=0)
                got = np.array(output["data"], np.float32).reshape(expected.shape)
                np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
            samples = parse_exposition(client.get("/metrics").text)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
    return sample_value(samples, "inferway_backend_batches_on_loop", model="demo"), out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one-cpu") / "models"
    write_demo_repository(root, sizes=SIZES, config={"provider": "cpu"})
    return root


def test_on_one_cpu_the_batches_run_on_the_loop_thread(models: Path) -> None:
    one = {min(os.sched_getaffinity(0))}
    on_loop, out = _serve_and_count(models, one)
    # the first batch teaches the cost model (and the allowance is read once a second)
    assert on_loop >= REQUESTS - 2
    assert "CPUs  1 usable (affinity 1, " in out
    assert "compute on the event loop's thread" in out


def test_on_two_cpus_the_same_batches_run_on_the_worker_thread(models: Path) -> None:
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip(f"this machine lets the tests use one CPU only ({sorted(cpus)})")
    on_loop, out = _serve_and_count(models, set(sorted(cpus)[:2]))
    assert on_loop == 0
    assert "(affinity 2, " in out and "event loop's thread" not in out
