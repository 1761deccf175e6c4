"""Prices per token, and the cost of a model call, exactly as ccusage computes them offline.

Claude Code's transcripts carry tokens and no cost, and the number people
compare busd's against is ccusage's (``ccusage session --offline``). So the
table is ccusage's own offline data (a snapshot of LiteLLM's
``model_prices_and_context_window.json``), shipped as ``busd/data/prices.json``
and regenerated from the installed ccusage by
``contrib/agents/update_prices.py``, and the rules below are ccusage
17.2.1's (``LiteLLMPricingFetcher`` in its ``dist/data-loader-*.js``):

- **Matching a model name** (:meth:`PriceTable.price_of`): the name itself,
  then the name behind each provider prefix of the table in order
  (``anthropic/``, ``claude-3-5-``, ``claude-3-``, ``claude-``,
  ``openrouter/openai/``); case-sensitive. Failing those, the first entry in
  table order whose key contains the name or is contained in it, compared in
  lower case: ``claude-opus-4-1-20990101`` finds ``claude-opus-4-1``,
  ``sonnet`` finds the first ``sonnet`` key. Nothing found: unknown.
- **Cost** (:meth:`PriceTable.cost_usd`): input, output, cache write and
  cache read, each priced on its own. A field whose count is above 200,000
  and whose entry has an ``above_200k`` price pays the base price for the
  first 200,000 and that price for the rest; the threshold is per field,
  not per prompt. A price the entry lacks costs nothing. Reasoning tokens
  are not priced apart: they are inside the output for Anthropic and OpenAI.

Where busd differs on purpose: ccusage prices an unknown model at 0, busd
says ``None`` (unknown is not free); the empty name is unknown too.

Everything here is pure: :class:`PriceTable` is built from the JSON bytes.
The shipped table is read once, on first use, from the package's own data
(like reading a module's source: no other I/O).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Final

import msgspec

from .events import TokenUsage

__all__ = [
    "TIER_THRESHOLD",
    "ModelPrice",
    "PriceTable",
    "bundled_table",
    "cost_usd",
    "price_of",
]

TIER_THRESHOLD: Final = 200_000
"""Tokens of one field above which an entry's ``above_200k`` price applies (ccusage's)."""

_REMEMBERED: Final = 4096
"""Names whose match a table remembers: a bound, whatever names a transcript holds."""


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One entry of the price table, in USD per token; ``None`` where the table has no price.

    ``model`` is the table's key that the asked name matched, which may be
    another spelling (a dated or prefixed one) of the asked name.
    """

    model: str
    input: float | None = None
    output: float | None = None
    cache_write: float | None = None
    cache_read: float | None = None
    input_above_200k: float | None = None
    output_above_200k: float | None = None
    cache_write_above_200k: float | None = None
    cache_read_above_200k: float | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None


class _Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model of ``prices.json``, in LiteLLM's own field names.

    Unknown fields are refused, so a new kind of price in a future snapshot
    fails the update instead of being silently left out of the cost.
    """

    input_cost_per_token: float | None = None
    output_cost_per_token: float | None = None
    cache_creation_input_token_cost: float | None = None
    cache_read_input_token_cost: float | None = None
    input_cost_per_token_above_200k_tokens: float | None = None
    output_cost_per_token_above_200k_tokens: float | None = None
    cache_creation_input_token_cost_above_200k_tokens: float | None = None
    cache_read_input_token_cost_above_200k_tokens: float | None = None
    max_tokens: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None


class _TableFile(msgspec.Struct, frozen=True, kw_only=True):
    """``prices.json``: its source, the matching prefixes, and the models in order."""

    source: str
    source_url: str
    ccusage_version: str
    date: str
    generator: str
    provider_prefixes: list[str]
    models: dict[str, _Entry]


def _price(key: str, e: _Entry) -> ModelPrice:
    return ModelPrice(
        model=key,
        input=e.input_cost_per_token,
        output=e.output_cost_per_token,
        cache_write=e.cache_creation_input_token_cost,
        cache_read=e.cache_read_input_token_cost,
        input_above_200k=e.input_cost_per_token_above_200k_tokens,
        output_above_200k=e.output_cost_per_token_above_200k_tokens,
        cache_write_above_200k=e.cache_creation_input_token_cost_above_200k_tokens,
        cache_read_above_200k=e.cache_read_input_token_cost_above_200k_tokens,
        max_input_tokens=e.max_input_tokens,
        max_output_tokens=e.max_output_tokens,
    )


def _tiered(tokens: int, base: float | None, above: float | None) -> float:
    """ccusage's ``calculateTieredCost``, same operations in the same order (so the same float)."""
    if tokens <= 0:
        return 0.0
    if tokens > TIER_THRESHOLD and above is not None:
        cost = max(0, tokens - TIER_THRESHOLD) * above
        if base is not None:
            cost += min(tokens, TIER_THRESHOLD) * base
        return cost
    if base is not None:
        return tokens * base
    return 0.0


class PriceTable:
    """A price table and ccusage's rules over it; lookups are remembered per name."""

    __slots__ = ("_found", "ccusage_version", "date", "prefixes", "prices", "source")

    def __init__(self, data: bytes | str) -> None:
        """Parse ``prices.json``; a malformed table raises :class:`msgspec.ValidationError`."""
        doc = msgspec.json.decode(data, type=_TableFile)
        self.source: Final = doc.source
        self.ccusage_version: Final = doc.ccusage_version
        self.date: Final = doc.date
        self.prefixes: Final = tuple(doc.provider_prefixes)
        self.prices: Final = {key: _price(key, e) for key, e in doc.models.items()}
        self._found: dict[str, ModelPrice | None] = {}

    def price_of(self, model: str) -> ModelPrice | None:
        """The entry ``model`` matches by ccusage's rules (module docstring), or ``None``."""
        try:
            return self._found[model]
        except KeyError:
            found = self._match(model)
            if len(self._found) < _REMEMBERED:
                self._found[model] = found
            return found

    def _match(self, model: str) -> ModelPrice | None:
        if not model:
            return None
        for candidate in (model, *(prefix + model for prefix in self.prefixes)):
            if (price := self.prices.get(candidate)) is not None:
                return price
        lower = model.lower()
        for key, price in self.prices.items():
            folded = key.lower()
            if lower in folded or folded in lower:
                return price
        return None

    def cost_usd(self, model: str, usage: TokenUsage) -> float | None:
        """USD of one call of ``model`` with ``usage``; ``None`` when the model is unknown.

        ``usage.cost_usd`` is not looked at: this prices the tokens.
        """
        p = self.price_of(model)
        if p is None:
            return None
        return (
            _tiered(usage.input_tokens, p.input, p.input_above_200k)
            + _tiered(usage.output_tokens, p.output, p.output_above_200k)
            + _tiered(usage.cache_write_tokens, p.cache_write, p.cache_write_above_200k)
            + _tiered(usage.cache_read_tokens, p.cache_read, p.cache_read_above_200k)
        )


@cache
def bundled_table() -> PriceTable:
    """The table shipped in ``busd/data/prices.json``, read once."""
    return PriceTable((resources.files("busd") / "data" / "prices.json").read_bytes())


def price_of(model: str) -> ModelPrice | None:
    """The shipped table's entry for ``model`` (see :meth:`PriceTable.price_of`)."""
    return bundled_table().price_of(model)


def cost_usd(model: str, usage: TokenUsage) -> float | None:
    """USD of one call priced by the shipped table, ``None`` for an unknown model.

    For a session, price each call and add: the 200k tiers apply per call.
    """
    return bundled_table().cost_usd(model, usage)
