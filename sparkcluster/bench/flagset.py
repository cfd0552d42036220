"""The flags one mode of bench reads (the closed loop's, llama-benchy's, one endpoint's), with their defaults read
from their declarations in bench's parser: the one source of them, where hand-kept tables beside the parser once
repeated each default. A flag of another mode given (not at its default) would be silently ignored: `given` names
it, for the refusal."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class FlagSet:
    defaults: dict[str, object]  # dest -> its default, as declared

    @classmethod
    def of(cls, actions: Iterable[argparse.Action]) -> FlagSet:
        return cls({action.dest: action.default for action in actions})

    def given(self, args: argparse.Namespace, leave: tuple[str, ...] = ()) -> list[str]:
        """Each flag of the set `args` holds at other than its default (`leave`: read elsewhere), as --its-name."""
        return ["--" + name.replace("_", "-") for name, default in self.defaults.items()
                if getattr(args, name) != default and name not in leave]
