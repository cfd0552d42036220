"""YAML loading that remembers the line of every key and list item, and refuses duplicate keys.

PyYAML's loaders return plain dicts and keep the last of two equal keys without a word. An inventory needs
the line of each value for `file:line` errors, and two hosts with one name must be an error, not a silently
dropped host. So the document is composed into PyYAML's node tree and built here; scalars are still made by
PyYAML's safe constructor, so `yes`, `0x1F` or `2024-01-01` mean what they mean to every other YAML tool.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_SYNTAX_FIX = "check the indentation (spaces, not tabs) and quote values that contain ': ', ' #' or start with '{[*&!|>%@`'"


class YamlError(Exception):
    """Invalid YAML, at a 1-based line."""

    def __init__(self, line: int, problem: str, fix: str = _SYNTAX_FIX) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem
        self.fix = fix


class SourceMap(dict[Any, Any]):
    """A mapping that knows its own line and the line of each of its keys."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self._key_lines: dict[Any, int] = {}

    def key_line(self, key: Any) -> int:
        return self._key_lines[key]

    def _set(self, key: Any, value: Any, line: int) -> None:
        self[key] = value
        self._key_lines[key] = line


class SourceList(list[Any]):
    """A list that knows its own line and the line of each item."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self._item_lines: list[int] = []

    def item_line(self, index: int) -> int:
        return self._item_lines[index]

    def _add(self, value: Any, line: int) -> None:
        self.append(value)
        self._item_lines.append(line)


def load(text: str, *, libyaml: bool = False) -> Any:
    """The one document in `text` (None when it holds none), mappings as SourceMap and lists as SourceList.
    `libyaml`: parsed by libyaml where PyYAML has it (a tenth of the time), for text known to be valid (the
    playbooks the package ships); its errors are worded otherwise than the pure-Python parser's that a user's
    file gets."""
    loader = yaml.CSafeLoader if libyaml and yaml.__with_libyaml__ else yaml.SafeLoader
    try:
        node = yaml.compose(text, Loader=loader)
        return None if node is None else _Builder().build(node)
    except yaml.MarkedYAMLError as e:
        # At the end of the text ("found unexpected end of stream"), where the construct began says more.
        at_end = e.problem_mark is None or e.problem_mark.index >= len(text.rstrip())
        mark = (e.context_mark if at_end else None) or e.problem_mark
        raise YamlError(mark.line + 1 if mark else 1, _describe(e), _fix_for(e)) from None
    except yaml.reader.ReaderError as e:
        code = e.character if isinstance(e.character, int) else ord(e.character)
        raise YamlError(text.count("\n", 0, e.position) + 1, f"the character U+{code:04X} is not allowed in YAML",
                        "remove it, or write it as an escape inside double quotes") from None
    except RecursionError:
        raise YamlError(1, "the document is nested too deeply", "flatten the structure") from None


def _describe(e: yaml.MarkedYAMLError) -> str:
    return f"{e.context}: {e.problem}" if e.context and e.problem else str(e.problem or e.context)


def _fix_for(e: yaml.MarkedYAMLError) -> str:
    if isinstance(e, yaml.constructor.ConstructorError):
        return "remove the `!tag`, or quote the value to make it a string"
    if isinstance(e, yaml.composer.ComposerError) and "single document" in str(e.context):
        return "keep one document: remove the second `---`"
    return _SYNTAX_FIX


def _line(node: Node) -> int:
    return node.start_mark.line + 1


class _Builder:
    def __init__(self) -> None:
        self._scalars = SafeConstructor()
        # An alias is the very node it names: build it once, as PyYAML does, so `&a`/`*a` chains stay linear.
        self._built: dict[int, Any] = {}
        self._open: set[int] = set()

    def build(self, node: Node) -> Any:
        if isinstance(node, ScalarNode):
            return self._scalar(node)
        key = id(node)
        if key in self._built:
            return self._built[key]
        if key in self._open:
            raise YamlError(_line(node), "an alias refers to the list or mapping that contains it", "remove the recursive alias")
        self._open.add(key)
        try:
            value = self._mapping(node) if isinstance(node, MappingNode) else self._sequence(node)
        finally:
            self._open.discard(key)
        self._built[key] = value
        return value

    def _scalar(self, node: ScalarNode) -> Any:
        try:
            return self._scalars.construct_object(node)
        except ValueError as e:  # e.g. `2024-02-30` or `!!int x`: PyYAML lets these escape as ValueError
            raise YamlError(_line(node), f"{node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}: {e}",
                            "quote the value to make it a string") from None

    def _sequence(self, node: Node) -> SourceList:
        if node.tag != _SEQ_TAG or not isinstance(node, SequenceNode):
            raise YamlError(_line(node), f"unsupported YAML tag {node.tag!r}", "remove the tag")
        result = SourceList(_line(node))
        for item in node.value:
            result._add(self.build(item), _line(item))
        return result

    def _mapping(self, node: MappingNode) -> SourceMap:
        if node.tag != _MAP_TAG:
            raise YamlError(_line(node), f"unsupported YAML tag {node.tag!r}", "remove the tag")
        result = SourceMap(_line(node))
        explicit = [(k, v) for k, v in node.value if k.tag != _MERGE_TAG]
        # `<<: *defaults` (or a list of them): explicit keys win, and earlier merged mappings win over later ones.
        for merge_key, merge_value in (pair for pair in node.value if pair[0].tag == _MERGE_TAG):
            for merged in reversed(self._merged_maps(merge_key, merge_value)):
                for key, value in merged.items():
                    result._set(key, value, merged.key_line(key))
        seen: dict[Any, int] = {}
        for key_node, value_node in explicit:
            key = self._key(key_node)
            if key in seen:
                raise YamlError(_line(key_node), f"duplicate key {key!r} (first at line {seen[key]})",
                                "remove or rename one of them: YAML would silently keep only the last")
            seen[key] = _line(key_node)
            result._set(key, self.build(value_node), _line(key_node))
        return result

    def _merged_maps(self, key_node: Node, value_node: Node) -> list[SourceMap]:
        nodes = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
        maps = [self.build(n) for n in nodes]
        if not all(isinstance(m, SourceMap) for m in maps):
            raise YamlError(_line(key_node), "`<<` must merge a mapping or a list of mappings", "merge an anchored mapping: `<<: *name`")
        return maps

    def _key(self, node: Node) -> Any:
        if not isinstance(node, ScalarNode):
            raise YamlError(_line(node), "a list or mapping cannot be a key", "use a plain name as the key")
        return self._scalar(node)


def describe(value: Any) -> str:
    """A YAML value as an error message names it: its kind for a mapping or a list, else its (shortened) repr."""
    if value is None:
        return "empty"
    if isinstance(value, dict | list):
        return "a mapping" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
