"""The picker process of ``picker: {process: sidecar}`` (sidecar.py): serves the pools each
stdin line names on ``HOST PORT``, says ``applied`` on stdout after each, answers a
``{"status": true}`` line with ``status <json>`` (its pools' endpoint stats and last pick, as
``GET /status`` shows them), and exits when stdin closes (the gateway stopped or died).

    python -m inferway.gateway.picker HOST PORT
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from inferway.backends.process_tuning import freeze_startup_heap
from inferway.gateway.picker.pools import PickerPools, Wanted
from inferway.gateway.picker.sidecar import STATUS_REQUEST
from inferway.policies.picker import Picker as PickerPolicy

__all__ = ["main", "parse_pools"]

log = logging.getLogger("inferway.gateway.picker.process")


def parse_pools(line: bytes, address: tuple[str, int]) -> Wanted:
    """``address``'s pools from one stdin line (sidecar.pools_line); raises ValueError
    naming what is wrong."""
    document = json.loads(line)
    pools = document.get("pools") if isinstance(document, dict) else None
    if not isinstance(pools, dict):
        raise ValueError(f"picker process: expected {{'pools': {{...}}}}, got {line[:80]!r}")
    return {
        address: {
            name: (PickerPolicy.model_validate(pool["settings"]), list(pool["endpoints"]))
            for name, pool in pools.items()
        }
    }


async def _serve(address: tuple[str, int]) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pools = PickerPools()
    frozen = False
    try:
        while line := await reader.readline():
            if line == STATUS_REQUEST:
                sys.stdout.write("status " + json.dumps(pools.status()) + "\n")
                sys.stdout.flush()
                continue
            try:
                await pools.serve(parse_pools(line, address))
            except (ValueError, KeyError, TypeError) as error:
                log.error("picker process: ignoring a bad pools line: %s", error)
                continue
            if not frozen:  # serving: a full collection of the start-up heap would stall picks
                freeze_startup_heap()
                frozen = True
            sys.stdout.write("applied\n")
            sys.stdout.flush()
    finally:
        await pools.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m inferway.gateway.picker HOST PORT", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="picker %(process)d: %(message)s")
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve((args[0], int(args[1]))))
    return uvloop.run(_serve((args[0], int(args[1]))))


if __name__ == "__main__":
    sys.exit(main())
