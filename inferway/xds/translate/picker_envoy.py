"""``picker: {process: envoy}``: Envoy picks the replica itself, with no picker to ask.

A Lua filter (last before the router, like the other pickers' filters) hashes the first
``prefix_bytes`` of the request's ``messages`` array (or ``prompt``) as the client sent them
(FNV-1a, 32 bits) and puts the hash in ``x-inferway-prefix-hash``; the service's cluster
balances by Maglev over that header with bounded load (``hash_balance_factor``): a request goes
to the replica the hash maps to unless that replica has more than ``load_bound`` times the
average of Envoy's requests in flight, then to the next replica on the table.

Why this shape: the hop to a picker process is what costs a scored pick its time (about 0.6 ms
at p50 and 2 ms at p99 held in Envoy at 500 req/s on two shared cores, bench/picker_transport.py),
while the hash costs Envoy a few microseconds. Requests sharing a prompt's prefix meet on one
replica (its prefix cache) and Maglev's table depends only on the replicas, so every Envoy of a
fleet sends them to the same one. Bounded load keeps one popular prefix from burying its
replica. What it gives up: scraped metrics (KV cache, queue as the server sees it), LoRA and
session scorers, and scores to explain a pick (the hash header and Envoy's upstream host say
where a request went and why).

A request without such a body (no ``messages``/``prompt`` in its first ``SCAN_BYTES``, or no
body) gets no header and Maglev picks at random: the pool still serves it.
"""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2, extension_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2
from inferway._xds_protos.envoy.extensions.filters.http.lua.v3 import lua_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.common.v3 import common_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.maglev.v3 import maglev_pb2
from inferway.resolve.ir.picker import PickerIR
from inferway.xds.translate._protos import pack

__all__ = [
    "MAGLEV_POLICY",
    "PREFIX_HASH_HEADER",
    "SCAN_BYTES",
    "build_prefix_hash_filter",
    "disabled_prefix_hash",
    "prefix_hash_lb",
    "prefix_hash_script",
]

PREFIX_HASH_HEADER = "x-inferway-prefix-hash"
MAGLEV_POLICY = "envoy.load_balancing_policies.maglev"
SCAN_BYTES = 65536
"""How far into the body the filter looks for ``"messages"`` / ``"prompt"`` (a long ``tools``
list may come first); past it the request is balanced without a hash."""

_SCRIPT = """
-- inferway's picker, process: envoy: the prompt prefix's hash for Maglev (picker_envoy.py)
local HEADER = "%(header)s"
local PREFIX = %(prefix)d
local SCAN = %(scan)d
local tobit, bxor, lshift, tohex = bit.tobit, bit.bxor, bit.lshift, bit.tohex
local byte, find = string.byte, string.find

function envoy_on_request(handle)
  handle:headers():remove(HEADER)  -- the client's own never steers
  local body = handle:body()  -- waits for the whole body: headers taken before are stale
  if body == nil then return end
  local n = body:length()
  if n == 0 then return end
  if n > SCAN + PREFIX then n = SCAN + PREFIX end
  local s = body:getBytes(0, n)
  local _, at = find(s, '"messages"%%s*:%%s*%%[')
  if at == nil then _, at = find(s, '"prompt"%%s*:') end
  if at == nil or at > SCAN then return end
  local stop = at + PREFIX
  if stop > n then stop = n end
  local h = tobit(2166136261)  -- FNV-1a, 32 bits: h * 16777619 is h << 24 plus h * 403
  for i = at + 1, stop do
    h = bxor(h, byte(s, i))
    h = tobit(lshift(h, 24) + h * 403)
  end
  handle:headers():replace(HEADER, tohex(h))
end
"""


def prefix_hash_script(prefix_bytes: int) -> str:
    """The Lua filter's code: hash ``prefix_bytes`` of the prompt into ``PREFIX_HASH_HEADER``."""
    if prefix_bytes < 1:
        raise ValueError(f"prefix_hash_script: prefix_bytes must be >= 1, got {prefix_bytes}")
    return _SCRIPT % {"header": PREFIX_HASH_HEADER, "prefix": prefix_bytes, "scan": SCAN_BYTES}


def build_prefix_hash_filter(name: str, picker: PickerIR) -> hcm_pb2.HttpFilter:
    source = base_pb2.DataSource(inline_string=prefix_hash_script(picker.prefix_bytes))
    config = lua_pb2.Lua(default_source_code=source)
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(config))


def disabled_prefix_hash() -> lua_pb2.LuaPerRoute:
    return lua_pb2.LuaPerRoute(disabled=True)


def prefix_hash_lb(picker: PickerIR, *, zoned: bool = False) -> cluster_pb2.LoadBalancingPolicy:
    """Maglev on the prefix hash header with bounded load (the hash policy is the cluster's
    own, so no route needs one); ``zoned``: the endpoints' zones weigh first (the prefix then
    meets on one replica of the zone the request is sent to)."""
    hash_policy = route_components_pb2.RouteAction.HashPolicy(
        header=route_components_pb2.RouteAction.HashPolicy.Header(header_name=PREFIX_HASH_HEADER)
    )
    consistent = common_pb2.ConsistentHashingLbConfig(hash_policy=[hash_policy])
    consistent.hash_balance_factor.value = round(picker.load_bound * 100)
    config = maglev_pb2.Maglev(consistent_hashing_lb_config=consistent)
    if zoned:
        config.locality_weighted_lb_config.SetInParent()
    typed = extension_pb2.TypedExtensionConfig(name=MAGLEV_POLICY, typed_config=pack(config))
    return cluster_pb2.LoadBalancingPolicy(
        policies=[cluster_pb2.LoadBalancingPolicy.Policy(typed_extension_config=typed)]
    )
