"""What the demo prints besides progress lines: the split tables and the "keeps running" panel.

Kept apart from the orchestration in ``demo.py`` so the text can be tested without starting
Envoy: the panel's commands must work when pasted as printed.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from inferway.devtools.demo_backend import DEMO_MODEL
from inferway.devtools.demo_mtls import CurlTls
from inferway.devtools.demo_traffic import build_infer_request, close_to_expected
from inferway.gateway.runtime import Gateway
from inferway.policies import Policy

__all__ = ["build_keep_running_text", "build_split_table", "keep_running"]


def build_split_table(title: str, seen: Counter[str], policy: Policy, seconds: float) -> Table:
    total = sum(seen.values())
    expected = {b.service.removeprefix("model-"): b.weight for b in policy.routes[0].backends}
    table = Table(title=title, title_justify="left")
    table.add_column("version")
    table.add_column("policy", justify="right")
    table.add_column("observed", justify="right")
    table.add_column("requests", justify="right")
    table.add_column("", justify="center")
    for version in sorted(set(expected) | set(seen)):
        want = expected.get(version)
        got = 100.0 * seen.get(version, 0) / total if total else 0.0
        mark = (
            "[green]✓[/green]"
            if want is not None and close_to_expected(got, want, total)
            else "[red]✗[/red]"
        )
        table.add_row(
            version,
            "-" if want is None else f"{want:g}%",
            f"{got:.1f}%",
            str(seen.get(version, 0)),
            mark,
        )
    table.caption = f"{total} requests in {seconds:.2f}s ({total / max(seconds, 1e-9):.0f} req/s)"
    return table


def build_keep_running_text(
    url: str,
    admin_url: str,
    policy_path: Path,
    request_path: Path,
    curl_tls: CurlTls | None = None,
) -> str:
    """What the "keeps running" panel says: commands that work as printed (with ``--mtls``,
    the curl presents the client certificate the demo minted and trusts its CA)."""
    tls = ""
    if curl_tls is not None:
        tls = (
            f"--cacert {curl_tls.ca} --cert {curl_tls.certificate} "
            f"--key {curl_tls.private_key} \\\n            "
        )
    return (
        f"try it:   curl {tls}{url}/v2/models/{DEMO_MODEL}/infer -d @{request_path}\n"
        f"status:   inferway status --admin {admin_url}\n"
        f"          (JSON: curl {admin_url}/status)\n"
        f"edit:     {policy_path}  (saved edits apply live; invalid ones are refused)\n"
        "Ctrl-C to stop"
    )


async def keep_running(
    console: Console,
    url: str,
    gateway: Gateway,
    policy_path: Path,
    curl_tls: CurlTls | None = None,
) -> None:
    request_path = policy_path.with_name("request.json")
    request_path.write_text(json.dumps(build_infer_request(random.Random(0))), encoding="utf-8")
    text = build_keep_running_text(url, gateway.admin.url, policy_path, request_path, curl_tls)
    console.print(Panel.fit(Text(text), title="the demo keeps running", border_style="cyan"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
