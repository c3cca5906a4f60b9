"""``inferway optimize --tensorrt`` on a real GPU: FP16 and INT8 (Q/DQ) engines built by the
serving runner into the new version's directory, validated against the FP32 original."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from inferway.backends.runners.tensorrt import tensorrt_unavailable_reason
from inferway.cli.main import app
from inferway.devtools.demo_models import write_demo_repository

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        tensorrt_unavailable_reason() is not None,
        reason=f"native TensorRT unusable: {tensorrt_unavailable_reason()}",
    ),
]

SIZES = (256, 1024, 1024, 10)


@pytest.mark.parametrize(("precision", "tolerance"), [("--fp16", "0.5%"), ("--int8", "5%")])
def test_tensorrt_engine_version_is_built_validated_and_configured(
    tmp_path: Path, precision: str, tolerance: str
) -> None:
    demo = write_demo_repository(
        tmp_path, "demo", (1,), sizes=SIZES, config={"batching": {"max_batch_size": 32}}
    )
    args = ["optimize", str(demo), precision, "--tensorrt", "--tolerance", tolerance, "-o", "json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["steps"][-1] == "tensorrt" and report["validation"]["rows"] >= 1000
    config = yaml.safe_load((demo / "2" / "config.yaml").read_text())
    assert config["provider"] == "tensorrt" and config["fp16"] is True
    assert list((demo / "2" / ".trt_cache").glob("*.engine"))  # built once, ships with it
