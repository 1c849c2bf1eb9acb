"""Versioned price table: dollars per million input and output tokens.

The default table is ``PRICE_TABLE`` (its ``version``
and ``source`` fields say where the numbers come from); a user table is the same shape in
JSON. A model without a price is refused with a ``KeyError``: it is never priced at zero.
Token counts come from the API's ``usage`` fields when serving; offline,
:func:`estimate_tokens` uses the documented rule of thumb of one token per four characters
(OpenAI's guidance for English text), rounded up, at least one token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from canopy.validation import check_nonnegative

__all__ = ["CHARS_PER_TOKEN", "Price", "PriceTable", "estimate_tokens"]

CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str | int) -> int:
    """Offline token estimate: ``ceil(len(text) / 4)``, at least 1 (``text`` may be given
    by its length in characters)."""
    length = text if isinstance(text, int) else len(text)
    return max(1, math.ceil(length / CHARS_PER_TOKEN))


@dataclass(frozen=True)
class Price:
    """Dollars per million input and output tokens."""

    input: float
    output: float

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            object.__setattr__(self, name,
                               check_nonnegative(getattr(self, name), f"price {name}"))


class PriceTable:
    """A named, versioned map model -> :class:`Price`."""

    def __init__(self, prices: Mapping[str, Price], *, version: str, source: str = "") -> None:
        if not version:
            raise ValueError("a price table needs a version")
        self.version = version
        self.source = source
        self._prices = dict(prices)

    @classmethod
    def from_mapping(cls, table: Mapping[str, object]) -> PriceTable:
        """From ``{"version": ..., "models": {name: {"input": x, "output": y}}}``."""
        try:
            version = str(table["version"])
            models = table["models"]
        except KeyError as missing:
            raise ValueError(f"price table lacks the {missing} field") from None
        if not isinstance(models, Mapping):
            raise TypeError("price table 'models' must map model names to prices")
        prices = {}
        for model, entry in models.items():
            if not isinstance(entry, Mapping) or set(entry) - {"input", "output", "note"} or \
                    not {"input", "output"} <= set(entry):
                raise ValueError(f"price of {model!r} must be {{'input': x, 'output': y}}, "
                                 f"got {entry!r}")
            prices[str(model)] = Price(entry["input"], entry["output"])
        return cls(prices, version=version, source=str(table.get("source", "")))

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        from canopy import safeio

        text = safeio.read_text(path, max_bytes=safeio.MiB, what="price table")
        return cls.from_mapping(safeio.parse_json(text, file=path))

    @classmethod
    def default(cls) -> PriceTable:
        """The table shipped with Canopy (:mod:`canopy.apps.routing.price_table`)."""
        from canopy.apps.routing.price_table import PRICE_TABLE

        return cls.from_mapping(PRICE_TABLE)

    def price(self, model: str) -> Price:
        try:
            return self._prices[model]
        except KeyError:
            raise KeyError(f"no price for model {model!r} in price table {self.version}; "
                           "add it (models are never priced at zero)") from None

    def cost(self, model: str, input_tokens: float, output_tokens: float) -> float:
        """Dollars for one call."""
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            try:
                finite = math.isfinite(value)
            except OverflowError:  # an integer too large for a float
                finite = False
            if not finite or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {str(value)[:40]}")
        price = self.price(model)
        return (price.input * input_tokens + price.output * output_tokens) / 1e6

    def __contains__(self, model: object) -> bool:
        return model in self._prices

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._prices)
