"""``python -m build_support``: generate the git-ignored modules into a source checkout.

The same step the package build runs (``hatch_build.py``); for a checkout used straight from
``PYTHONPATH``. Needs the build requirements (xds-protos, grpcio-tools, mypy-protobuf)
importable.
"""

from __future__ import annotations

from pathlib import Path

from build_support.generate import generate

if __name__ == "__main__":
    for path in generate(Path(__file__).resolve().parents[1]):
        print(f"generated {path}")
