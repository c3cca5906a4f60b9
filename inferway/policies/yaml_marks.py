"""YAML loading that remembers where every value came from.

``yaml.safe_load`` throws positions away, so an error found later (by pydantic or a
semantic check) could only say *what* is wrong. Here the document is composed into nodes
and rebuilt into plain dicts/lists while recording, for every path, the line and column of
its key and value. Duplicate keys, which PyYAML silently collapses, are reported instead.

Mapping keys are taken as the literal text written (YAML 1.1 would turn ``on:`` into the
boolean ``True``, and ``on`` is a policy field).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "MAX_DEPTH",
    "Loc",
    "Mark",
    "MarkedDocument",
    "NodeMarks",
    "YamlSyntaxError",
    "format_loc",
    "load_marked_yaml",
]

Loc = tuple[str | int, ...]
"""A path into the document: mapping keys and list indexes, e.g. ``("routes", 0, "name")``."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MAX_NODES = 200_000
"""Bound on rebuilt nodes, so alias bombs ("billion laughs") fail fast."""
MAX_DEPTH = 64
"""Bound on nesting (lists and mappings inside each other, aliases expanded). A policy nests
about ten deep; PyYAML's composer and the rebuild below recurse once per level, so a file
of ``[[[[...]]]]`` would otherwise end in a RecursionError instead of a located error."""


@dataclass(frozen=True)
class Mark:
    """A 1-based position in the source text."""

    line: int
    column: int


@dataclass(frozen=True)
class NodeMarks:
    """Where one value sits: its own start, the key that names it, and whether it is inline."""

    value: Mark
    key: Mark | None
    inline: bool
    """Scalars and flow collections (``[a, b]``) sit on their key's line."""


@dataclass(frozen=True)
class MarkedIssue:
    """A problem found while reading the YAML itself (e.g. a duplicate key)."""

    loc: Loc
    mark: Mark
    message: str


@dataclass
class MarkedDocument:
    """Plain data plus the position of every node in it."""

    data: object
    marks: dict[Loc, NodeMarks] = field(default_factory=dict)
    issues: list[MarkedIssue] = field(default_factory=list)

    def position(self, loc: Loc, *, at_key: bool = False) -> Mark:
        """Where to point for ``loc``: the value itself when it is inline, else its key.

        A path that does not exist in the data (a missing field, a default value) points at
        the deepest existing parent, which is where the fix goes.
        """
        for depth in range(len(loc), -1, -1):
            marks = self.marks.get(loc[:depth])
            if marks is None:
                continue
            exact = depth == len(loc)
            if exact and at_key and marks.key is not None:
                return marks.key
            if exact and marks.inline:
                return marks.value
            return marks.key or marks.value
        return Mark(1, 1)

    def existing_prefix(self, loc: Loc) -> Loc:
        """The longest prefix of ``loc`` that names a node of the document."""
        for depth in range(len(loc), -1, -1):
            if loc[:depth] in self.marks:
                return loc[:depth]
        return ()


class YamlSyntaxError(Exception):
    """The text is not YAML; ``mark`` is where the parser gave up."""

    def __init__(self, message: str, mark: Mark) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


