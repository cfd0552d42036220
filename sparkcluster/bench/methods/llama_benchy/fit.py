"""llama-benchy's grid and the served context. vLLM refuses (HTTP 400) a request whose depth and prompt fill the model's
`max_model_len` (`/v1/models` lists it), and cuts short the output of one whose output then passes it; llama-benchy
0.4.0 sends every such request anyway, and fails the cell on its 400s or measures a tg it never got. Here the grid is
checked against the context before any request: the default --pp (2048) is halved until every cell fits
(bench/context.py's rule, with room to spare beside the depth), once for the whole grid so every depth keeps the same
pp, and no further than MIN_FITTED_PP; --tg is kept (its default of 32 is short already, and a decode figure needs
tokens), and so is anything given, a profile's whole grid included. A grid that cannot fit is refused (exit 2),
naming the cell that passes most and the largest size that would fit.

With prompts adapted (the default) the server sees depth + pp tokens, the chat template's own overhead taken off;
--no-adapt-prompt and --no-cache add a few tokens this cannot know before the warm-up, so a cell at the very edge may
still get its 400, told by the server's message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...context import DoesNotFit, Sizes, halved_to_fit
from .schedule import Cell

MIN_FITTED_PP = 64  # the default --pp is halved no further than this; below, the grid is refused


@dataclass(frozen=True)
class Fitted:
    cells: tuple[Cell, ...]
    note: str | None  # what was changed to fit, for the progress lines; None when nothing was


def tokens(cell: Cell) -> int:
    """What one request of `cell` takes of the context: its depth, its prompt and its output."""
    return cell.depth + cell.pp + cell.tg


def fit_grid(cells: Sequence[Cell], context: int | None, pp_given: bool, profile: str | None = None) -> Fitted:
    """`cells` within a served context of `context` tokens (None: not listed, nothing to check); DoesNotFit (exit 2)
    when a cell cannot fit. `profile`: the name of the profile that set the grid, which then stays as it is."""
    if context is None or not cells:
        return Fitted(tuple(cells), None)
    worst = max(cells, key=tokens)
    pp = worst.pp
    if not pp_given and profile is None:
        pp = halved_to_fit(Sizes(worst.pp, worst.tg, prompt_given=False, output_given=True), context,
                           reserved=worst.depth).prompt_tokens
    if pp < MIN_FITTED_PP < worst.pp:  # a prompt of a few tokens measures no prefill: refuse at the smallest default
        smallest = tuple(replace(c, pp=MIN_FITTED_PP) for c in cells)
        raise refusal(smallest, max(smallest, key=tokens), context, profile)
    fitted = tuple(replace(c, pp=pp) for c in cells) if pp != worst.pp else tuple(cells)
    worst = max(fitted, key=tokens)
    if tokens(worst) > context:
        raise refusal(fitted, worst, context, profile)
    note = None if pp == cells[0].pp else (
        f"the served context is {context} tokens (max_model_len): pp {pp}, the default {cells[0].pp} halved to fit "
        f"beside depth {worst.depth} and tg {worst.tg}; --pp sets it")
    return Fitted(fitted, note)


def refusal(cells: Sequence[Cell], worst: Cell, context: int, profile: str | None) -> DoesNotFit:
    over = sum(1 for c in cells if tokens(c) > context)
    what = f"profile {profile}'s cell" if profile else "the cell"
    message = (f"{what} {worst.label} cannot fit the served context: the server's max_model_len is {context} tokens "
               f"(its /v1/models), and a request's depth, prompt and output ({worst.depth} + {worst.pp} + {worst.tg} "
               f"= {tokens(worst)} tokens) must fit in it ({over} of {len(cells)} cells pass it); llama-benchy "
               "would send them anyway, each refused (HTTP 400) or its output cut short of --tg")
    serve = f"serve the model with --max-model-len {tokens(worst)} or more"
    if profile:
        return DoesNotFit(message, f"{serve}, or run a profile YAML whose depths fit")
    return DoesNotFit(message, f"{largest(worst, context)}; or {serve}")


def largest(cell: Cell, context: int) -> str:
    """The largest size that fits beside the cell's others: the prompt first, then the depth."""
    if context - cell.depth - cell.tg >= 1:
        return (f"the largest --pp that fits at --depth {cell.depth} with --tg {cell.tg} is "
                f"{context - cell.depth - cell.tg}")
    if context - cell.pp - cell.tg >= 0:
        return (f"the largest --depth that fits with --pp {cell.pp} and --tg {cell.tg} is "
                f"{context - cell.pp - cell.tg}")
    return f"give --depth, --pp and --tg that sum to {context} or less"
