"""Approximate prefix-cache affinity: the prompt cut into fixed-size blocks, each block's hash
chained to the one before (so a block matches only with everything before it, as a server's
KV cache does), and an index of which server was last sent which blocks.

The index is an LRU per endpoint with a hard cap on blocks (``blocks_per_endpoint``) and on
endpoints (``max_endpoints``): its memory is bounded whatever the traffic (GAIE's users report
an unbounded prefix index OOM-killing the router). A reverse map (block -> holders) makes a
lookup cost the matched length, not the fleet size.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["PrefixIndex", "prompt_blocks", "prompt_text"]


def prompt_text(body: Any) -> str | None:
    """The text a server's cache sees first, from an OpenAI request body: the chat
    ``messages`` (role and content, in order) or the completion ``prompt``; None otherwise."""
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            content = message.get("content")
            if not isinstance(content, str):  # parts (text, images): their JSON, stably
                content = json.dumps(content, sort_keys=True, separators=(",", ":"))
            parts.append(f"{message.get('role', '')}\x1f{content}\x1e")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return str(prompt[0])
    return None


def prompt_blocks(text: str, block_chars: int = 256, max_blocks: int = 128) -> list[int]:
    """Chained hashes of ``text``'s whole ``block_chars``-byte blocks (a partial last block is
    left out: a server caches whole blocks), at most ``max_blocks`` of them.

    256 bytes is about 64 tokens (GAIE's default block is 64 tokens too); 128 blocks cover the
    first ~32k characters, which is where prompts share. The hash is Python's own (SipHash,
    keyed per process): the index lives in this process only, and hashing a long prompt costs
    tens of microseconds instead of hundreds with a cryptographic hash."""
    if block_chars < 1:
        raise ValueError(f"prompt_blocks: block_chars must be >= 1, got {block_chars}")
    data = text.encode("utf-8", "surrogatepass")
    hashes: list[int] = []
    previous = 0
    for start in range(0, min(len(data) // block_chars, max_blocks) * block_chars, block_chars):
        previous = hash((previous, data[start : start + block_chars]))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Which endpoint holds which prompt blocks, bounded: at most ``blocks_per_endpoint``
    blocks for each of at most ``max_endpoints`` endpoints (least recently used go first)."""

    def __init__(self, blocks_per_endpoint: int = 8192, max_endpoints: int = 256) -> None:
        if blocks_per_endpoint < 1 or max_endpoints < 1:
            raise ValueError("PrefixIndex: blocks_per_endpoint and max_endpoints must be >= 1")
        self.blocks_per_endpoint = blocks_per_endpoint
        self.max_endpoints = max_endpoints
        self._lru: OrderedDict[str, OrderedDict[int, None]] = OrderedDict()
        self._holders: dict[int, str | set[str]] = {}
        """Block -> its holder, or a set of them when several (most blocks have one)."""

    def __len__(self) -> int:
        """Blocks held, all endpoints together (the memory bound's unit)."""
        return sum(len(blocks) for blocks in self._lru.values())

    def endpoints(self) -> list[str]:
        return list(self._lru)

    def record(self, endpoint: str, blocks: Sequence[int]) -> None:
        """``endpoint`` now holds ``blocks`` (it was just sent them)."""
        lru = self._lru.get(endpoint)
        if lru is None:
            if len(self._lru) >= self.max_endpoints:
                self.forget(next(iter(self._lru)))
            lru = self._lru[endpoint] = OrderedDict()
        else:
            self._lru.move_to_end(endpoint)
        for block in blocks[-self.blocks_per_endpoint :]:
            if block in lru:
                lru.move_to_end(block)
                continue
            lru[block] = None
            holders = self._holders.get(block)
            if holders is None:
                self._holders[block] = endpoint
            elif isinstance(holders, set):
                holders.add(endpoint)
            elif holders != endpoint:
                self._holders[block] = {holders, endpoint}
            if len(lru) > self.blocks_per_endpoint:
                old, _ = lru.popitem(last=False)
                self._drop(old, endpoint)

    def _drop(self, block: int, endpoint: str) -> None:
        holders = self._holders.get(block)
        if holders == endpoint:
            del self._holders[block]
        elif isinstance(holders, set):
            holders.discard(endpoint)
            if len(holders) == 1:
                self._holders[block] = next(iter(holders))

    def forget(self, endpoint: str) -> None:
        """An endpoint gone (or restarted: its cache is empty)."""
        for block in self._lru.pop(endpoint, {}):
            self._drop(block, endpoint)

    def matches(self, blocks: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """For each of ``endpoints``: how many leading ``blocks`` it holds. Hashes are chained,
        so holding block ``i`` means having been sent everything before it: the walk stops at
        the first block nobody holds."""
        matched = dict.fromkeys(endpoints, 0)
        for depth, block in enumerate(blocks, start=1):
            holders = self._holders.get(block)
            if holders is None:
                break
            if isinstance(holders, str):
                if holders in matched:
                    matched[holders] = depth
            else:
                for endpoint in holders:
                    if endpoint in matched:
                        matched[endpoint] = depth
        return matched
