"""Semantic checks of services' own pickers. ``process: envoy`` (``pick: hash``) replaces the
service's ``load_balancing`` (Maglev on the prompt's prefix), so the two together are refused
rather than one silently ignored (``pick: score`` keeps it as the fallback). With ``transport:
http`` (the default): an ``http_listen`` address is served by one picker process, so the
services sharing it must share ``listen`` (the keeper runs one process per ``listen``), and it
must not be another picker's gRPC ``listen`` address. Without this, two processes would race to
bind it and the loser would keep failing (Envoy applying each service's ``fail`` mode all
along)."""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.picker import default_http_listen
from inferway.policies.types import split_host_port
from inferway.policies.yaml_marks import Loc

__all__ = ["check_picker"]


def check_picker(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for index, service in enumerate(policy.services):
        picker = service.picker
        hashed = picker is not None and picker.process == "envoy" and picker.pick == "hash"
        if hashed and service.load_balancing:
            yield (
                ("services", index, "load_balancing"),
                f"service '{service.name}': picker process: envoy balances by Maglev on "
                "the prompt's prefix, which replaces load_balancing: drop one of them",
            )
    own = [
        (index, service.name, service.picker)
        for index, service in enumerate(policy.services)
        if service.picker is not None
        and service.picker.external is None
        and service.picker.process != "envoy"
    ]
    listens = {split_host_port(p.listen): name for _, name, p in own}
    first: dict[tuple[str, int], tuple[str, str]] = {}
    for index, name, picker in own:
        if picker.transport != "http" or split_host_port(picker.http_listen)[1] == 0:
            continue  # port 0: the OS picks one when it binds, so no two can meet
        loc: Loc = ("services", index, "picker", "http_listen")
        address = split_host_port(picker.http_listen)
        default = default_http_listen(picker.listen)
        is_default = default is not None and address == split_host_port(default)
        derived = " (listen's next port, the default)" if is_default else ""
        if address in listens:
            yield (
                loc,
                f"service '{name}': picker http_listen {picker.http_listen}{derived} is the "
                f"picker listen (gRPC) of service '{listens[address]}': give http_listen its "
                "own port, or space the listen ports two apart",
            )
            continue
        other, other_listen = first.setdefault(address, (name, picker.listen))
        if split_host_port(other_listen) != split_host_port(picker.listen):
            yield (
                loc,
                f"service '{name}': picker http_listen {picker.http_listen} is also the one "
                f"of service '{other}', whose picker listens on {other_listen}, not "
                f"{picker.listen}: one process serves an http_listen, so give them the same "
                "listen or each its own http_listen",
            )
