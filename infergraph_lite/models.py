"""Tiny real models in numpy, and the text pipeline of notebook 01.

Nothing here is a stand-in: the classifiers are trained by gradient descent on
``data/texts.tsv`` and the MLP does real matrix work whose cost grows with the
batch, which is what the batching notebooks (05, 06) need.

Introduced in notebook 01 (text pipeline) and notebook 05 (:class:`TinyMLP`).
"""

from __future__ import annotations

import csv
import itertools
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DATA_DIR",
    "HashingEmbedder",
    "LabelledText",
    "SoftmaxRegression",
    "TinyMLP",
    "banana_nodes",
    "listing_graph",
    "listing_image",
    "load_texts",
    "text_pipeline",
    "tokenize",
    "train_text_models",
]

# The repository's data/ folder (the package is installed in editable mode from the repository).
DATA_DIR = Path(__file__).resolve().parent.parent / "data"
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class LabelledText:
    """One row of ``data/texts.tsv``."""

    text: str
    topic: str
    sentiment: str


def load_texts(path: str | Path | None = None) -> list[LabelledText]:
    """Read the labelled review set written by ``data/make_texts.py``.

    >>> rows = load_texts()
    >>> len(rows), sorted({r.topic for r in rows})
    (400, ['food', 'sport', 'tech', 'travel'])
    """
    path = Path(path) if path is not None else DATA_DIR / "texts.tsv"
    with path.open(encoding="utf-8", newline="") as f:
        return [LabelledText(r["text"], r["topic"], r["sentiment"]) for r in csv.DictReader(f, delimiter="\t")]


