"""Time-to-first-token model: prefill time linear in the uncached prompt tokens.

``ttft = overhead_ms + ms_per_token * uncached_tokens``, so a cache hit of ``n`` tokens saves
``ms_per_token * n`` milliseconds. The defaults are illustrative, not measured here: about
10,000 prefill tokens a second (0.1 ms a token) and 20 ms of fixed overhead, the order of a
7B model on one datacenter GPU. Calibrate both to your engine (time TTFT at two prompt lengths
with caching off; the slope is ``ms_per_token``); the paper's Appendix E uses a GPU-calibrated
model of the same linear form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from canopy.validation import check_nonnegative

__all__ = ["TTFTModel", "load_calibration"]


@dataclass(frozen=True)
class TTFTModel:
    """Linear prefill-time model (milliseconds)."""

    ms_per_token: float = 0.1
    overhead_ms: float = 20.0

    def __post_init__(self) -> None:
        for field in ("ms_per_token", "overhead_ms"):
            check_nonnegative(getattr(self, field), field)

    def ttft_ms(self, uncached_tokens: np.ndarray) -> np.ndarray:
        """Time to first token of requests with ``uncached_tokens`` to prefill."""
        return self.overhead_ms + self.ms_per_token * np.asarray(uncached_tokens, dtype=float)

    def saved_ms(self, cached_tokens: np.ndarray) -> np.ndarray:
        """Time saved by serving ``cached_tokens`` from the cache."""
        return self.ms_per_token * np.asarray(cached_tokens, dtype=float)


def load_calibration(file: str | Path) -> TTFTModel:
    """The TTFT model of a calibration file written by ``canopy cache live --calibration-out``
    (the least-squares fit of TTFT on uncached tokens over a live engine's requests)."""
    from canopy import safeio

    text = safeio.read_text(file, max_bytes=safeio.MiB, what="calibration file")
    try:
        fitted = safeio.parse_json(text, file=file)["calibration"]
        return TTFTModel(ms_per_token=fitted["ms_per_token"], overhead_ms=fitted["overhead_ms"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"{file}: not a calibration file of canopy cache live "
                         f"({type(error).__name__}: {error})") from None