def format_loc(loc: Loc) -> str:
    """``("routes", 0, "backends", 1)`` -> ``"routes[0].backends[1]"``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _mark(yaml_mark: yaml.Mark | None) -> Mark:
    if yaml_mark is None:
        return Mark(1, 1)
    return Mark(yaml_mark.line + 1, yaml_mark.column + 1)


def _syntax_message(error: yaml.MarkedYAMLError) -> str:
    problem = error.problem or "invalid YAML"
    if problem.startswith("but ") and error.context:
        message = f"invalid YAML: {error.context}, {problem}"
    else:
        message = f"invalid YAML: {problem}"
        if error.context:
            message += f" ({error.context}"
            if error.context_mark is not None:
                message += f" at line {error.context_mark.line + 1}"
            message += ")"
    if "<block" in problem:
        message += "; check the indentation"
    return message


def load_marked_yaml(text: str) -> MarkedDocument:
    """Parse one YAML document into plain data with positions.

    Raises :class:`YamlSyntaxError` when the text is not a single valid YAML document.
    An empty document yields ``data=None``.
    """
    _check_nesting(text)
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as error:
            raise YamlSyntaxError(
                _syntax_message(error), _mark(error.problem_mark or error.context_mark)
            ) from None
        except yaml.YAMLError as error:
            raise YamlSyntaxError(f"invalid YAML: {error}", Mark(1, 1)) from None
        document = MarkedDocument(data=None)
        if root is not None:
            size, depth = _expanded_size(root)
            if depth > MAX_DEPTH:
                raise YamlSyntaxError(
                    f"nested too deeply: {depth} levels once aliases are expanded "
                    f"(at most {MAX_DEPTH})",
                    _mark(root.start_mark),
                )
            if size > _MAX_NODES:
                raise YamlSyntaxError(
                    f"document too large: {size} values once aliases are expanded "
                    f"(at most {_MAX_NODES})",
                    _mark(root.start_mark),
                )
            builder = _Builder(loader, document)
            document.data = builder.build(root, (), None)
        return document
    finally:
        loader.dispose()


def _check_nesting(text: str) -> None:
    """Raise YamlSyntaxError at the first list or mapping nested deeper than MAX_DEPTH.

    Reads the parser's events (PyYAML's parser keeps its own stack, unlike its composer), so
    depth is measured before anything recursive runs. Syntax errors are left to the loader.
    """
    parser = yaml.SafeLoader(text)
    depth = 0
    try:
        while parser.check_event():
            event = parser.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlSyntaxError(
                        f"nested too deeply: more than {MAX_DEPTH} levels of lists and mappings",
                        _event_mark(event),
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return  # reported, with its position, by the loader's own pass
    finally:
        parser.dispose()


def _event_mark(event: yaml.Event) -> Mark:
    mark = event.start_mark  # a pure-Python or a libyaml mark: both have line and column
    if mark is None:
        return Mark(1, 1)
    return Mark(mark.line + 1, mark.column + 1)


def _expanded_size(root: Node) -> tuple[int, int]:
    """Values the document holds and its depth with aliases expanded, counted without
    expanding them (each node once, iteratively: an alias chain can be deeper than Python's
    stack). A node that contains itself counts as one value, like a scalar."""
    sizes: dict[int, tuple[int, int]] = {}
    active: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            results = [sizes.get(id(child), (1, 1)) for child in _children(node)]
            size = 1 + sum(r[0] for r in results)
            depth = 1 + max((r[1] for r in results), default=0)
            sizes[key] = (min(size, _MAX_NODES + 1), depth)
            active.discard(key)
            continue
        if key in sizes or key in active:
            continue
        if isinstance(node, ScalarNode):
            sizes[key] = (1, 1)
            continue
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes.get(id(root), (1, 1))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [child for pair in node.value for child in pair]
    return []


class _Builder:
    """Rebuilds composed nodes into dicts/lists/scalars, recording marks per path."""

    def __init__(self, loader: yaml.SafeLoader, document: MarkedDocument) -> None:
        self._loader = loader
        self._doc = document
        self._active: set[int] = set()

    def build(self, node: Node, loc: Loc, key_mark: Mark | None) -> object:
        inline = isinstance(node, ScalarNode) or bool(getattr(node, "flow_style", False))
        self._doc.marks[loc] = NodeMarks(_mark(node.start_mark), key_mark, inline)
        if isinstance(node, ScalarNode):
            return self._scalar(node, loc)
        if id(node) in self._active:
            self._issue(loc, node, "an alias refers to a node that contains it (recursive data)")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.build(item, (*loc, i), None) for i, item in enumerate(node.value)]
            if isinstance(node, MappingNode):
                return self._mapping(node, loc)
            return None
        finally:
            self._active.discard(id(node))

    def _issue(self, loc: Loc, node: Node, message: str) -> None:
        self._doc.issues.append(MarkedIssue(loc, _mark(node.start_mark), message))

    def _scalar(self, node: ScalarNode, loc: Loc) -> object:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as error:
            problem = getattr(error, "problem", None) or str(error)
            self._issue(loc, node, f"cannot read this value: {problem}")
            return node.value
        except (ValueError, OverflowError):  # an integer of thousands of digits
            self._issue(
                loc, node, f"cannot read this value: a number of {len(node.value)} characters"
            )
            return None

    def _mapping(self, node: MappingNode, loc: Loc) -> dict[str, object]:
        result: dict[str, object] = {}
        first_seen: dict[str, Mark] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                self._issue(loc, key_node, "mapping keys must be plain strings")
                continue
            key = str(key_node.value)
            key_mark = _mark(key_node.start_mark)
            if key in first_seen:
                first = first_seen[key]
                self._doc.issues.append(
                    MarkedIssue(
                        (*loc, key),
                        key_mark,
                        f"duplicate key '{key}' (first at line {first.line}); "
                        "YAML keeps only one of them, remove the other",
                    )
                )
            first_seen[key] = key_mark
            result[key] = self.build(value_node, (*loc, key), key_mark)
        for merge_node in merges:
            self._merge(merge_node, loc, result)
        return result

    def _merge(self, merge_node: Node, loc: Loc, result: dict[str, object]) -> None:
        """``<<: *base`` fills in keys the mapping does not set itself."""
        sources = merge_node.value if isinstance(merge_node, SequenceNode) else [merge_node]
        for source in sources:
            if not isinstance(source, MappingNode):
                self._issue(loc, source, "'<<' merges only mappings")
                continue
            for key_node, value_node in source.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                    continue
                key = str(key_node.value)
                if key not in result:
                    result[key] = self.build(value_node, (*loc, key), _mark(key_node.start_mark))
