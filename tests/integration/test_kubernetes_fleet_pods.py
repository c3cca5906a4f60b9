"""The fleet overlay's pods, run on loopback the way the kubelet would run them (as
tests/integration/test_kubernetes_pods.py runs the CPU overlay's): a control-plane container
with its own arguments, the policy from the rendered ConfigMap and the admin token from its
Secret, then a gateway container (``inferway envoy``) with its own arguments, a request
through its Envoy, and its drain on SIGTERM. Only what a host cannot give is changed: bind
addresses and ports (loopback, free ports), mount points (folders), the backend's and the
control plane's DNS names, ``$(VAR)`` expanded from the downward API's values as the kubelet
does (pod name, pod IP, the zone label), the Secret's token, and the API server: the
in-memory one over HTTP (tests/kubernetes_api_http.py), reached through a kubeconfig instead
of the pod's service account. The backend is a stand-in answering the one request (the real
one is the CPU overlay test's)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferway.gateway.envoy_drain import DRAIN_LIMIT_S
from tests.envoy_process import free_port
from tests.integration.test_kubernetes_pods import INFER, Pod, start, stop, wait_until_ok
from tests.kubernetes_api_http import ServedApi
from tests.kustomize_build import build

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "kubernetes" / "fleet"
DOWNWARD = {  # what the downward API gives each field path in these pods
    "metadata.name": "{pod}",
    "status.podIP": "127.0.0.1",
    "metadata.labels['topology.kubernetes.io/zone']": "zone-a",
    "metadata.labels['topology.kubernetes.io/region']": "region-1",
}
SECRETS = {("inferway-admin-token", "token"): "fleet-token"}


class _Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/v2/health/ready" else 404, {})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(200, {"outputs": [{"name": "sum", "data": [11, 22]}]})


def expand(c: dict[str, Any], pod_name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The container with ``$(VAR)`` in its arguments replaced as the kubelet does, and its
    environment: downward-API fields and Secret keys (``SECRETS``) as their values."""
    values = {}
    for e in c.get("env", []):
        source = e["valueFrom"]
        if "fieldRef" in source:
            values[e["name"]] = DOWNWARD[source["fieldRef"]["fieldPath"]].format(pod=pod_name)
        else:
            ref = source["secretKeyRef"]
            values[e["name"]] = SECRETS[(ref["name"], ref["key"])]
    args = [re.sub(r"\$\((\w+)\)", lambda m: values[m[1]], a) for a in c["args"]]
    return {**c, "args": args, "env": []}, values


def options(args: list[str], replace: dict[str, str]) -> list[str]:
    """``args`` with each ``--name=value`` in ``replace`` replaced (each must be there)."""
    names = {a.split("=", 1)[0] for a in args}
    assert set(replace) <= names | {"--envoy-admin-port"}, set(replace) - names
    return [a for a in args if a.split("=", 1)[0] not in replace] + [
        f"{name}={value}" for name, value in replace.items()
    ]


