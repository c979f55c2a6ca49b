"""A tiny decoder-only transformer in numpy, with and without a KV cache, and the KV cache's size (notebook 08).

An LLM answers a request in a loop: a *prefill* step runs the whole prompt through the model, then every
*decode* step adds one token.  Attention at a position needs the keys and values of every earlier
position.  Without a cache each step recomputes them for the whole sequence so far; with a cache each
step computes them for its one new token and appends them.  :class:`TinyDecoder` does both, so a lesson
can check that they give the same tokens and measure what the cache saves; :func:`kv_bytes_per_token`
is the formula for what the cache costs in memory.  :meth:`TinyDecoder.decode_batch` runs one decode step
for a batch of sequences, and :func:`time_decode_step` measures what such a step costs against its batch.

The weights are seeded random numbers: the model is untrained and its tokens mean nothing, but its
arithmetic is a real (small) transformer's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int

__all__ = ["MODEL_SHAPES", "BatchKVCache", "DecodeStepTimes", "KVCache", "TinyDecoder", "kv_bytes_per_token",
           "kv_cache_bytes", "time_decode_step"]

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


@dataclass
class BatchKVCache:
    """The caches of a batch of sequences of one length, ``(layers, batch, heads, capacity, head_dim)``.

    Only the first ``length`` positions hold tokens; every sequence holds that many.
    """

    keys: np.ndarray
    values: np.ndarray
    length: int = 0

    @classmethod
    def stack(cls, caches: Sequence[KVCache], capacity: int | None = None) -> BatchKVCache:
        """One batch from sequences' caches of one length, with room for ``capacity`` tokens (default theirs)."""
        if not caches or len({c.length for c in caches}) != 1:
            raise ValueError("stack needs at least one cache, all holding the same number of tokens, got lengths "
                             f"{[c.length for c in caches]}")
        length = caches[0].length
        room = caches[0].capacity if capacity is None else _positive_int("capacity", capacity)
        if room < length:
            raise ValueError(f"capacity {room} is below the {length} tokens the caches hold")
        layers, heads, _, head_dim = caches[0].keys.shape
        shape = (layers, len(caches), heads, room, head_dim)
        keys, values = np.zeros(shape, caches[0].keys.dtype), np.zeros(shape, caches[0].values.dtype)
        for b, c in enumerate(caches):
            keys[:, b, :, :length] = c.keys[:, :, :length]
            values[:, b, :, :length] = c.values[:, :, :length]
        return cls(keys, values, length)

    @property
    def batch(self) -> int:
        """How many sequences the batch holds."""
        return int(self.keys.shape[1])

    @property
    def capacity(self) -> int:
        """How many tokens each sequence has room for."""
        return int(self.keys.shape[3])


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

    def decode_batch(self, tokens: Sequence[int], cache: BatchKVCache) -> np.ndarray:
        """One decode step for a batch: append ``tokens[b]`` to sequence ``b``; next-token logits, ``(batch, vocab)``.

        Each weight matrix multiplies a ``(batch, width)`` matrix where :meth:`decode` multiplies one row, so one
        pass over the weights serves the whole batch; attention reads each sequence's own cache.  The logits are
        :meth:`decode`'s, sequence by sequence:

        >>> model = TinyDecoder(seed=0, dtype=np.float64)
        >>> caches = [model.prefill(p, capacity=4)[1] for p in ([1, 2, 3], [7, 8, 9])]
        >>> batched = model.decode_batch([4, 10], BatchKVCache.stack(caches))
        >>> batched.shape, np.allclose(batched, [model.decode(4, caches[0]), model.decode(10, caches[1])])
        ((2, 256), True)
        """
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.shape != (cache.batch,):
            raise ValueError(f"tokens must hold one token id per sequence of the batch ({cache.batch}), got {tokens!r}")
        self._check_tokens(ids.tolist(), cache.length)
        t = cache.length
        if t + 1 > cache.capacity:
            raise ValueError(f"the cache holds {cache.capacity} tokens; {t + 1} do not fit")
        b, shape = len(ids), (len(ids), self.heads, self.head_dim)
        x = self.token_embedding[ids] + self.position_embedding[t]          # (batch, width)
        for layer, w in enumerate(self.blocks):
            h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            q = (h @ w["wq"]).reshape(shape)[:, :, None]                     # (batch, heads, 1, head_dim)
            cache.keys[layer, :, :, t] = (h @ w["wk"]).reshape(shape)
            cache.values[layer, :, :, t] = (h @ w["wv"]).reshape(shape)
            keys, values = cache.keys[layer, :, :, : t + 1], cache.values[layer, :, :, : t + 1]
            scores = q @ keys.transpose(0, 1, 3, 2) / np.sqrt(self.head_dim)   # the new token sees every position
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attended = (scores / scores.sum(axis=-1, keepdims=True)) @ values
            x = x + attended.reshape(b, -1) @ w["wo"]
            h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            x = x + np.maximum(h @ w["w1"], 0) @ w["w2"]
        cache.length = t + 1
        self.rows_computed += b
        return x @ self.unembed

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


