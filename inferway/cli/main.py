"""The ``inferway`` command: validate, render and run a policy; ask a gateway for its status;
verify a live gateway against its policy; run the demo; serve models (the backend's
``serve``, when installed), optimize and encrypt them.

Operator conventions (docs/cli.md): ``--version``; ``-o text|json|yaml`` on status, render,
validate and verify; ``--log-format json|text`` on run and serve; shell completion; exit codes
0 ok, 1 invalid or refused (errors as ``file:line:column: path: message``, one per line, on
stderr), 2 usage, 3 the admin API unreachable, 4 a verify bar missed (``exit_codes.py``).

Every command's module is imported only when that command runs (``cli/lazy.py``): operators
and scripts poll ``status``, ``scale status`` and ``rollout status``, which must not load the
gateway, pydantic policies, gRPC or onnxruntime to answer (bench/cli_startup.py). This module
imports only typer and the light conventions; ``COMMANDS`` lists where each command lives.
"""

from __future__ import annotations

import typer

from inferway.cli.conventions import VersionOption, run_app
from inferway.cli.lazy import LazyCommand, lazy_group_class

__all__ = ["COMMANDS", "app", "main"]

COMMANDS: tuple[LazyCommand, ...] = (
    LazyCommand(
        "validate",
        "inferway.cli.policy_commands:validate",
        "Check policies as ``run`` would load them (schema, references, endpoints "
        "file,\n"
        "certificate files, Envoy consistency; with --envoy also the real Envoy's "
        "own check); print\n"
        "every located problem of every file (-o json: one report with each file's "
        "verdict). Exit 0\n"
        "ok, 1 invalid, 2 usage (or no Envoy binary for --envoy).",
    ),
    LazyCommand(
        "render",
        "inferway.cli.policy_commands:render",
        "Print the Envoy resources a policy translates to (sorted, as pushed over "
        "xDS), with the\n"
        "endpoints of its endpoints file: YAML (-o yaml, the default; text is the "
        "same) or JSON.",
    ),
    LazyCommand(
        "status",
        "inferway.cli.status:status",
        "Show what a running gateway has live: policy version, refused edits, Envoy "
        "ACKs/NACKs\n"
        "(-o json|yaml: the admin API's GET /status document). Exit 3 when it cannot "
        "be reached.",
    ),
    LazyCommand(
        "demo",
        "inferway.cli.demo:demo",
        "Canary demo: two backends, Envoy at 10% canary, then a live edit to 50%.",
    ),
    LazyCommand(
        "serve",
        "inferway.cli.serve:serve",
        "Serve the models in MODEL_REPOSITORY over the Open Inference Protocol (HTTP + gRPC).",
    ),
    LazyCommand(
        "run",
        "inferway.cli.run:run",
        "Run the gateway: serve xDS for the policy, watch it for edits, supervise Envoy.",
    ),
    LazyCommand(
        "envoy",
        "inferway.cli.envoy:envoy",
        "Run Envoy alone against a remote control plane: bootstrap, supervision (restarted on\n"
        "a crash), stats pushed to the control plane, and a drain on SIGTERM (docs/fleet.md).",
    ),
    LazyCommand(
        "profile",
        "inferway.cli.profile:profile",
        "Profile a live backend or gateway with py-spy: flame graph SVG + top frames.",
    ),
    LazyCommand(
        "verify",
        "inferway.cli.verify:verify",
        "Verify a live gateway against a policy: requests generated from the policy "
        "cover every\n"
        "route and feature rule and must reach the pools it names (--min-correct), "
        "the pools'\n"
        "activation frequencies must fit their weights (chi-square), optionally "
        "a locust load\n"
        "run (--users) must meet the p99 SLA, and cost/utilisation are read when "
        "available.\n"
        "OpenAI routes: each model and alias reaches its backends, streams are "
        "well-formed SSE\n"
        "ending with [DONE] and no unasked usage chunk, plain answers carry usage, "
        "an unknown\n"
        "model gets a 404; with --users their streaming load run reports TTFT, ITL "
        "and tokens/s.\n"
        "Exit 0 every bar met, 1 invalid policy, 2 usage (a missing extra, non-loopback "
        "load),\n"
        "3 gateway unreachable, 4 a bar missed.",
    ),
    LazyCommand(
        "optimize",
        "inferway.cli.optimize:optimize",
        "Write an FP16 or INT8 (optionally graph-optimised, or TensorRT) version "
        "of a model as\n"
        "a new version directory, validate it against the source on >= 1,000 inputs, "
        "and mark it\n"
        "rejected when it deviates more than --tolerance. Exit 0 accepted, 1 rejected "
        "or invalid\n"
        "input, 2 --tensorrt without TensorRT.",
    ),
    LazyCommand(
        "certs",
        "inferway.cli.certs:app",
        "Development CA: mint a CA, server and client certificates with SPIFFE IDs.",
    ),
    LazyCommand(
        "rollout",
        "inferway.cli.rollout:app",
        "Show and command canary rollouts.",
    ),
    LazyCommand(
        "scale",
        "inferway.cli.scale:app",
        "Show the autoscaler and the replicas it sizes.",
    ),
    LazyCommand(
        "model",
        "inferway.cli.model:app",
        "Model files: encrypt with a key held in a PKCS#11 token.",
    ),
    LazyCommand(
        "report",
        "inferway.cli.report:app",
        "Reports over the gateway's metrics history.",
    ),
)
"""Every command of ``inferway``, in the order ``--help`` lists them: where it lives and the
first paragraph of its help (tests/unit/test_cli_lazy.py checks it is the command's own)."""

app = typer.Typer(
    name="inferway",
    help="Sidecar gateway for AI inference: one policy YAML drives a supervised Envoy.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=lazy_group_class(COMMANDS),
)


@app.callback()
def _root(version: VersionOption = False) -> None:
    """Sidecar gateway for AI inference: one policy YAML drives a supervised Envoy."""


def main() -> None:
    """The CLI itself; the ``inferway`` command enters through ``cli/entry.py``, which sets
    the process environment first (``python -m inferway.cli.main`` skips that)."""
    run_app(app)


if __name__ == "__main__":
    main()