def deployment(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [r for r in resources if r["kind"] == "Deployment" and r["metadata"]["name"] == name]
    return found


def test_the_fleet_pods_serve_a_request_and_a_gateway_pod_drains_on_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resources = build(FLEET)
    config_maps = {r["metadata"]["name"]: r["data"] for r in resources if r["kind"] == "ConfigMap"}
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    listener_port, xds_port, admin_port = free_port(), free_port(), free_port()
    policy = config_maps["inferway-policy"]["policy.yaml"]
    for old, new in (
        ("address: 0.0.0.0", "address: 127.0.0.1"),
        ("port: 10000", f"port: {listener_port}"),
        (
            "inferway-backend.inferway.svc.cluster.local:8000",
            f"localhost:{backend.server_address[1]}",
        ),
    ):
        assert policy.count(old) == 1, old
        policy = policy.replace(old, new)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with ServedApi(tmp_path) as served:
        plane = deployment(resources, "inferway-control-plane")
        (tmp_path / "cp").mkdir()
        cp_pod = Pod(
            plane["spec"]["template"]["spec"],
            {**config_maps, "inferway-policy": {"policy.yaml": policy}},
            tmp_path / "cp",
        )
        (main,) = plane["spec"]["template"]["spec"]["containers"]
        main, variables = expand(main, "inferway-control-plane-7d9f-abcde")
        main["args"] = options(
            main["args"],
            {"--host": "127.0.0.1", "--xds-port": str(xds_port), "--admin-port": str(admin_port)},
        )
        env = {**cp_pod.environment(main, {}), **variables, "KUBECONFIG": str(served.kubeconfig)}
        cp_log = tmp_path / "control-plane.log"
        control_plane = start(cp_pod.command(main), env, cp_log)
        try:
            admin = f"http://127.0.0.1:{admin_port}"
            wait_until_ok(admin + main["livenessProbe"]["httpGet"]["path"], control_plane, cp_log)
            # alive does not mean elected: the campaign is its own task, so wait for the lease
            lease = _lease_once_taken(served, control_plane, cp_log)
            assert lease["spec"]["holderIdentity"] == "inferway-control-plane-7d9f-abcde"
            run_gateway(resources, tmp_path / "gw", xds_port, listener_port, admin, cp_log)
        finally:
            stop(control_plane)
    backend.shutdown()


def _lease_once_taken(served: ServedApi, process: Any, log: Path) -> dict[str, Any]:
    """The loops' Lease once the control plane has taken it (10 s at most)."""
    key = ("leases", "inferway", "inferway-loops")
    deadline = time.monotonic() + 10.0
    while key not in served.api.objects:
        assert process.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no Lease taken in 10 s:\n" + log.read_text()[-2000:]
        time.sleep(0.05)
    lease: dict[str, Any] = served.api.objects[key]
    return lease


def run_gateway(
    resources: list[dict[str, Any]],
    root: Path,
    xds_port: int,
    listener_port: int,
    admin: str,
    cp_log: Path,
) -> None:
    gateway = deployment(resources, "inferway-gateway")
    spec = gateway["spec"]["template"]["spec"]
    root.mkdir()
    pod = Pod(spec, {}, root)
    (envoy,) = spec["containers"]
    envoy, variables = expand(envoy, "inferway-gateway-5c8b-xyz12")
    envoy["args"] = options(
        envoy["args"],
        {"--control-plane": f"127.0.0.1:{xds_port}", "--envoy-admin-port": str(free_port())},
    )
    log = root / "envoy.log"
    process = start(pod.command(envoy), {**pod.environment(envoy, {}), **variables}, log)
    try:
        url = f"http://127.0.0.1:{listener_port}/v2/models/add/infer"
        wait_until_ok(url, process, log, method="POST", json=INFER)
        headers = {"Authorization": "Bearer fleet-token"}
        deadline = time.monotonic() + 30
        while True:  # the Envoy's pushed stats name its node and the zone from its label
            status = httpx.get(f"{admin}/status", headers=headers, timeout=5).json()
            envoys = status["fleet"]["envoys"]
            if envoys:
                break
            assert time.monotonic() < deadline, f"no Envoy reported\n{cp_log.read_text()}"
            time.sleep(0.2)
        assert envoys[0]["node"] == "inferway-gateway-5c8b-xyz12" and envoys[0]["zone"] == "zone-a"
        assert status["fleet"]["leader"] == "inferway-control-plane-7d9f-abcde"
        # SIGTERM (after preStop's wait): served while the drain runs, then the listener
        # closes (readiness fails) and the container exits 0 within the grace period
        grace = spec["terminationGracePeriodSeconds"]
        pre_stop = envoy["lifecycle"]["preStop"]["sleep"]["seconds"]
        os.killpg(process.pid, signal.SIGTERM)
        sent = time.monotonic()
        answer = httpx.post(url, json=INFER, timeout=5)
        assert answer.status_code == 200, "a request during the drain failed"
        closed = None
        while process.poll() is None:
            if closed is None:
                try:
                    socket.create_connection(("127.0.0.1", listener_port), timeout=1).close()
                except OSError:
                    closed = time.monotonic() - sent
            assert time.monotonic() - sent < grace - pre_stop, "SIGKILL would have come first"
            time.sleep(0.05)
        exited = time.monotonic() - sent
        closed = exited if closed is None else closed  # closed at the exit, at the latest
        assert process.returncode == 0, log.read_text()
        assert closed is not None and closed <= DRAIN_LIMIT_S, f"listener open {closed}s"
        assert exited <= DRAIN_LIMIT_S + 5 + 1, f"exited after {exited:.1f}s"
    finally:
        if process.poll() is None:
            stop(process)