def tokenize(text: str) -> list[str]:
    """Lower-case words, punctuation dropped.

    >>> tokenize("The pasta was WONDERFUL, but slow!")
    ['the', 'pasta', 'was', 'wonderful', 'but', 'slow']
    """
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class HashingEmbedder:
    """Bag of words and word pairs, hashed into ``dim`` buckets, L2-normalised.

    The hashing trick needs no vocabulary, so there is nothing to fit; crc32
    (not Python's salted ``hash``) keeps the vectors the same in every process.

    >>> e = HashingEmbedder(dim=64)
    >>> v = e.embed(["good", "coffee"])
    >>> v.shape, round(float(np.linalg.norm(v)), 6)
    ((64,), 1.0)
    """

    dim: int = 512

    def embed(self, tokens: Sequence[str]) -> np.ndarray:
        vector = np.zeros(self.dim, dtype=np.float64)
        features = list(tokens) + [f"{a} {b}" for a, b in itertools.pairwise(tokens)]
        for feature in features:
            h = zlib.crc32(feature.encode())
            vector[h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0  # signed: collisions cancel on average
        norm = np.linalg.norm(vector)
        return vector / norm if norm else vector

    def embed_batch(self, token_lists: Sequence[Sequence[str]]) -> np.ndarray:
        """Embed many token lists into an ``(n, dim)`` array."""
        return np.stack([self.embed(t) for t in token_lists]) if token_lists else np.zeros((0, self.dim))


@dataclass
class SoftmaxRegression:
    """Multinomial logistic regression trained by full-batch gradient descent.

    >>> X = np.array([[1.0, 0.0], [0.0, 1.0]] * 10)
    >>> model = SoftmaxRegression().fit(X, ["left", "right"] * 10)
    >>> model.predict(np.array([[0.9, 0.1]]))
    ['left']
    """

    epochs: int = 300
    learning_rate: float = 1.0
    l2: float = 1e-4
    classes: list[str] = field(default_factory=list)
    weights: np.ndarray | None = None

    def fit(self, X: np.ndarray, labels: Sequence[str]) -> SoftmaxRegression:
        if len(X) != len(labels) or len(X) == 0:
            raise ValueError(f"X has {len(X)} rows but labels has {len(labels)}; need the same, > 0")
        self.classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(self.classes)}
        y = np.zeros((len(labels), len(self.classes)))
        y[np.arange(len(labels)), [index[label] for label in labels]] = 1.0
        Xb = np.hstack([X, np.ones((len(X), 1))])  # bias column
        self.weights = np.zeros((Xb.shape[1], len(self.classes)))
        for _ in range(self.epochs):
            gradient = Xb.T @ (_softmax(Xb @ self.weights) - y) / len(Xb) + self.l2 * self.weights
            self.weights -= self.learning_rate * gradient
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities, one row per input row, columns in ``self.classes`` order."""
        if self.weights is None:
            raise RuntimeError("call fit() before predict_proba()")
        X = np.atleast_2d(X)
        return _softmax(np.hstack([X, np.ones((len(X), 1))]) @ self.weights)

    def predict(self, X: np.ndarray) -> list[str]:
        return [self.classes[i] for i in self.predict_proba(X).argmax(axis=1)]


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def train_text_models(
    rows: Sequence[LabelledText], dim: int = 512
) -> tuple[HashingEmbedder, SoftmaxRegression, SoftmaxRegression]:
    """Fit the topic and sentiment models of notebook 01 on ``rows``.

    Returns ``(embedder, topic_model, sentiment_model)``.  Deterministic: no
    randomness anywhere in training.
    """
    embedder = HashingEmbedder(dim)
    X = embedder.embed_batch([tokenize(r.text) for r in rows])
    topic_model = SoftmaxRegression().fit(X, [r.topic for r in rows])
    sentiment_model = SoftmaxRegression().fit(X, [r.sentiment for r in rows])
    return embedder, topic_model, sentiment_model


def _top(model: SoftmaxRegression, vector: np.ndarray) -> dict[str, Any]:
    probabilities = model.predict_proba(vector)[0]
    best = int(probabilities.argmax())
    return {"label": model.classes[best], "confidence": round(float(probabilities[best]), 3)}


def text_pipeline(
    embedder: HashingEmbedder, topic_model: SoftmaxRegression, sentiment_model: SoftmaxRegression
) -> dict[str, tuple[Any, list[str]]]:
    """The inference graph of notebook 01, in the seed's shape, reading the input ``text``.

    tokenize -> embed -> (topic, sentiment in parallel) -> merge -> format.

    >>> from infergraph_lite import run_graph
    >>> nodes = text_pipeline(*train_text_models(load_texts()))
    >>> run_graph(nodes, {"text": "The pizza was excellent for lunch."})["format"]
    'food (0.9...), positive (0.8...)'
    """
    def merge(topic: dict[str, Any], sentiment: dict[str, Any]) -> dict[str, Any]:
        return {"topic": topic, "sentiment": sentiment}

    def format_answer(merged: dict[str, Any]) -> str:
        t, s = merged["topic"], merged["sentiment"]
        return f"{t['label']} ({t['confidence']:.2f}), {s['label']} ({s['confidence']:.2f})"

    return {
        "tokenize": (tokenize, ["text"]),
        "embed": (embedder.embed, ["tokenize"]),
        "topic": (lambda v: _top(topic_model, v), ["embed"]),
        "sentiment": (lambda v: _top(sentiment_model, v), ["embed"]),
        "merge": (merge, ["topic", "sentiment"]),
        "format": (format_answer, ["merge"]),
    }


class TinyMLP:
    """A two-layer perceptron with fixed random weights: real matrix work per batch.

    Its batch cost is ``alpha + beta * b`` in shape (a fixed per-call overhead
    plus per-row matrix work), which is what a batching server exploits.

    >>> mlp = TinyMLP(in_dim=8, hidden=16, out_dim=3, seed=0)
    >>> mlp(np.ones((5, 8))).shape
    (5, 3)
    """

    def __init__(self, in_dim: int = 256, hidden: int = 1024, out_dim: int = 16, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((in_dim, hidden)) / np.sqrt(in_dim)
        self.w2 = rng.standard_normal((hidden, out_dim)) / np.sqrt(hidden)
        self.in_dim = in_dim

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        hidden = np.maximum(np.asarray(batch) @ self.w1, 0.0)
        return hidden @ self.w2


def banana_nodes() -> dict[str, tuple[Any, list[str]]]:
    """The seed's example graph, reading input ``text`` (notebook 01).

    >>> from infergraph_lite import run_graph
    >>> run_graph(banana_nodes(), {"text": "  BANANA  "})["combine"]
    {'len': 6, 'a_count': 3}
    """
    return {
        "pre": (lambda s: s.strip().lower(), ["text"]),
        "modelA": (len, ["pre"]),
        "modelB": (lambda s: s.count("a"), ["pre"]),
        "combine": (lambda n, a: {"len": n, "a_count": a}, ["modelA", "modelB"]),
    }


LISTING_CATEGORIES = ["books", "clothing", "electronics", "garden", "toys"]


def listing_image(seed: int = 0, size: int = 96) -> np.ndarray:
    """A made-up RGB photo (``uint8``, ``size x size x 3``), the ``image_bytes`` input of :func:`listing_graph`."""
    return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)


def listing_graph(seed: int = 0, lookup_seconds: float = 0.02, width: int = 1024) -> dict[str, tuple[Any, list[str]]]:
    """A product-listing request: a photo and a title, scored by several models (notebooks 02, 03).

    Inputs ``image_bytes`` (see :func:`listing_image`) and ``title``.  The
    models are real numpy work with seeded random weights (their answers are
    meaningless but their cost is real); ``seller_stats`` stands in for a
    feature-store lookup over the network, so it sleeps ``lookup_seconds`` —
    waiting that, like numpy's matrix products, releases the GIL.

    >>> from infergraph_lite import run_graph
    >>> out = run_graph(listing_graph(lookup_seconds=0), {"image_bytes": listing_image(), "title": "red kite"})
    >>> sorted(out["fuse"])
    ['category', 'price', 'safe']
    """
    import time

    rng = np.random.default_rng(seed)
    pixels = 48 * 48 * 3
    w_image = rng.standard_normal((pixels, width)) / np.sqrt(pixels)
    w_safety = rng.standard_normal((pixels, width)) / np.sqrt(pixels)
    w_safety_out = rng.standard_normal(width) / np.sqrt(width)
    embedder = HashingEmbedder(256)
    w_category = rng.standard_normal((width + 256, len(LISTING_CATEGORIES))) / np.sqrt(width)
    w_price = rng.standard_normal(width + 256 + 2) / np.sqrt(width)

    def decode_image(raw: np.ndarray) -> np.ndarray:
        return raw.astype(np.float64) / 255.0 - 0.5

    def resize(image: np.ndarray) -> np.ndarray:
        h, w, _ = image.shape
        return image[: h - h % 2, : w - w % 2].reshape(h // 2, 2, w // 2, 2, 3).mean(axis=(1, 3))

    def seller_stats(title: str) -> dict[str, float]:
        time.sleep(lookup_seconds)  # the network round trip to a feature store
        return {"rating": 4.0 + (zlib.crc32(title.encode()) % 10) / 10, "sales": float(len(title) * 7)}

    def image_embedding(small: np.ndarray) -> np.ndarray:
        batch = np.repeat(small.reshape(1, -1), 64, axis=0)  # 64 augmented crops, as test-time augmentation
        return np.tanh(batch @ w_image).mean(axis=0)

    def safety_model(small: np.ndarray) -> bool:
        batch = np.repeat(small.reshape(1, -1), 64, axis=0)
        return bool(float(np.tanh(batch @ w_safety).mean(axis=0) @ w_safety_out) < 1.0)

    def category_model(image_vec: np.ndarray, text_vec: np.ndarray) -> str:
        scores = np.concatenate([image_vec, text_vec]) @ w_category
        return LISTING_CATEGORIES[int(scores.argmax())]

    def price_model(image_vec: np.ndarray, text_vec: np.ndarray, stats: dict[str, float]) -> float:
        features = np.concatenate([image_vec, text_vec, [stats["rating"], np.log1p(stats["sales"])]])
        return round(float(np.exp(1.0 + 0.1 * features @ w_price)), 2)

    def fuse(category: str, price: float, safe: bool) -> dict[str, Any]:
        return {"category": category, "price": price, "safe": safe}

    return {
        "decode_image": (decode_image, ["image_bytes"]),
        "tokenize_title": (tokenize, ["title"]),
        "seller_stats": (seller_stats, ["title"]),
        "resize": (resize, ["decode_image"]),
        "text_embedding": (embedder.embed, ["tokenize_title"]),
        "image_embedding": (image_embedding, ["resize"]),
        "safety_model": (safety_model, ["resize"]),
        "category_model": (category_model, ["image_embedding", "text_embedding"]),
        "price_model": (price_model, ["image_embedding", "text_embedding", "seller_stats"]),
        "fuse": (fuse, ["category_model", "price_model", "safety_model"]),
    }
