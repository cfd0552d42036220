"""Community recipe files as PyYAML reads them, with the lines of every key kept for `file:line` errors.

eugr's and sparkrun's loaders call `yaml.safe_load`, which keeps the last of two equal keys without a word, and
real community files rely on it (one of eugr's recipes names `container:` twice). The engine's loader refuses
duplicates, as an inventory must; a community recipe is read the way its own tools read it instead: the last one
wins, and a warning names both lines so the user sees which value is served.

An alias (`*name`, and `<<: *name`) is refused at its line: none of the community's 76 recipe and manifest files
uses one, and an alias tree expanded by the include merge or by rendering took minutes and gigabytes (round 5, H1).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode

from ..engine import yamlsource
from ..engine.yamlsource import SourceMap

ALIAS_FIX = "write the value out where it is used: recipes do not use YAML anchors and aliases"


class _NoAliases(yaml.SafeLoader):
    """PyYAML's composer, stopped at the first alias before any node is shared."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yamlsource.YamlError(event.start_mark.line + 1, f"the alias *{event.anchor} repeats a value",
                                       ALIAS_FIX)
        return super().compose_node(parent, index)


class _LastWins(yamlsource._Builder):
    def __init__(self, warnings: list[str]) -> None:
        super().__init__()
        self.warnings = warnings

    def _mapping(self, node: MappingNode) -> SourceMap:
        seen: dict[Any, int] = {}
        kept: list[tuple[Any, Any]] = []
        for key_node, value_node in node.value:
            if key_node.tag == yamlsource._MERGE_TAG:
                kept.append((key_node, value_node))
                continue
            key = self._key(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                self.warnings.append(f"line {line}: {key!r} is given twice (lines {seen[key]} and {line}); "
                                     f"the last one wins, as PyYAML reads it")
                kept = [(k, v) for k, v in kept if k.tag == yamlsource._MERGE_TAG or self._key(k) != key]
            seen[key] = line
            kept.append((key_node, value_node))
        node.value = kept
        return super()._mapping(node)


def load_last_wins(text: str) -> tuple[Any, list[str]]:
    """The document (SourceMap/SourceList as the engine's loader builds them) and one warning per repeated key."""
    warnings: list[str] = []
    try:
        node = yaml.compose(text, Loader=_NoAliases)
    except yaml.YAMLError:
        return yamlsource.load(text), warnings  # the engine's loader words the syntax error with its line
    if node is None:
        return None, warnings
    try:
        return _LastWins(warnings).build(node), warnings
    except yaml.MarkedYAMLError:
        return yamlsource.load(text), warnings
    except RecursionError:
        raise yamlsource.YamlError(1, "the document is nested too deeply", "flatten the structure") from None
