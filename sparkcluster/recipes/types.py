"""What a recipe is once loaded, whatever format it was written in: the values serve uses, where it came from
and what it may not do (node counts), as one typed value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .command import FlagValue

Format = Literal["sparkcluster", "eugr v1", "sparkrun v2"]
RecipeLauncher = Literal["ray", "native"]


@dataclass(frozen=True)
class Reference:
    """Published rows measured with this recipe, and where and on what they were measured."""

    source: str
    hardware: str
    nodes: int
    rows: tuple[Mapping[str, float], ...]  # each with `concurrency` and some of REFERENCE_FIGURES


@dataclass(frozen=True)
class Mod:
    """A directory with run.sh that runs in every serving environment before vLLM starts."""

    name: str  # the directory's name: where it lands on the nodes
    path: Path  # where it was found on this machine
    given: str  # as the recipe wrote it, e.g. mods/fix-chat-template
    registry: str | None = None  # the registry it was found in; None: a file of this machine
    trusted: bool = True  # its registry is trusted (a local file is the user's own)


@dataclass(frozen=True)
class ModPlace:
    """A folder a recipe's mods are looked for in, and whose code a mod found there is: the folder's registry
    and that registry's trust travel with every mod found in it, so that trust follows the code, not the recipe
    that names it."""

    path: Path
    registry: str | None = None
    trusted: bool = True
    within: Path | None = None  # what a name found here must stay inside (default: `path`); paths.py
    kind: str = "mods folder"  # what the folder is, for messages ("recipe's folder")


@dataclass(frozen=True)
class Inputs:
    """What the user gave that fills a recipe's template: our options under the template names eugr and
    sparkrun use (tensor_parallel, pipeline_parallel, port, served_model_name), then each `--set KEY=VALUE`."""

    options: Mapping[str, str] = field(default_factory=dict)
    sets: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str = ""
    model: str | None = None
    served_model_name: str | None = None
    port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, FlagValue] = field(default_factory=dict)  # None: a bare flag
    reference: Reference | None = None
    format: Format = "sparkcluster"
    source: str = ""  # the file as shown in messages ("recipe default" for a bundled one)
    # A bundled recipe's file by content, hashed as it is loaded: it lies inside the installed package, so `source`
    # names no file a receipt could hash later. None for any other (serve hashes a recipe file as it launches).
    sha256: str | None = None
    tp: int | None = None
    pp: int | None = None
    launcher: RecipeLauncher | None = None
    container: str | None = None
    build_args: tuple[str, ...] = ()
    mods: tuple[Mod, ...] = ()
    min_nodes: int | None = None
    max_nodes: int | None = None
    replicas: int | None = None  # engines behind vLLM's router (our format's `replicas:`); None: one
    registry: str | None = None  # the registry it came from; None for a file or a bundled recipe
    trusted: bool = True
    warnings: tuple[str, ...] = ()
    sets_used: Mapping[str, str] = field(default_factory=dict)  # the --set values that filled the template
    # the registries, not trusted, whose base recipes it includes: their env, defaults and command are in it
    untrusted_bases: tuple[str, ...] = ()
