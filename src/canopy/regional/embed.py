"""Region from text: a lightweight embedding (hashed character trigrams, L2-normalised)
and the nearest centroid of each region's example texts (cosine similarity)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["NearestCentroid", "embed"]

DIMENSION = 512


def embed(text: str, dimension: int = DIMENSION) -> np.ndarray:
    """Counts of the text's lower-cased character trigrams hashed (CRC-32) into
    ``dimension`` buckets, L2-normalised (zeros for an empty text)."""
    vector = np.zeros(dimension)
    padded = f"  {text.lower()} "
    for i in range(len(padded) - 2):
        vector[zlib.crc32(padded[i:i + 3].encode("utf-8")) % dimension] += 1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm > 0 else vector


class NearestCentroid:
    """``region(text)``: the region whose examples' mean embedding is closest."""

    def __init__(self, examples: Mapping[str, Sequence[str]]) -> None:
        if not examples or any(isinstance(v, str) or not v for v in examples.values()):
            raise ValueError("centroids must map each region to a non-empty list of texts")
        self.regions = tuple(examples)
        centroids = np.array([np.mean([embed(t) for t in examples[r]], axis=0)
                              for r in self.regions])
        norms = np.linalg.norm(centroids, axis=1, keepdims=True)
        self._centroids = centroids / np.where(norms > 0, norms, 1.0)

    def region(self, text: str) -> str:
        return self.regions[int(np.argmax(self._centroids @ embed(text)))]
