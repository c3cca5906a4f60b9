"""Output agreement: the backend's bounded digest table and the rollout's pure comparator
that pairs stable and canary answers by request id and judges them within a tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from inferway.backends.telemetry.output_digest import (
    HEAD_VALUES,
    OutputDigest,
    OutputRecorder,
    build_tensor_digest,
)
from inferway.controllers.rollout.agreement import (
    AgreementMatcher,
    Tolerance,
    compare_outputs,
)
from inferway.controllers.rollout.evidence import MirrorCounts


def _digest(request_id: str, array: np.ndarray, name: str = "y", seq: int = 1) -> OutputDigest:
    return OutputDigest(seq, request_id, "m", "1", (build_tensor_digest(name, array),))


def test_a_digest_is_small_whatever_the_tensor_size() -> None:
    big = np.arange(100_000, dtype=np.float32).reshape(100, 1000)
    d = build_tensor_digest("y", big)
    assert (d.datatype, d.shape, len(d.head)) == ("FP32", (100, 1000), HEAD_VALUES)
    assert d.total == pytest.approx(big.astype(np.float64).sum())
    assert (d.minimum, d.maximum) == (0.0, 99_999.0)
    assert build_tensor_digest("b", np.array([True])).datatype == "BOOL"
    assert build_tensor_digest("i", np.array([1], dtype=np.int64)).datatype == "INT64"
    text = build_tensor_digest("t", np.array([b"a", b"bc"], dtype=object))
    assert text.datatype == "BYTES" and text.text_hash and not text.head
    assert (
        text.text_hash != build_tensor_digest("t", np.array([b"ab", b"c"], dtype=object)).text_hash
    )


def test_digests_survive_their_json_form() -> None:
    d = _digest("r1", np.array([[1.5, -2.0]], dtype=np.float32))
    assert OutputDigest.from_json(d.to_json()) == d
    t = OutputDigest(2, "r2", "m", "1", (build_tensor_digest("t", np.array(["x"], dtype=object)),))
    assert OutputDigest.from_json(t.to_json()) == t


def test_the_recorder_is_bounded_and_pages_by_sequence() -> None:
    recorder = OutputRecorder(capacity=3)
    for i in range(5):
        recorder.record(f"r{i}", "m", "1", [("y", np.array([float(i)]), None)])
    assert len(recorder) == 3 and recorder.evicted == 2
    records, next_seq = recorder.since(0, limit=2)
    assert [r.request_id for r in records] == ["r2", "r3"] and next_seq == 4
    records, next_seq = recorder.since(next_seq)
    assert [r.request_id for r in records] == ["r4"] and next_seq == 5
    assert recorder.since(5) == ([], 5)
    recorder.record("r3", "m", "1", [("y", np.array([9.0]), None)])  # a retry replaces it
    assert [r.request_id for r in recorder.since(5)[0]] == ["r3"] and len(recorder) == 3
    with pytest.raises(ValueError, match="capacity"):
        OutputRecorder(0)


def test_answers_within_the_tolerance_agree_and_others_say_why() -> None:
    x = np.linspace(-1, 1, 200).astype(np.float32)
    stable = _digest("r", x)
    assert compare_outputs(stable, _digest("r", x * (1 + 1e-5))) is None
    head = x.copy()
    head[3] += 0.5
    assert "y[3]" in compare_outputs(stable, _digest("r", head)).reason  # type: ignore[union-attr]
    tail = x.copy()
    tail[-1] += 0.5  # beyond the head: the summary catches it
    reason = compare_outputs(stable, _digest("r", tail)).reason  # type: ignore[union-attr]
    assert "max" in reason or "sum" in reason
    shaped = compare_outputs(stable, _digest("r", x.reshape(2, 100)))
    assert shaped is not None and "FP32[2, 100] instead of FP32[200]" in shaped.reason
    renamed = compare_outputs(stable, _digest("r", x, name="z"))
    assert renamed is not None and "['z'] instead of ['y']" in renamed.reason
    loose = Tolerance(atol=1.0, rtol=0.0)
    assert compare_outputs(stable, _digest("r", head), loose) is None
    with pytest.raises(ValueError, match="tolerances"):
        Tolerance(atol=-1)


def test_the_matcher_pairs_by_request_id_in_either_order_and_counts_once() -> None:
    matcher = AgreementMatcher(capacity=10)
    same, other = np.array([1.0, 2.0]), np.array([1.0, 3.0])
    matcher.add_stable([_digest("a", same), _digest("b", same), _digest("c", same)])
    matcher.add_canary([_digest("b", same), _digest("a", other), _digest("own", same)])
    assert matcher.pending == 2  # stable c waits for its mirror; canary "own" was not mirrored
    matcher.add_canary([_digest("c", same)])
    counts, examples = matcher.take()
    assert counts == MirrorCounts(compared=3, disagreed=1)
    assert [e.request_id for e in examples] == ["a"]
    assert matcher.take()[0] == MirrorCounts()  # counted once, then reset
    matcher.add_stable([_digest("c", same)])  # no partner left: waits, not counted
    assert matcher.take()[0] == MirrorCounts()


def test_unpaired_digests_are_evicted_oldest_first() -> None:
    matcher = AgreementMatcher(capacity=2)
    matcher.add_canary([_digest(f"own{i}", np.array([1.0])) for i in range(5)])
    assert matcher.pending == 2 and matcher.unpaired_evicted == 3
    matcher.add_stable([_digest("own4", np.array([1.0]))])
    assert matcher.take()[0] == MirrorCounts(compared=1, disagreed=0)
