"""A tiny llama-architecture GGUF model with seeded random weights, written locally (notebook 08).

llama.cpp serves GGUF files.  Rather than download one, :func:`write_tiny_llama` writes a small model with
the ``gguf`` package (the llama.cpp project's own writer): the llama architecture (RMSNorm, rotary
attention with grouped KV heads, a SwiGLU feed-forward), N(0, 0.02) weights from a seeded generator, and a
SentencePiece-style vocabulary with the 256 byte-fallback tokens, so any text tokenizes.  The weights are
random, so the text it generates is gibberish; what the lesson needs is its *cost*, which is that of a real
model of the same shape.

Files are cached by parameter set (``$INFERGRAPH_CACHE`` or ``~/.cache/infergraph``), so a notebook or a
test that asks twice writes once.  ``gguf`` is imported only inside this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int

__all__ = ["ModelInfo", "cache_dir", "describe", "prompt_of", "trained_context_length", "write_tiny_llama"]

WRITER_VERSION = 2      # bump when the file layout changes, so cached files are rewritten

_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he",
    "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "they", "you", "were", "her", "she",
    "there", "been", "one", "all", "we", "their", "has", "would", "when", "if", "so", "no", "will", "more", "can",
    "its", "do", "what", "about", "up", "out", "them", "than", "then", "some", "into", "only", "other", "time",
    "could", "these", "two", "may", "first", "new", "like", "our", "over", "such", "model", "serve", "batch",
    "token", "cache", "page", "graph", "request", "queue", "latency", "throughput", "prefill", "decode", "slot",
    "kv", "gpu", "cpu", "memory"
)


@dataclass(frozen=True)
class ModelInfo:
    """What :func:`write_tiny_llama` wrote: the file, the model's shape and what it costs.

    ``kv_bytes_per_token`` is what one token of context holds in the KV cache with llama.cpp's default f16
    cache: ``2 (K and V) x layers x kv_heads x head_dim x 2 bytes``.
    """

    path: Path
    n_params: int
    n_vocab: int
    embd: int
    layers: int
    ff: int
    heads: int
    kv_heads: int
    ctx: int
    seed: int
    file_bytes: int

    @property
    def head_dim(self) -> int:
        return self.embd // self.heads

    @property
    def byte_token_ids(self) -> range:
        """The ids of the 256 byte-fallback tokens ``<0x00>`` .. ``<0xFF>`` (after ``<unk>``, ``<s>``, ``</s>``)."""
        return range(3, 3 + 256)

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """KV-cache bytes per token of context: 2 x layers x kv_heads x head_dim x ``bytes_per_value``.

        >>> info = ModelInfo(Path("m.gguf"), 0, 0, embd=256, layers=4, ff=768, heads=8, kv_heads=4, ctx=2048,
        ...                  seed=0, file_bytes=0)
        >>> info.kv_bytes_per_token()      # 2 * 4 * 4 * 32 * 2
        2048
        """
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value


def cache_dir() -> Path:
    """Where written models are kept: ``$INFERGRAPH_CACHE/llamacpp``, else ``~/.cache/infergraph/llamacpp``.

    Falls back to the system temp folder when the home folder cannot be written.

    >>> cache_dir().name
    'llamacpp'
    """
    root = os.environ.get("INFERGRAPH_CACHE")
    candidates = [Path(root)] if root else [Path.home() / ".cache" / "infergraph"]
    candidates.append(Path(tempfile.gettempdir()) / "infergraph-cache")
    for base in candidates:
        folder = base / "llamacpp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise OSError(f"no writable cache folder among {[str(c) for c in candidates]}; set INFERGRAPH_CACHE")


def _vocab() -> tuple[list[bytes], list[float], list[int]]:
    import gguf

    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, kind: int) -> None:
        tokens.append(text.encode("utf-8"))
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for b in range(256):                         # byte fallback: any UTF-8 text has a tokenization
        add(f"<0x{b:02X}>", 0.0, gguf.TokenType.BYTE)
    seen: set[str] = set()
    for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz.,!?'"):
        for piece in (ch, "\u2581" + ch):        # U+2581 marks a word start, as SentencePiece does
            if piece not in seen:
                seen.add(piece)
                add(piece, -1000.0 - i, gguf.TokenType.NORMAL)
    # Whole words, and every prefix of them: llama.cpp's SentencePiece tokenizer merges neighbouring pieces
    # only into pieces of the vocabulary, so "▁t" + "h" needs "▁th" on the way to "▁the".  Longer pieces
    # score higher, so a listed word becomes one token.
    for i, word in enumerate(_WORDS):
        for start in ("\u2581", ""):
            for end in range(2, len(word) + 1):
                piece = start + word[:end]
                if piece not in seen:
                    seen.add(piece)
                    add(piece, -float(i) - 1.0 - 100.0 * (len(word) - end), gguf.TokenType.NORMAL)
    add("\u2581", -2000.0, gguf.TokenType.NORMAL)
    return tokens, scores, types


def _check_shape(embd: int, layers: int, ff: int, heads: int, kv_heads: int, ctx: int, seed: int) -> dict[str, int]:
    # The shape as Python ints (numpy integers accepted: the shape goes into JSON and the GGUF header).
    shape = {name: check_count(name, value) for name, value in (
        ("embd", embd), ("layers", layers), ("ff", ff), ("heads", heads), ("kv_heads", kv_heads), ("ctx", ctx))}
    shape["seed"] = check_non_negative_int("seed", seed)
    embd, heads, kv_heads = shape["embd"], shape["heads"], shape["kv_heads"]
    if embd % heads:
        raise ValueError(f"embd ({embd}) must be a multiple of heads ({heads})")
    if (embd // heads) % 2:
        raise ValueError(f"head_dim = embd / heads = {embd // heads} must be even (rotary embedding pairs)")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    return shape


def _n_params(n_vocab: int, embd: int, layers: int, ff: int, heads: int, kv_heads: int) -> int:
    kv = kv_heads * (embd // heads)
    per_layer = 2 * embd * embd + 2 * kv * embd + 3 * ff * embd + 2 * embd
    return 2 * n_vocab * embd + layers * per_layer + embd


def write_tiny_llama(path: str | os.PathLike[str] | None = None, *, embd: int = 256, layers: int = 4, ff: int = 768,
                     heads: int = 8, kv_heads: int = 4, ctx: int = 4096, seed: int = 0) -> ModelInfo:
    """Write (or reuse) a llama-architecture GGUF with seeded N(0, 0.02) float32 weights; nothing downloaded.

    ``path=None`` keeps the file in :func:`cache_dir` under a name made from the parameters, and reuses it
    when it is already there (written atomically, so a half-written file is never reused).  ``ctx`` is the
    model's trained context length, the most a llama.cpp slot can hold.  Random weights generate gibberish.

    >>> info = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> info.path.suffix, info.n_vocab, info.head_dim, info.kv_bytes_per_token()
    ('.gguf', 730, 16, 128)
    >>> write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512) == info   # cached
    True
    >>> write_tiny_llama(embd=60, heads=8)
    Traceback (most recent call last):
    ValueError: embd (60) must be a multiple of heads (8)
    """
    shape = _check_shape(embd, layers, ff, heads, kv_heads, ctx, seed)
    embd, layers, ff, heads, kv_heads, seed = (shape[k] for k in ("embd", "layers", "ff", "heads", "kv_heads", "seed"))
    if path is None:
        key = hashlib.sha256(json.dumps({**shape, "v": WRITER_VERSION}, sort_keys=True).encode()).hexdigest()[:12]
        target = cache_dir() / f"tiny-llama-e{embd}-l{layers}-s{seed}-{key}.gguf"
    else:
        target = Path(path)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    if not (path is None and target.exists()):
        _write(target, tokens, scores, types, **shape)
    return ModelInfo(path=target, n_params=_n_params(n_vocab, embd, layers, ff, heads, kv_heads), n_vocab=n_vocab,
                     file_bytes=target.stat().st_size, **shape)


def _write(target: Path, tokens: list[bytes], scores: list[float], types: list[int], *, embd: int, layers: int,
           ff: int, heads: int, kv_heads: int, ctx: int, seed: int) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name, suffix=".part", dir=target.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp_name, "llama")
        w.add_name("infergraph-tiny-random-llama")
        w.add_context_length(ctx)
        w.add_embedding_length(embd)
        w.add_block_count(layers)
        w.add_feed_forward_length(ff)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(embd // heads)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_vocab_size(len(tokens))
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)

        def mat(rows: int, cols: int) -> np.ndarray:   # numpy (rows, cols) is ggml's ne = [cols, rows]
            return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02))

        kv = kv_heads * (embd // heads)
        w.add_tensor("token_embd.weight", mat(len(tokens), embd))
        for layer in range(layers):
            p = f"blk.{layer}."
            w.add_tensor(p + "attn_norm.weight", np.ones(embd, dtype=np.float32))
            w.add_tensor(p + "attn_q.weight", mat(embd, embd))
            w.add_tensor(p + "attn_k.weight", mat(kv, embd))
            w.add_tensor(p + "attn_v.weight", mat(kv, embd))
            w.add_tensor(p + "attn_output.weight", mat(embd, embd))
            w.add_tensor(p + "ffn_norm.weight", np.ones(embd, dtype=np.float32))
            w.add_tensor(p + "ffn_gate.weight", mat(ff, embd))
            w.add_tensor(p + "ffn_up.weight", mat(ff, embd))
            w.add_tensor(p + "ffn_down.weight", mat(embd, ff))
        w.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor("output.weight", mat(len(tokens), embd))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp_name, target)     # atomic: a reader sees the whole file or none
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def prompt_of(n_tokens: int) -> str:
    """A prompt that the tiny model's tokenizer makes exactly ``n_tokens`` tokens, counting the leading ``<s>``.

    Each word of it is one vocabulary piece, so ``n_tokens - 1`` words.

    >>> prompt_of(4)
    'the of and'
    """
    check_count("n_tokens", n_tokens)  # it counts <s>
    return " ".join(_WORDS[i % len(_WORDS)] for i in range(n_tokens - 1))


def describe(info: ModelInfo) -> dict[str, object]:
    """The model's fields as a plain dict (for printing and benchmark records).

    >>> info = ModelInfo(Path("m.gguf"), 10, 5, 64, 1, 128, 4, 2, 512, 0, 100)
    >>> describe(info)["kv_bytes_per_token"]
    128
    """
    d: dict[str, object] = asdict(info)
    d["path"] = str(info.path)
    d["head_dim"] = info.head_dim
    d["kv_bytes_per_token"] = info.kv_bytes_per_token()
    return d


def trained_context_length(path: str | os.PathLike[str]) -> int | None:
    """The ``<arch>.context_length`` a GGUF file declares (the most one llama.cpp slot can hold), or None.

    Raises ``ValueError`` when the file is not a GGUF file.

    >>> trained_context_length(write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512).path)
    512
    """
    import gguf

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{os.fspath(path)!r} is not a GGUF file (its first bytes are not b'GGUF')")
    reader = gguf.GGUFReader(os.fspath(path))
    arch = reader.fields.get("general.architecture")
    if arch is None:
        return None
    field = reader.fields.get(f"{arch.contents()}.context_length")
    return None if field is None else int(field.contents())
