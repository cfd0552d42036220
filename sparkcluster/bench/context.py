"""The served context and bench's request size: vLLM refuses (HTTP 400) a request whose prompt or output alone passes
the model's `max_model_len`, which `/v1/models` lists, and cuts short the output of one whose prompt and output
together pass it (which would skew every figure). bench's default sizes are halved until they fit with room to spare;
a size the user gave is kept, and refused here, with the numbers, when it cannot fit. llama-benchy's grid is held to
the context by the same halving (halved_to_fit, with its depth reserved: methods/llama_benchy/fit.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.errors import EXIT_USAGE, SparkclusterError

# The share of the context the fitted defaults may fill: the prompt is calibrated from the server's usage to about
# its size (sweep.calibrate), not to the token.
FILL = 0.75


class DoesNotFit(SparkclusterError):
    """The sizes the user gave pass the served context: refused before any request is measured (exit 2)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message, fix, EXIT_USAGE)


@dataclass(frozen=True)
class Sizes:
    """A request's prompt and output tokens, and which of them the user gave (a default may be fitted)."""

    prompt_tokens: int
    output_tokens: int
    prompt_given: bool = True
    output_given: bool = True


def max_model_len(doc: object, model: str) -> int | None:
    """The served context of `model` in a /v1/models document (vLLM's `max_model_len`), None where not listed."""
    data = doc.get("data") if isinstance(doc, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


def fit(sizes: Sizes, context: int | None) -> Sizes:
    """`sizes` within a served context of `context` tokens: the defaults halved until they fit (a default prompt with
    room to spare: FILL); DoesNotFit when what the user gave passes it (or the context is too small for any
    request)."""
    if context is None:
        return sizes
    halved = halved_to_fit(sizes, context)
    prompt, output = halved.prompt_tokens, halved.output_tokens
    if prompt + output > context:
        given = [f"--{name}-tokens {value}" for name, value, was_given in (
            ("prompt", prompt, sizes.prompt_given), ("output", output, sizes.output_given)) if was_given]
        example = _halved(Sizes(sizes.prompt_tokens, sizes.output_tokens, False, False), int(context * FILL))
        raise DoesNotFit(f"{' and '.join(given) or 'the smallest request'} cannot fit the served context: the "
                         f"server's max_model_len is {context} tokens (its /v1/models), and a request's prompt and "
                         f"output ({prompt} + {output} = {prompt + output} tokens) must fit in it",
                         f"give --prompt-tokens and --output-tokens that sum to {context} or less, e.g. "
                         f"--prompt-tokens {example[0]} --output-tokens {example[1]}")
    return halved


def halved_to_fit(sizes: Sizes, context: int, reserved: int = 0) -> Sizes:
    """`sizes` with the ones not given halved until a request of `reserved` tokens before its prompt (llama-benchy's
    depth), the prompt and the output fits `context` (a default prompt with room to spare: FILL); what the sizes
    given leave may still pass it, which each method words in its own flags."""
    room = context - reserved  # the spare share is of what the depth leaves, not of the whole context
    limit = room if sizes.prompt_given else int(room * FILL)
    prompt, output = _halved(sizes, limit)
    return Sizes(prompt, output, sizes.prompt_given, sizes.output_given)


def _halved(sizes: Sizes, limit: int) -> tuple[int, int]:
    """The sizes the user did not give, halved together until the two fit `limit` or can shrink no more."""
    prompt, output = sizes.prompt_tokens, sizes.output_tokens
    while prompt + output > limit and ((not sizes.prompt_given and prompt > 1) or
                                       (not sizes.output_given and output > 1)):
        prompt = prompt if sizes.prompt_given else max(1, prompt // 2)
        output = output if sizes.output_given else max(1, output // 2)
    return prompt, output


TOKENS_PER_WORD_AT_MOST = 4  # of the prompt's words, by any tokenizer bench is likely to meet
