"""``inferway optimize`` on the demo models with the real ONNX Runtime tools: FP16, dynamic and
static INT8 (per-channel), ORT graph optimisation; the accuracy gate accepting what is within
tolerance and rejecting a model whose range INT8 cannot represent -- which ``inferway serve``
then does not load while the version before it keeps serving."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from inferway.backends.models.rejection import REJECTED_FILE
from inferway.backends.runners.tensorrt import tensorrt_unavailable_reason
from inferway.cli.main import app
from inferway.devtools.demo_models import write_demo_repository
from inferway.policies.rollouts import Rollout
from inferway.tools.optimize.int8_weights import host_weight_range
from inferway.tools.optimize.report import REPORT_FILE
from tests.envoy_process import free_port
from tests.serve_process import wait_serve_ready

pytestmark = pytest.mark.integration

SIZES = (32, 64, 64, 10)
MAX_BATCH = 16
CONFIG = {"provider": "cpu", "batching": {"max_batch_size": MAX_BATCH}}


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return write_demo_repository(tmp_path / "models", "demo", (1,), sizes=SIZES, config=CONFIG)


def _optimize(*args: str) -> tuple[int, dict, str]:
    result = CliRunner().invoke(app, ["optimize", *args, "--bench-runs", "3", "-o", "json"])
    document = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    return result.exit_code, document, result.output


def _ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


def _initializer_types(path: Path) -> set[int]:
    return {t.data_type for t in onnx.load(str(path)).graph.initializer}


def test_fp16_writes_a_new_validated_version_and_its_report(demo: Path) -> None:
    original = (demo / "1" / "model.onnx").read_bytes()
    code, report, output = _optimize(str(demo), "--fp16")
    assert code == 0, output
    new = demo / "2"
    assert (
        report["status"] == "accepted" and report["version"] == "2" and report["steps"] == ["fp16"]
    )
    assert report["int8_weights"] is None  # no INT8 step
    assert json.loads((new / REPORT_FILE).read_text()) == report  # the JSON beside the model
    assert not (new / REJECTED_FILE).exists()
    assert TensorProto.FLOAT16 in _initializer_types(new / "model.onnx")
    assert (demo / "1" / "model.onnx").read_bytes() == original
    assert yaml.safe_load((new / "config.yaml").read_text()) == CONFIG  # its own copy
    assert not [p for p in demo.iterdir() if p.name.startswith(".")]  # no staging left

    validation = report["validation"]
    assert validation["rows"] >= 1000 and validation["failures"] == []
    rows = validation["rows_by_category"]
    assert rows["batch-size"] == sum(range(1, MAX_BATCH + 1))  # every batch size once
    assert {"random", "uniform", "zeros", "extremes", "dtype-edges"} <= set(rows)
    (y,) = validation["outputs"]
    assert 0 < y["deviation_percent"] < 0.5 and y["max_abs_error"] > 0
    assert y["top1_agreement"] > 0.99
    perf = report["performance"]
    assert perf["before"]["latency_ms_p50"] > 0 and perf["after"]["throughput_rows_s"] > 0
    assert report["size_bytes"]["ratio"] == pytest.approx(0.5, abs=0.05)
    (rollout,) = report["rollout"]["rollouts"]
    Rollout.model_validate(rollout)
    assert (rollout["stable"], rollout["canary"]) == ("demo-v1", "demo-v2")


def test_int8_dynamic_quantises_weights_per_channel(demo: Path) -> None:
    code, report, output = _optimize(str(demo), "--int8", "--tolerance", "5%")
    assert code == 0, output
    assert report["steps"] == ["int8-dynamic"] and report["tolerance_percent"] == 5
    model = onnx.load(str(demo / "2" / "model.onnx"))
    scales = [t for t in model.graph.initializer if t.name.endswith("_scale")]
    assert TensorProto.INT8 in {t.data_type for t in model.graph.initializer}
    assert any(numpy_helper.to_array(s).size > 1 for s in scales)  # one scale per channel
    assert report["size_bytes"]["ratio"] < 0.4
    assert 0 < report["validation"]["outputs"][0]["deviation_percent"] < 5
    # 7-bit weights exactly where this CPU's ORT INT8 kernels would saturate 8-bit ones
    assert report["int8_weights"] == host_weight_range(requested=None).as_dict()
    assert _weights_fit_7_bits(demo / "2") is report["int8_weights"]["reduce_range"]


def _weights_fit_7_bits(version: Path) -> bool:
    model = onnx.load(str(version / "model.onnx"))
    weights = [
        numpy_helper.to_array(t)
        for t in model.graph.initializer
        if t.data_type == TensorProto.INT8 and t.name.endswith("_quantized")
    ]
    assert weights, "no INT8 weights in the model"
    return max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64


def test_int8_reduce_range_on_and_off_reach_the_quantiser(demo: Path) -> None:
    """``on`` keeps the weights within 7 bits (-64..64); ``off`` uses all 8 (up to ±127)."""
    for choice, version, seven_bits in (("on", "2", True), ("off", "3", False)):
        _code, report, output = _optimize(
            str(demo), "--int8", "--int8-reduce-range", choice, "--tolerance", "50%"
        )
        assert report["version"] == version, output
        assert report["int8_weights"] == {
            "reduce_range": seven_bits,
            "reason": f"--int8-reduce-range {choice}",
        }
        assert _weights_fit_7_bits(demo / version) is seven_bits


def test_int8_static_on_generated_calibration_then_graph_optimised(demo: Path) -> None:
    code, report, output = _optimize(
        str(demo), "--int8", "--int8-mode", "static", "--graph", "--tolerance", "5%"
    )
    assert code == 0, output
    assert report["steps"] == ["int8-static", "graph"]
    ops = _ops(demo / "2" / "model.onnx")
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops  # QDQ, kept by ORT's graph
    assert "QGemm" in ops or "QLinearMatMul" in ops  # ...which fused the quantised Gemm


def test_static_int8_calibrated_on_typical_data_is_rejected_naming_the_inputs_that_broke_it(
    demo: Path, tmp_path: Path
) -> None:
    data = np.random.default_rng(7).standard_normal((600, SIZES[0])).astype(np.float32)
    np.savez(tmp_path / "calibration.npz", x=data)
    args = [str(demo), "--int8", "--calibration", str(tmp_path / "calibration.npz")]
    code, report, output = _optimize(*args, "--tolerance", "5%")
    assert code == 1, output
    assert report["steps"] == ["int8-static"] and report["status"] == "rejected"
    (y,) = report["validation"]["outputs"]
    assert report["validation"]["rows_by_category"]["calibration"] == 600
    # Within tolerance on the data it was calibrated on; the domain's extremes (every input at
    # the calibration's min or max) drive activations past the calibrated ranges, and clip.
    assert y["deviation_percent_by_category"]["calibration"] < 5
    assert y["deviation_percent_by_category"]["extremes"] > 5
    assert "worst on extremes inputs" in report["reasons"][0]
    assert (demo / "2" / REJECTED_FILE).is_file()


def test_versions_are_never_overwritten_and_bad_input_is_refused(
    demo: Path, tmp_path: Path
) -> None:
    assert _optimize(str(demo), "--fp16")[0] == 0
    code, report, _ = _optimize(str(demo / "1"), "--fp16")  # a version directory works too
    assert code == 0 and report["version"] == "3" and report["source_version"] == "1"
    np.savez(tmp_path / "wrong.npz", nope=np.zeros((4, SIZES[0]), np.float32))
    code, _, output = _optimize(str(demo), "--int8", "--calibration", str(tmp_path / "wrong.npz"))
    assert code == 1 and "arrays must be exactly the model inputs ['x']" in output
    code, _, output = _optimize(str(demo), "--fp16", "--int8")
    assert code == 1 and "exactly one of --fp16 or --int8" in output
    code, _, output = _optimize(str(tmp_path / "nothing"), "--fp16")
    assert code == 1 and "not a model directory" in output
    assert sorted(p.name for p in demo.iterdir()) == ["1", "2", "3"]


@pytest.mark.skipif(tensorrt_unavailable_reason() is None, reason="TensorRT is present here")
def test_tensorrt_without_tensorrt_says_it_needs_it(demo: Path) -> None:
    code, _, output = _optimize(str(demo), "--fp16", "--tensorrt")
    assert code == 2 and "--tensorrt needs TensorRT" in output
    assert sorted(p.name for p in demo.iterdir()) == ["1"]


def _write_wide_range_model(path: Path) -> None:
    """y = x @ (S + B) - x @ B with B's first row 10,000 and S ~ N(0, 1): y = x @ S, but the
    products span 10^4 while the answer is ~1, more than INT8's 256 levels (or FP16's 11
    bits) hold."""
    rng = np.random.default_rng(0)
    small = rng.standard_normal((4, 4)).astype(np.float32)
    big = np.zeros((4, 4), np.float32)
    big[0] = 1e4
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"]),
            helper.make_node("MatMul", ["x", "w2"], ["b"]),
            helper.make_node("Sub", ["a", "b"], ["y"]),
        ],
        "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(small + big, "w1"), numpy_helper.from_array(big, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def test_a_range_int8_cannot_hold_is_rejected_and_serve_does_not_load_it(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _write_wide_range_model(root / "wide" / "1" / "model.onnx")
    (root / "wide" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    code, report, output = _optimize(str(root / "wide"), "--int8")
    assert code == 1, output
    assert report["status"] == "rejected" and report["validation"]["rows"] >= 1000
    assert report["validation"]["outputs"][0]["deviation_percent"] > 5
    assert "exceeds the tolerance 0.5%" in report["reasons"][0]
    marker = json.loads((root / "wide" / "2" / REJECTED_FILE).read_text())
    assert marker["rejected"] is True and "exceeds the tolerance" in marker["reason"]
    text = CliRunner().invoke(app, ["optimize", str(root / "wide"), "--fp16", "--bench-runs", "2"])
    assert text.exit_code == 1 and "REJECTED" in text.output  # FP16 cannot hold it either

    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "inferway.cli.main", "serve", str(root)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{http_port}"
    try:
        wait_serve_ready(proc, base)
        index = httpx.post(f"{base}/v2/repository/index", json={}, timeout=5).json()
        states = {e["version"]: (e["state"], e.get("reason", "")) for e in index}
        assert states["1"] == ("READY", "")
        for version in ("2", "3"):
            state, reason = states[version]
            assert state == "UNAVAILABLE" and "rejected by the accuracy gate" in reason
        body = {
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
        }
        answer = httpx.post(f"{base}/v2/models/wide/infer", json=body, timeout=5)
        assert answer.status_code == 200 and answer.json()["model_version"] == "1", answer.text
        refused = httpx.post(f"{base}/v2/models/wide/versions/2/infer", json=body, timeout=5)
        assert refused.status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "rejected by the accuracy gate" in out