@dataclass(frozen=True)
class DecodeStepTimes:
    """What :func:`time_decode_step` measured: the median seconds of one decode step, per batch size."""

    batch: np.ndarray       # sequences in the step
    seconds: np.ndarray     # median seconds of one step
    context: int            # tokens each sequence held in its cache
    repeats: int            # timed steps per batch size

    @property
    def per_token(self) -> np.ndarray:
        """Seconds per generated token: a step's time over the tokens it makes (one per sequence)."""
        return self.seconds / self.batch


def time_decode_step(model: TinyDecoder, batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32), *, context: int = 64,
                     repeats: int = 25, blas_threads: int | None = 1, seed: int = 0) -> DecodeStepTimes:
    """Time one decode step of ``model`` for each batch size: the median of ``repeats`` steps, after one untimed.

    Every sequence holds ``context`` tokens in its cache (copies of one seeded random prompt's cache: the
    arithmetic of that many different sequences); each timed step appends a token at position ``context``
    (the cache is rewound between steps, so every step does the same work).  ``blas_threads`` caps numpy's
    BLAS threads while timing (threadpoolctl; None leaves them), so a step measures one core, as a
    per-core cost should.

    >>> times = time_decode_step(TinyDecoder(seed=0), batch_sizes=(1, 4), context=8, repeats=3)
    >>> times.batch.tolist(), times.seconds.shape, bool(np.all(times.per_token <= times.seconds))
    ([1, 4], (2,), True)
    """
    sizes = [_positive_int("batch size", b) for b in batch_sizes]
    if not sizes:
        raise ValueError("batch_sizes must hold at least one batch size")
    context, repeats = _positive_int("context", context), _positive_int("repeats", repeats)
    prompt = np.random.default_rng(seed).integers(0, model.vocab, context).tolist()
    _, one = model.prefill(prompt, capacity=context + 1)
    limit = None
    if blas_threads is not None:
        from threadpoolctl import threadpool_limits  # only when a limit is asked for

        limit = threadpool_limits(limits=_positive_int("blas_threads", blas_threads), user_api="blas")
    try:
        medians = []
        for b in sizes:
            cache = BatchKVCache.stack([one] * b)
            tokens = [int(t) for t in np.random.default_rng(seed + b).integers(0, model.vocab, b)]
            seconds = []
            for k in range(repeats + 1):             # the first step warms up and is not counted
                cache.length = context
                started = time.perf_counter()
                model.decode_batch(tokens, cache)
                if k:
                    seconds.append(time.perf_counter() - started)
            medians.append(float(np.median(seconds)))
    finally:
        if limit is not None:
            limit.restore_original_limits()
    return DecodeStepTimes(np.array(sizes), np.array(medians), context, repeats)
