"""A tiny decoder-only transformer in numpy, with and without a KV cache, and the KV cache's size (notebook 08).

An LLM answers a request in a loop: a *prefill* step runs the whole prompt through the model, then every
*decode* step adds one token.  Attention at a position needs the keys and values of every earlier
position.  Without a cache each step recomputes them for the whole sequence so far; with a cache each
step computes them for its one new token and appends them.  :class:`TinyDecoder` does both, so a lesson
can check that they give the same tokens and measure what the cache saves; :func:`kv_bytes_per_token`
is the formula for what the cache costs in memory.

The weights are seeded random numbers: the model is untrained and its tokens mean nothing, but its
arithmetic is a real (small) transformer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int

__all__ = ["MODEL_SHAPES", "KVCache", "TinyDecoder", "kv_bytes_per_token", "kv_cache_bytes"]

# Published shapes (layers, KV heads, head size) of a few open models; fp16 values are 2 bytes.
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "OPT-13B": {"layers": 40, "kv_heads": 40, "head_dim": 128},      # the vLLM paper's example
    "Llama-2-7B": {"layers": 32, "kv_heads": 32, "head_dim": 128},   # multi-head attention
    "Llama-2-70B": {"layers": 80, "kv_heads": 8, "head_dim": 128},   # grouped-query attention
    "Llama-3-8B": {"layers": 32, "kv_heads": 8, "head_dim": 128},    # grouped-query attention
}


def _positive_int(name: str, value: object) -> int:
    return check_count(name, value)


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2) -> int:
    """Bytes of KV cache one token occupies: 2 (a key and a value) x layers x KV heads x head size x bytes.

    Llama-2-7B in fp16 keeps half a mebibyte per token; Llama-3-8B shares each key/value head among four
    query heads (grouped-query attention), so a quarter of that:

    >>> kv_bytes_per_token(**MODEL_SHAPES["Llama-2-7B"]) / 2**20
    0.5
    >>> kv_bytes_per_token(**MODEL_SHAPES["Llama-3-8B"]) // 2**10
    128
    >>> kv_bytes_per_token(layers=0, kv_heads=8, head_dim=128)
    Traceback (most recent call last):
    ...
    ValueError: layers must be an integer >= 1, got 0
    """
    return (2 * _positive_int("layers", layers) * _positive_int("kv_heads", kv_heads)
            * _positive_int("head_dim", head_dim) * _positive_int("bytes_per_value", bytes_per_value))


def kv_cache_bytes(tokens: int, *, layers: int, kv_heads: int, head_dim: int, bytes_per_value: int = 2) -> int:
    """Bytes of KV cache for ``tokens`` tokens (summed over every sequence that holds them).

    >>> kv_cache_bytes(4096, **MODEL_SHAPES["Llama-2-7B"]) / 2**30   # one full 4k context
    2.0
    """
    per_token = kv_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                                   bytes_per_value=bytes_per_value)
    return check_non_negative_int("tokens", tokens) * per_token


@dataclass
class KVCache:
    """The keys and values of one sequence's tokens so far, for every layer: ``(layers, heads, capacity, head_dim)``.

    Only the first ``length`` positions hold tokens; :attr:`nbytes` counts those.
    """

    keys: np.ndarray
    values: np.ndarray
    length: int = 0

    @property
    def capacity(self) -> int:
        """How many tokens this cache has room for."""
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes the cached tokens occupy (keys and values)."""
        return int(self.keys[:, :, : self.length].nbytes + self.values[:, :, : self.length].nbytes)


