"""Backends' ORCA load reports are for Envoy's load balancer, never for clients.

inferway backends report their load in ``endpoint-load-metrics``: a response header over
HTTP, a trailer over gRPC (trailers are where gRPC carries per-call metadata after the
message). Envoy's router reads either for ``load_aware`` balancing as the response arrives
from upstream; after that, the virtual host's ``response_headers_to_remove`` drops the
header and this ``header_mutation`` filter (before the router, so it sees the response after
the router has read it) drops the trailer.
"""

from __future__ import annotations

from inferway._xds_protos.envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from inferway._xds_protos.envoy.extensions.filters.http.header_mutation.v3 import (
    header_mutation_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.xds.translate._protos import pack
from inferway.xds.translate.load_balancing import ORCA_HEADER

__all__ = ["LOAD_REPORT_FILTER", "build_load_report_filter"]

LOAD_REPORT_FILTER = "envoy.filters.http.header_mutation"


def build_load_report_filter() -> hcm_pb2.HttpFilter:
    """Removes the ORCA trailer from every response on its way to the client."""
    config = header_mutation_pb2.HeaderMutation(
        mutations=header_mutation_pb2.Mutations(
            response_trailers_mutations=[mutation_rules_pb2.HeaderMutation(remove=ORCA_HEADER)]
        )
    )
    return hcm_pb2.HttpFilter(name=LOAD_REPORT_FILTER, typed_config=pack(config))
