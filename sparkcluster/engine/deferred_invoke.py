"""invoke, loaded only where it is used.

paramiko imports invoke as it loads (its ssh_config module does), for one purpose: to run the command of an
ssh_config `Match exec` line. Without it paramiko's import takes 73 ms instead of 163 ms (the least of 9 runs of
`python -X importtime`; invoke brings its own YAML parser and unittest.mock): 90 ms of CPU at every command's first
connection, where sparkcluster uses none of it. install() puts a stand-in under invoke's name, which loads the
real invoke when one of its names is first used (a `Match exec` evaluated, or any other code's `from invoke import
...`) and gives way to it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _DeferredInvoke(types.ModuleType):
    def __getattr__(self, name: str) -> Any:  # called only for a name the stand-in does not have: all of invoke's
        if sys.modules.get("invoke") is self:
            del sys.modules["invoke"]
        return getattr(importlib.import_module("invoke"), name)


def install() -> None:
    """Before paramiko is imported: a no-op where invoke is loaded already."""
    sys.modules.setdefault("invoke", _DeferredInvoke("invoke"))
