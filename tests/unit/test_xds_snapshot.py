"""Snapshots: content-derived versions per type and the consistency check."""

from __future__ import annotations

from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.snapshot import build_snapshot
from tests.xds_sample import build_cluster, build_sample_resources


def resources(
    backend_ports: tuple[int, ...] = (9001,), extra_clusters: list | None = None
) -> Resources:
    return build_sample_resources(
        listener_port=10000, backend_ports=list(backend_ports), extra_clusters=extra_clusters
    )


def without(source: Resources, type_url: str) -> Resources:
    return Resources.build({t: list(m.items()) for t, m in source.by_type.items() if t != type_url})


def test_versions_are_content_hashes_stable_across_builds() -> None:
    first, second = build_snapshot(resources()), build_snapshot(resources())
    assert (first.versions, first.version) == (second.versions, second.version)
    assert list(first.versions)[:5] == list(type_urls.PUSH_ORDER)
    assert len(first.version) == 16


def test_only_the_changed_type_gets_a_new_version() -> None:
    before = build_snapshot(resources())
    after = build_snapshot(resources(backend_ports=(9002,)))
    changed = {t for t in before.versions if before.versions[t] != after.versions[t]}
    assert changed == {type_urls.ENDPOINT}
    assert before.version != after.version


def test_absent_types_have_the_empty_version_and_still_count() -> None:
    snapshot = build_snapshot(Resources.build({}))
    assert set(snapshot.versions) == set(type_urls.PUSH_ORDER)
    assert len(set(snapshot.versions.values())) == 1
    assert snapshot.consistent() == []


def test_sample_is_consistent() -> None:
    assert build_snapshot(resources()).consistent() == []


def test_eds_cluster_without_load_assignment_is_reported() -> None:
    source = resources(extra_clusters=[build_cluster("orphan")])
    problems = build_snapshot(source).consistent()
    assert len(problems) == 1
    assert "'orphan'" in problems[0] and "ClusterLoadAssignment" in problems[0]


def test_eds_service_name_is_what_must_exist() -> None:
    renamed = build_cluster("aliased")
    renamed.eds_cluster_config.service_name = "backend"
    assert build_snapshot(resources(extra_clusters=[renamed])).consistent() == []


def test_listener_with_missing_route_configuration_is_reported() -> None:
    problems = build_snapshot(without(resources(), type_urls.ROUTE)).consistent()
    assert problems == [
        "listener 'ingress' (filter_chains[0].filters[0]) uses RDS route config 'ingress' "
        "but the snapshot has no RouteConfiguration with that name"
    ]
