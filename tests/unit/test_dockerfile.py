"""deploy/Dockerfile, checked without a container engine (``make test``; tests/image builds and
runs it for real): it parses with BuildKit's own parser (the ``dockerfile`` package wraps it),
its stages and base image are the ones the docs promise, it pulls no frontend image, what it
copies exists and is not excluded from the build context, its shell steps parse, and it agrees
with pyproject and the Kubernetes manifests (entry point, user, ports). The HEALTHCHECK command
itself runs against a real backend in tests/integration/test_kubernetes_pods.py."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tomllib
from pathlib import Path

import dockerfile
import pytest

from tests.kustomize_build import build

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


@pytest.fixture(scope="module")
def instructions() -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def stages(instructions: list[dockerfile.Command]) -> list[list[dockerfile.Command]]:
    split: list[list[dockerfile.Command]] = []
    for instruction in instructions:
        if instruction.cmd == "FROM":
            split.append([])
        if split:
            split[-1].append(instruction)
    return split


def arg_defaults(instructions: list[dockerfile.Command]) -> dict[str, str]:
    pairs = (i.value[0].split("=", 1) for i in instructions if i.cmd == "ARG")
    return {name: value.strip('"') for name, value in pairs}


def test_no_frontend_image_is_pulled() -> None:
    """A ``# syntax=`` line makes BuildKit pull that frontend image from a registry; without
    one, its built-in frontend (which has ``RUN --mount``) builds where only Debian's archive
    and PyPI are reachable (deploy/base/build-base.sh makes the base there)."""
    first = DOCKERFILE.read_text().splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, re.IGNORECASE), first


def test_two_stages_on_a_glibc_python_base_of_the_supported_version(
    instructions: list[dockerfile.Command],
) -> None:
    build_stage, runtime = stages(instructions)
    assert build_stage[0].value[1:] == ("AS", "build")
    image = arg_defaults(instructions)["PYTHON_IMAGE"]
    assert build_stage[0].value[0] == runtime[0].value[0] == "${PYTHON_IMAGE}"
    match = re.fullmatch(r"python:(\d+)\.(\d+)-slim-(bookworm|trixie)", image)
    assert match, f"{image}: a Debian (glibc) slim Python image, not alpine (musl)"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minimum = tuple(int(p) for p in project["requires-python"].removeprefix(">=").split("."))
    assert (int(match[1]), int(match[2])) >= minimum
    copies = [i for i in runtime if i.cmd == "COPY"]
    assert all(i.flags == ("--from=build",) for i in copies), "the runtime stage copies no sources"
    (install,) = [i for i in runtime if i.cmd == "RUN"]
    assert "--mount=type=bind,from=build,source=/wheels,target=/wheels" in install.flags
    assert "--no-index" in install.value[0], "the runtime installs only the built wheels"


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_what_it_copies_exists_and_is_in_the_build_context(
    instructions: list[dockerfile.Command],
) -> None:
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied = [i for i in instructions if i.cmd == "COPY" and "--from=build" not in i.flags]
    assert copied
    for instruction in copied:
        *sources, _ = instruction.value
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not _ignored(source, ignore), f"COPY {source}: excluded by .dockerignore"
    assert _ignored(".venv", ignore) and _ignored(".git", ignore)


@pytest.mark.needs_binary("sh", "parsing the Dockerfile's shell steps")
def test_every_shell_step_parses(instructions: list[dockerfile.Command]) -> None:
    for instruction in (i for i in instructions if i.cmd == "RUN"):
        assert not instruction.json
        done = subprocess.run(
            ["sh", "-n", "-c", instruction.value[0]], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{instruction.original}: {done.stderr}"


def test_it_runs_the_project_entry_point_as_the_manifests_user_on_their_ports(
    instructions: list[dockerfile.Command],
) -> None:
    _, runtime = stages(instructions)
    (entrypoint,) = [i for i in runtime if i.cmd == "ENTRYPOINT"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint.json and list(entrypoint.value) == ["inferway"]
    assert "inferway" in scripts
    (user,) = [i for i in runtime if i.cmd == "USER"]
    uid, gid = (int(part) for part in user.value[0].split(":"))
    assert uid != 0 and gid != 0, "the image runs as a non-root user"
    assert f"--uid {uid} --gid {gid}" in next(i for i in runtime if i.cmd == "RUN").value[0]
    (exposed,) = [i for i in runtime if i.cmd == "EXPOSE"]
    ports: set[int] = set()
    for overlay in ("cpu", "gpu"):
        for resource in build(ROOT / "deploy" / "kubernetes" / "overlays" / overlay):
            if resource["kind"] != "Deployment":
                continue
            pod = resource["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsUser"] == uid
            assert pod["securityContext"]["runAsGroup"] == gid
            for c in pod["containers"]:
                ports |= {p["containerPort"] for p in c["ports"]}
    assert {int(p) for p in exposed.value} == ports
    (check,) = [i for i in runtime if i.cmd == "HEALTHCHECK"]
    assert check.json and check.value[0] == "CMD"
    assert "/v2/health/ready" in check.value[-1] and "INFERWAY_HEALTH_URL" in check.value[-1]


def test_one_plain_install_as_the_makefile_does_with_no_repair_step_after_it(
    instructions: list[dockerfile.Command],
) -> None:
    """The wheel owns no other distribution's files (tests/wheel_install checks the RECORDs), so
    neither the image nor the Makefile may reinstall anything after installing inferway."""
    makefile = (ROOT / "Makefile").read_text()
    (install,) = [i.value[0] for i in stages(instructions)[1] if i.cmd == "RUN"]
    assert install.count("pip install") == 1, install
    assert '"${INFERWAY_DIST}"' in install
    for text in (makefile, install):
        assert "--force-reinstall" not in text and "opentelemetry-proto" not in text
    assert makefile.count("pip install") == 2  # pip itself, then `-e '.[dev]'`
    (dist,) = {i.value[0] for i in instructions if i.cmd == "ARG" and "INFERWAY_DIST" in i.value[0]}
    assert dist == "INFERWAY_DIST=inferway", "the default image holds Envoy and the CPU backend"


def test_the_build_stage_builds_with_the_documented_command(
    instructions: list[dockerfile.Command],
) -> None:
    """``python -m build_support.dists`` (docs/install.md) makes inferway-core and every
    meta-distribution; the image's requirement is then resolved against that folder."""
    (build,) = [i for i in stages(instructions)[0] if i.cmd == "RUN" and i.flags]
    # the CA bundle of a TLS-intercepting proxy, when given as a build secret, for pip only
    secret = "/run/secrets/pip-ca-bundle"
    assert build.flags == ("--mount=type=secret,id=pip-ca-bundle",), build.flags
    steps = [step.strip() for step in build.value[0].split("&&")]
    assert steps[0] == f"if [ -f {secret} ]; then export PIP_CERT={secret}; fi", steps
    assert steps[1] == "python -m build_support.dists /dist", steps
    assert steps[2].endswith('--find-links /dist "${INFERWAY_DIST}"'), steps
    copied = {i.value[0] for i in instructions if i.cmd == "COPY"}
    assert {"packaging", "build_support", "inferway"} <= copied


def test_the_runtime_has_envoys_sse_reader_built_in_the_build_stage(
    instructions: list[dockerfile.Command],
) -> None:
    """The build stage has a compiler and builds the module where the runtime stage, which has
    none, takes it from (docs/llm.md; tests/image checks the image's Envoy loads it)."""
    build_stage, runtime = stages(instructions)
    steps = " ".join(i.value[0] for i in build_stage if i.cmd == "RUN")
    assert "apt-get install" in steps and " gcc " in steps
    assert "INFERWAY_ENVOY_MODULES_DIR=/envoy-modules" in steps and "build_sse_module()" in steps
    (copy,) = [i for i in runtime if i.cmd == "COPY"]
    assert copy.value == ("/envoy-modules", "/opt/inferway/envoy-modules")
    pairs = [v for i in runtime if i.cmd == "ENV" for v in i.value]  # name, value, name, ...
    env = dict(zip(pairs[::2], pairs[1::2], strict=True))
    assert env["INFERWAY_ENVOY_MODULES_DIR"] == "/opt/inferway/envoy-modules", env
    assert "gcc" not in " ".join(i.value[0] for i in runtime if i.cmd == "RUN")
