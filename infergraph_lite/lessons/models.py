"""Tiny real models in numpy: the text pipeline's embedder and classifiers, and a small MLP.

Nothing here is a stand-in: the classifiers are trained by gradient descent on
``data/texts.tsv`` and the MLP does real matrix work whose cost grows with the
batch, which is what the batching notebooks (05, 06) need.

The graphs built from them are in :mod:`infergraph_lite.examples`.
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

import numpy as np

__all__ = [
    "DATA_DIR",
    "HashingEmbedder",
    "LabelledText",
    "SoftmaxRegression",
    "TinyMLP",
    "load_texts",
    "tokenize",
    "train_text_models",
]

# The repository's data/ folder (the package is installed in editable mode from the repository).
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
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
