"""Generated protobuf code loads on every protobuf release the metadata allows (issue 12,
docs/install.md): protobuf refuses gencode newer than its runtime, so no generated module (the
OIP stubs, the private Envoy API copy) may carry a gencode version above the ``protobuf>=``
floor. A few of xds-protos' modules predate the version line (older gencode, no runtime
check); they are allowed.
tests/wheel_install/test_install.py imports them under that floor in a fresh venv."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.wheel_install.trees import protobuf_floor

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (ROOT / "inferway" / "_xds_protos", ROOT / "inferway" / "backends" / "protocol")
_GENCODE = re.compile(r"^# Protobuf Python Version: (\S+)$", re.MULTILINE)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_no_generated_module_is_newer_than_the_floor() -> None:
    versions: Counter[str] = Counter()
    for folder in GENERATED:
        for module in folder.rglob("*_pb2.py"):
            found = _GENCODE.findall(module.read_text(encoding="utf-8"))
            assert len(found) <= 1, module
            versions[found[0] if found else "none"] += 1
    floor = protobuf_floor()
    assert versions[floor] > 100, versions  # the generated modules are there, built at the floor
    newer = {v for v in versions if v != "none" and _release(v) > _release(floor)}
    assert not newer, f"gencode {sorted(newer)} needs a newer protobuf than >={floor}: {versions}"
