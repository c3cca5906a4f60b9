"""One request's trace as a tree: Envoy span -> backend request span -> batch span.

Batch spans are roots of their own traces (one batch serves many requests, from many traces)
and *link* to every request span they served; the tree hangs each linked batch span under the
request span it served, marked as a link, so one request's whole path reads top to bottom.
Pure functions over :class:`ReceivedSpan` lists; :func:`render_trace_tree` makes a rich Tree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.tree import Tree

from inferway.devtools.otlp_receiver import ReceivedSpan

__all__ = [
    "REQUEST_ID_KEYS",
    "TraceNode",
    "build_trace_tree",
    "find_trace_id",
    "render_trace_tree",
]

REQUEST_ID_KEYS = ("request_id", "guid:x-request-id")
"""Span attributes that carry x-request-id (inferway's tag and Envoy's built-in one)."""


@dataclass
class TraceNode:
    span: ReceivedSpan
    linked: bool = False
    """True for a span attached through a link (a batch span), not a parent/child edge."""
    children: list[TraceNode] = field(default_factory=list)


def find_trace_id(spans: Iterable[ReceivedSpan], request_id: str) -> str | None:
    """The trace id of the spans tagged with x-request-id ``request_id``, if any."""
    for span in spans:
        if any(span.attributes.get(key) == request_id for key in REQUEST_ID_KEYS):
            return span.trace_id
    return None


def build_trace_tree(spans: Sequence[ReceivedSpan], trace_id: str) -> list[TraceNode]:
    """The roots of trace ``trace_id`` (normally one), children ordered by start time.

    A span whose parent never arrived is shown as a root rather than dropped. Spans from other
    traces that link to a span of this trace are attached under it with ``linked=True``."""
    own = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
    nodes = {s.span_id: TraceNode(s) for s in own}
    roots: list[TraceNode] = []
    for span in own:
        parent = nodes.get(span.parent_span_id) if span.parent_span_id else None
        (parent.children if parent is not None else roots).append(nodes[span.span_id])
    linkers = sorted(
        (s for s in spans if s.trace_id != trace_id and s.links), key=lambda s: s.start_ns
    )
    for span in linkers:
        for link_trace, link_span in span.links:
            if link_trace == trace_id and link_span in nodes:
                nodes[link_span].children.append(TraceNode(span, linked=True))
    for node in nodes.values():
        node.children.sort(key=lambda n: n.span.start_ns)
    return roots


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _label(node: TraceNode, parent: ReceivedSpan | None) -> str:
    span = node.span
    service = f"[cyan]{span.service or '?'}[/cyan]"
    head = f"{service} [bold]{span.name}[/bold]  {_ms(span.duration_s)}"
    if node.linked:
        head = f"[magenta]↪ linked[/magenta] {head}"
    details: list[str] = []
    attrs = span.attributes
    for key in ("http.status_code", "inferway.status_code", "upstream_cluster"):
        if key in attrs:
            details.append(f"{key.split('.')[-1]}={attrs[key]}")
    if "inferway.model_version" in attrs:
        details.append(f"version={attrs['inferway.model_version']}")
    if node.linked and "batch.requests" in attrs:
        details.append(
            f"batch of {attrs['batch.requests']} request(s), {attrs.get('batch.size')} row(s)"
        )
        if parent is not None:
            details.append(f"queue wait {_ms(max(span.start_ns - parent.start_ns, 0) / 1e9)}")
        details.append(f"compute {_ms(span.duration_s)}")
    request_id = next((attrs[k] for k in REQUEST_ID_KEYS if k in attrs), None)
    if request_id and not node.linked:
        details.append(f"request_id={request_id}")
    if span.status_error:
        details.append("[red]error[/red]")
    return head + (f"  [dim]{' · '.join(details)}[/dim]" if details else "")


def render_trace_tree(roots: Sequence[TraceNode], title: str | None = None) -> Tree:
    """A rich Tree of the trace: service, span name, duration, and the useful attributes
    (status, served version, request id; batch size, queue wait and compute for batches)."""
    trace_id = roots[0].span.trace_id if roots else "?"
    tree = Tree(title or f"trace [bold]{trace_id}[/bold]")

    def add(branch: Tree, node: TraceNode, parent: ReceivedSpan | None) -> None:
        child = branch.add(_label(node, parent))
        for grandchild in node.children:
            add(child, grandchild, node.span)

    for root in roots:
        add(tree, root, None)
    return tree