class TinyDecoder:
    """A decoder-only transformer with seeded random weights: ``layers`` x (attention + MLP), pre-norm.

    :meth:`logits_without_cache` recomputes every position; :meth:`prefill` and :meth:`decode` keep a
    :class:`KVCache`.  ``rows_computed`` counts the token positions pushed through the layers' weight
    matrices, the work the cache saves.  Greedy generation is the same either way:

    >>> model = TinyDecoder(seed=0)
    >>> prompt = [3, 14, 15, 92]
    >>> model.generate(prompt, 6, use_cache=True) == model.generate(prompt, 6, use_cache=False)
    True
    >>> cache = model.prefill(prompt)[1]
    >>> cache.length, cache.nbytes == len(prompt) * model.kv_bytes_per_token
    (4, True)
    """

    def __init__(self, *, vocab: int = 256, layers: int = 4, heads: int = 4, head_dim: int = 32,
                 max_positions: int = 1024, seed: int = 0, dtype: type = np.float32):
        self.vocab = _positive_int("vocab", vocab)
        self.layers = _positive_int("layers", layers)
        self.heads = _positive_int("heads", heads)
        self.head_dim = _positive_int("head_dim", head_dim)
        self.max_positions = _positive_int("max_positions", max_positions)
        self.dtype: np.dtype = np.dtype(dtype)
        d = self.heads * self.head_dim
        rng = np.random.default_rng(seed)

        def weight(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(self.dtype)

        self.token_embedding = rng.standard_normal((self.vocab, d)).astype(self.dtype)
        self.position_embedding = (0.1 * rng.standard_normal((self.max_positions, d))).astype(self.dtype)
        self.blocks = [{name: weight(*shape) for name, shape in
                        (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
                         ("w1", (d, 4 * d)), ("w2", (4 * d, d)))} for _ in range(self.layers)]
        self.unembed = weight(d, self.vocab)
        self.rows_computed = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """This model's KV cache per token, by the formula (its values are ``dtype``-sized)."""
        return kv_bytes_per_token(layers=self.layers, kv_heads=self.heads, head_dim=self.head_dim,
                                  bytes_per_value=self.dtype.itemsize)

    def new_cache(self, capacity: int) -> KVCache:
        """An empty cache with room for ``capacity`` tokens."""
        shape = (self.layers, self.heads, _positive_int("capacity", capacity), self.head_dim)
        return KVCache(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype))

    def _check_tokens(self, tokens: Sequence[int], start: int) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError(f"tokens must be a non-empty sequence of token ids, got {tokens!r}")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise ValueError(f"token ids must lie in [0, {self.vocab}), got {tokens!r}")
        if start + len(ids) > self.max_positions:
            raise ValueError(f"{start + len(ids)} positions exceed max_positions={self.max_positions}")
        return ids

    def _run(self, ids: np.ndarray, cache: KVCache) -> np.ndarray:
        """Run new tokens ``ids`` (positions ``cache.length`` on) through every layer, filling the cache."""
        start, n = cache.length, len(ids)
        if start + n > cache.capacity:
            raise ValueError(f"the cache holds {cache.capacity} tokens; {start + n} do not fit")
        x = self.token_embedding[ids] + self.position_embedding[start:start + n]
        end = start + n
        # query i (position start + i) may see keys 0..start + i: causal mask over the new rows only
        mask = np.arange(end)[None, :] > (start + np.arange(n))[:, None]
        for layer, w in enumerate(self.blocks):
            h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            q = (h @ w["wq"]).reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
            cache.keys[layer, :, start:end] = (h @ w["wk"]).reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
            cache.values[layer, :, start:end] = (h @ w["wv"]).reshape(n, self.heads, self.head_dim).transpose(1, 0, 2)
            scores = q @ cache.keys[layer, :, :end].transpose(0, 2, 1) / np.sqrt(self.head_dim)
            scores = np.where(mask, -np.inf, scores)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended = (scores / scores.sum(axis=-1, keepdims=True)) @ cache.values[layer, :, :end]
            x = x + attended.transpose(1, 0, 2).reshape(n, -1) @ w["wo"]
            h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            x = x + np.maximum(h @ w["w1"], 0) @ w["w2"]
        cache.length = end
        self.rows_computed += n
        return x[-1] @ self.unembed

    def logits_without_cache(self, tokens: Sequence[int]) -> np.ndarray:
        """Next-token logits after ``tokens``, recomputing every position (no cache kept)."""
        ids = self._check_tokens(tokens, 0)
        return self._run(ids, self.new_cache(len(ids)))

    def prefill(self, tokens: Sequence[int], capacity: int | None = None) -> tuple[np.ndarray, KVCache]:
        """Run the prompt once: next-token logits and a cache (room for ``capacity`` tokens, default the max)."""
        ids = self._check_tokens(tokens, 0)
        cache = self.new_cache(capacity or self.max_positions)
        return self._run(ids, cache), cache

    def decode(self, token: int, cache: KVCache) -> np.ndarray:
        """One decode step: append ``token`` to the cached sequence, return the next-token logits."""
        return self._run(self._check_tokens([token], cache.length), cache)

    def generate(self, prompt: Sequence[int], n_new: int, *, use_cache: bool = True) -> list[int]:
        """Greedy generation of ``n_new`` tokens after ``prompt``, with or without a KV cache."""
        _positive_int("n_new", n_new)
        tokens = [int(t) for t in self._check_tokens(prompt, n_new - 1)]
        if use_cache:
            logits, cache = self.prefill(tokens, len(tokens) + n_new)
        else:
            logits = self.logits_without_cache(tokens)
        out = []
        for step in range(n_new):
            out.append(int(np.argmax(logits)))
            if step + 1 < n_new:
                logits = self.decode(out[-1], cache) if use_cache else self.logits_without_cache(tokens + out)
        return out
