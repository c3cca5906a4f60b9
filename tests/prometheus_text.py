"""Read Prometheus text exposition in tests, by the names that are on the wire.

``prometheus_client``'s parser validates the text but renames counter samples (it appends
``_total`` to Envoy's ``envoy_cluster_upstream_rq_xx``), while PromQL queries the wire names;
so the text is validated with the parser and read line by line.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Samples", "parse_exposition", "sample_value", "wire_names"]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Samples:
    """Every sample by (wire name, labels); raises ValueError when the text does not parse."""
    for _family in text_string_to_metric_families(text):
        pass
    samples: Samples = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not a sample line: {line!r}")
        name, labels, value = match.groups()
        key = (name, frozenset(_LABEL.findall(labels or "")))
        samples[key] = float(value)
    return samples


def sample_value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wire_names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}
