"""Cost and utilisation, read where they are: a Prometheus (``--prometheus URL``: every
``inferway_cost_*`` series and every series whose name says utilisation) or else the
gateway's admin API ``/metrics`` (the same names in the Prometheus text it serves). Nothing
found is reported as "not available", never as a failure: a gateway without the cost
metrics is still verifiable."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "COST_PATTERN",
    "UTILIZATION_PATTERN",
    "CostReport",
    "Sample",
    "read_cost",
]

COST_PATTERN = r"inferway_cost_.*"
UTILIZATION_PATTERN = r".*utili[sz]ation.*"
_SELECTOR = f'{{__name__=~"{COST_PATTERN}|{UTILIZATION_PATTERN}"}}'


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "labels": self.labels, "value": self.value}


@dataclass
class CostReport:
    source: str | None
    """Where the samples came from (None: nowhere to read)."""
    cost: list[Sample] = field(default_factory=list)
    utilization: list[Sample] = field(default_factory=list)
    note: str = ""
    min_utilization: float | None = None
    """The bar (0..1), when one was asked for."""

    @property
    def mean_utilization(self) -> float | None:
        values = [s.value for s in self.utilization]
        return sum(values) / len(values) if values else None

    @property
    def ok(self) -> bool | None:
        """None when no bar applies or nothing could be measured (not a failure)."""
        mean = self.mean_utilization
        if self.min_utilization is None or mean is None:
            return None
        return mean >= self.min_utilization


def _split(samples: list[Sample], report: CostReport) -> CostReport:
    for sample in samples:
        target = report.cost if re.fullmatch(COST_PATTERN, sample.name) else report.utilization
        target.append(sample)
    if not samples:
        report.note = "not available: no inferway_cost_* or utilisation series"
    return report


def _from_prometheus(url: str) -> list[Sample]:
    response = httpx.get(url.rstrip("/") + "/api/v1/query", params={"query": _SELECTOR}, timeout=10)
    response.raise_for_status()
    out = []
    for item in response.json()["data"]["result"]:
        labels = dict(item["metric"])
        name = labels.pop("__name__")
        out.append(Sample(name, labels, float(item["value"][1])))
    return out


def _from_admin(url: str) -> list[Sample]:
    response = httpx.get(url.rstrip("/") + "/metrics", timeout=10)
    response.raise_for_status()
    pattern = re.compile(f"{COST_PATTERN}|{UTILIZATION_PATTERN}")
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if pattern.fullmatch(s.name)
    ]


def read_cost(
    prometheus: str | None, admin: str | None, *, min_utilization: float | None = None
) -> CostReport:
    """Samples from ``prometheus`` when given, else from ``admin``; an unreachable source
    or one without the series gives a report that says so."""
    for source, read in ((prometheus, _from_prometheus), (admin, _from_admin)):
        if source is None:
            continue
        report = CostReport(source, min_utilization=min_utilization)
        try:
            return _split(read(source), report)
        except (httpx.HTTPError, ValueError, KeyError) as error:
            report.note = f"not available: {source}: {error}"
            return report
    return CostReport(
        None, note="not available: give --prometheus or --admin", min_utilization=min_utilization
    )
