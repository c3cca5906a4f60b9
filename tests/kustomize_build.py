"""``kustomize build`` for the subset of kustomize that deploy/kubernetes uses, in Python, so the
manifests' tests render the overlays without a kustomize binary (CI has none). Any field of a
kustomization outside that subset is an error, not silently ignored; where ``kubectl kustomize``
exists, a test checks this renders what it renders.

Subset: ``resources`` (files and directories), ``components`` (directories holding a
``kind: Component`` with ``resources`` and ``patches``), ``namespace``, ``labels`` (``pairs`` on
metadata only), ``configMapGenerator`` (``files``) with ``generatorOptions.disableNameSuffixHash``,
and ``patches`` (``path`` to a strategic-merge patch, matched by kind and name; its
``$patch: delete`` at the top removes the resource, ``$patch: replace`` in a map replaces that
map instead of merging into it).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KustomizeError", "build", "strategic_merge"]

Resource = dict[str, Any]

_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "configMapGenerator",
    "generatorOptions",
    "patches",
}
_COMPONENT_FIELDS = {"apiVersion", "kind", "resources", "patches"}
_CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
# patchMergeKey of the Kubernetes API's lists that the patches here touch; any other list is
# replaced by the patch's, as strategic merge does for lists without a merge key.
_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class KustomizeError(ValueError):
    """A kustomization this subset cannot render; names the file."""


def build(directory: Path) -> list[Resource]:
    """The resources ``kustomize build directory`` would print, in no particular order."""
    path = directory / "kustomization.yaml"
    spec = yaml.safe_load(path.read_text())
    unknown = set(spec) - _FIELDS
    if unknown:
        raise KustomizeError(f"{path}: fields outside the supported subset: {sorted(unknown)}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{path}: a {spec['kind']} is not built on its own")
    resources = _load_resources(directory, spec)
    # kustomize applies components after the resources, before this kustomization's own
    # generators and transformers
    for entry in spec.get("components", []):
        _apply_component(path, directory / entry, resources)
    resources.extend(_generate_config_maps(path, spec))
    for patch in spec.get("patches", []):
        _apply_patch(path, resources, patch)
    for pairs in spec.get("labels", []):
        if set(pairs) != {"pairs"}:
            raise KustomizeError(f"{path}: labels support only `pairs`, got {sorted(pairs)}")
        for resource in resources:
            resource.setdefault("metadata", {}).setdefault("labels", {}).update(pairs["pairs"])
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] not in _CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = spec["namespace"]
    return resources


def _load_resources(directory: Path, spec: dict[str, Any]) -> list[Resource]:
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = directory / entry
        if target.is_dir():
            resources.extend(build(target))
        else:
            resources.extend(d for d in yaml.safe_load_all(target.read_text()) if d)
    return resources


def _apply_component(path: Path, directory: Path, resources: list[Resource]) -> None:
    component_path = directory / "kustomization.yaml"
    spec = yaml.safe_load(component_path.read_text())
    if spec.get("kind") != "Component":
        raise KustomizeError(f"{path}: {directory} is not a kind: Component")
    unknown = set(spec) - _COMPONENT_FIELDS
    if unknown:
        raise KustomizeError(f"{component_path}: fields outside the supported subset: {unknown}")
    resources.extend(_load_resources(directory, spec))
    for patch in spec.get("patches", []):
        _apply_patch(component_path, resources, patch)


def _generate_config_maps(path: Path, spec: dict[str, Any]) -> list[Resource]:
    generators = spec.get("configMapGenerator", [])
    if generators and spec.get("generatorOptions") != {"disableNameSuffixHash": True}:
        raise KustomizeError(f"{path}: name-suffix hashes (and their references) are unsupported")
    maps = []
    for generator in generators:
        if set(generator) != {"name", "files"}:
            raise KustomizeError(f"{path}: configMapGenerator supports name and files only")
        data = {Path(f).name: (path.parent / f).read_text() for f in generator["files"]}
        maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": data,
            }
        )
    return maps


def _apply_patch(path: Path, resources: list[Resource], patch: dict[str, Any]) -> None:
    if set(patch) != {"path"}:
        raise KustomizeError(f"{path}: patches support `path` (strategic merge) only")
    document = yaml.safe_load((path.parent / patch["path"]).read_text())
    key = (document["kind"], document["metadata"]["name"])
    matches = [r for r in resources if (r["kind"], r["metadata"]["name"]) == key]
    if len(matches) != 1:
        raise KustomizeError(f"{path}: patch {patch['path']} matches {len(matches)} resources")
    if document.get("$patch") == "delete":
        resources.remove(matches[0])
        return
    merged = strategic_merge(matches[0], document)
    matches[0].clear()
    matches[0].update(merged)


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """``patch`` merged into ``base``: maps key by key (a map with ``$patch: replace`` replaces
    its base), lists with a merge key item by item."""
    if isinstance(patch, dict) and "$patch" in patch:
        if patch["$patch"] != "replace":
            raise KustomizeError(f"$patch: {patch['$patch']} is supported only on a resource")
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value, key) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        merge_key = _MERGE_KEYS[field]
        merged_list = copy.deepcopy(base)
        index = {item[merge_key]: i for i, item in enumerate(merged_list)}
        for item in patch:
            at = index.get(item[merge_key])
            if at is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[at] = strategic_merge(merged_list[at], item)
        return merged_list
    return copy.deepcopy(patch)
