"""The control-plane process the keeper runs: ``python -m inferway.gateway.control_plane_main``.

It reads its :class:`ControlPlaneSpec` (pickled) from stdin, serves the gateway without an
Envoy of its own (the keeper owns Envoy), and writes ``ready`` on stdout once the xDS server
and the admin API are up: the keeper's only channel to it besides the exit code.
"""

from __future__ import annotations

import pickle
import sys

from inferway.console import configure_logging
from inferway.gateway.control_plane_process import READY_LINE, ControlPlaneSpec
from inferway.gateway.foreground import run_event_loop, serve_gateway
from inferway.gateway.runtime import Gateway

__all__ = ["main"]


def _say_ready(_gateway: Gateway) -> None:
    sys.stdout.write(READY_LINE)
    sys.stdout.flush()


def main() -> None:
    spec = pickle.load(sys.stdin.buffer)
    if not isinstance(spec, ControlPlaneSpec):
        raise SystemExit(f"expected a ControlPlaneSpec on stdin, got {type(spec).__name__}")
    configure_logging(spec.log_level, spec.log_format)
    if spec.otlp_endpoint:
        from inferway.observability.otel import setup_tracing

        setup_tracing("inferway-control-plane", spec.otlp_endpoint)
    raise SystemExit(run_event_loop(serve_gateway(spec.options, on_ready=_say_ready)))


if __name__ == "__main__":
    main()
