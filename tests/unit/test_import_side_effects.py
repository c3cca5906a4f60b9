"""Importing inferway changes nothing in the process: no environment variables, no logging
configuration, no signal handlers. Settings like these belong to the entry points (the CLI's
``main``, ``configure_logging``), so a program that embeds inferway keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, logging, os, pkgutil, signal, importlib

def state():
    loggers = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
    }
    root = logging.getLogger()
    return {
        "environ": dict(os.environ),
        "loggers": loggers,
        "root": [root.level, len(root.handlers), len(root.filters)],
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
    }

import inferway
before = state()
imported = []
for module in pkgutil.walk_packages(inferway.__path__, "inferway."):
    if "._generated" in module.name or module.name.startswith("inferway._xds_protos"):
        continue  # generated protobuf modules
    importlib.import_module(module.name)
    imported.append(module.name)
after = state()
print(json.dumps({"before": before, "after": after, "imported": imported}))
"""


def test_importing_every_module_changes_no_process_state() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "inferway.cli.main" in report["imported"] and len(report["imported"]) > 50
    before, after = report["before"], report["after"]
    changed_env = {
        k: after["environ"].get(k)
        for k in set(before["environ"]) | set(after["environ"])
        if before["environ"].get(k) != after["environ"].get(k)
    }
    assert changed_env == {}
    new_levels = {k: v for k, v in after["loggers"].items() if before["loggers"].get(k) != v}
    assert new_levels == {}
    assert after["root"] == before["root"]
    assert after["signals"] == before["signals"]
