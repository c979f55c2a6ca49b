"""The example graphs of the collection, in the seed's shape ``name -> (func, [deps])``.

- :func:`banana_nodes`: the seed's four-node graph (notebook 01 onwards), read with :data:`BANANA_INPUTS`.
- :func:`text_pipeline`: notebook 01's review pipeline, tokenize -> embed -> topic ∥ sentiment -> merge -> format,
  with real numpy models; :func:`text_pipeline_stages` is the same graph as batch functions in
  :class:`~infergraph_lite.core.stage.Stage` s, to be served (notebooks 06, 07).
- :func:`listing_graph`: a product-listing request with image and text models (notebooks 02, 03).

Nothing here is a stand-in: the models are real numpy work (see :mod:`infergraph_lite.models`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from functools import lru_cache, partial
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int, check_number
from infergraph_lite.core.stage import Stage
from infergraph_lite.lessons.models import HashingEmbedder, SoftmaxRegression, load_texts, tokenize, train_text_models

__all__ = [
    "BANANA_INPUTS",
    "LISTING_CATEGORIES",
    "banana_nodes",
    "cpu_bound_stages",
    "listing_graph",
    "listing_image",
    "python_work",
    "rounds_for",
    "text_pipeline",
    "text_pipeline_stages",
    "trained_text_models",
]

BANANA_INPUTS: Mapping[str, Any] = {"text": "  BANANA  "}
"""The seed's input: ``run_graph(banana_nodes(), BANANA_INPUTS)``."""


@lru_cache(maxsize=1)
def trained_text_models() -> tuple[HashingEmbedder, SoftmaxRegression, SoftmaxRegression]:
    """Notebook 01's ``(embedder, topic_model, sentiment_model)`` trained on ``data/texts.tsv``, once per process.

    Training is deterministic, so every process (a Triton model, a Ray replica) gets the same models.
    """
    return train_text_models(load_texts())


def _top(model: SoftmaxRegression, vector: np.ndarray) -> dict[str, Any]:
    probabilities = model.predict_proba(vector)[0]
    best = int(probabilities.argmax())
    return {"label": model.classes[best], "confidence": round(float(probabilities[best]), 3)}


def _format_answer(merged: dict[str, Any]) -> str:
    t, s = merged["topic"], merged["sentiment"]
    return f"{t['label']} ({t['confidence']:.2f}), {s['label']} ({s['confidence']:.2f})"


def text_pipeline(
    embedder: HashingEmbedder, topic_model: SoftmaxRegression, sentiment_model: SoftmaxRegression
) -> dict[str, tuple[Any, list[str]]]:
    """The inference graph of notebook 01, in the seed's shape, reading the input ``text``.

    tokenize -> embed -> (topic, sentiment in parallel) -> merge -> format.

    >>> from infergraph_lite import run_graph
    >>> nodes = text_pipeline(*trained_text_models())
    >>> run_graph(nodes, {"text": "The pizza was excellent for lunch."})["format"]
    'food (0.9...), positive (0.8...)'
    """
    def merge(topic: dict[str, Any], sentiment: dict[str, Any]) -> dict[str, Any]:
        return {"topic": topic, "sentiment": sentiment}

    return {
        "tokenize": (tokenize, ["text"]),
        "embed": (embedder.embed, ["tokenize"]),
        "topic": (lambda v: _top(topic_model, v), ["embed"]),
        "sentiment": (lambda v: _top(sentiment_model, v), ["embed"]),
        "merge": (merge, ["topic", "sentiment"]),
        "format": (_format_answer, ["merge"]),
    }




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


def text_pipeline_stages(
    embedder: HashingEmbedder | None = None,
    topic_model: SoftmaxRegression | None = None,
    sentiment_model: SoftmaxRegression | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, tuple[Stage, list[str]]]:
    """Notebook 01's pipeline as a stage graph: each node a batch function ``list -> list`` in a Stage.

    The same graph as :func:`text_pipeline`, node for node, and the same
    answers; but each stage takes a *batch* of requests at once, which is
    what a batching server (notebooks 06, 07) hands it: the embedder stacks
    the batch into one matrix and each classifier scores it with one matrix
    product.  ``options`` sets a stage's knobs, e.g.
    ``{"topic": {"max_batch_size": 16, "max_wait": 0.002, "replicas": 2}}``
    (``max_wait`` in seconds); stages not named keep batches of one.  The
    models default to :func:`trained_text_models`.

    >>> stages = text_pipeline_stages(options={"embed": {"max_batch_size": 8}})
    >>> stages["embed"][0].max_batch_size, stages["merge"][1]
    (8, ['topic', 'sentiment'])
    >>> stages["merge"][0].fn([({"label": "food", "confidence": 0.9}, {"label": "positive", "confidence": 0.8})])
    [{'topic': {'label': 'food', 'confidence': 0.9}, 'sentiment': {'label': 'positive', 'confidence': 0.8}}]
    """
    if embedder is None or topic_model is None or sentiment_model is None:
        embedder, topic_model, sentiment_model = trained_text_models()
    options = dict(options or {})

    def tokenize_batch(texts: list[str]) -> list[list[str]]:
        return [tokenize(text) for text in texts]

    def embed_batch(token_lists: list[list[str]]) -> list[np.ndarray]:
        return list(embedder.embed_batch(token_lists))

    def classifier(model: SoftmaxRegression) -> Any:
        def classify_batch(vectors: list[np.ndarray]) -> list[dict[str, Any]]:
            probabilities = model.predict_proba(np.stack(vectors))  # one matrix product for the whole batch
            best = probabilities.argmax(axis=1)
            return [{"label": model.classes[b], "confidence": round(float(p[b]), 3)}
                    for b, p in zip(best, probabilities)]
        return classify_batch

    def merge_batch(pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[dict[str, Any]]:
        return [{"topic": topic, "sentiment": sentiment} for topic, sentiment in pairs]

    def format_batch(merged: list[dict[str, Any]]) -> list[str]:
        return [_format_answer(m) for m in merged]

    functions = {
        "tokenize": (tokenize_batch, ["text"]),
        "embed": (embed_batch, ["tokenize"]),
        "topic": (classifier(topic_model), ["embed"]),
        "sentiment": (classifier(sentiment_model), ["embed"]),
        "merge": (merge_batch, ["topic", "sentiment"]),
        "format": (format_batch, ["merge"]),
    }
    unknown = sorted(set(options) - set(functions))
    if unknown:
        raise ValueError(f"options name stages that the text pipeline does not have: {unknown}; "
                         f"its stages are {list(functions)}")
    return {name: (Stage(fn=fn, **options.get(name, {})), deps) for name, (fn, deps) in functions.items()}


def python_work(items: list[int], rounds: int) -> list[int]:
    """A batch function of pure-Python arithmetic: ``rounds`` steps of an integer hash per item.

    No sleep, no numpy, no I/O: the thread running it holds the interpreter lock the whole time, so two
    such stages in one process take turns, while in two processes they run at once (notebook 06).  The
    cost is a fixed amount of work per item, so a batch of ``b`` costs ``b`` times one item.

    >>> python_work([1, 2], rounds=3)
    [662824084, 2818548041]
    """
    answers = []
    for item in items:
        h = item & 0xFFFFFFFF
        for _ in range(rounds):
            h = (h * 1103515245 + 12345) & 0xFFFFFFFF  # the C library's rand() step, in Python integers
        answers.append(h)
    return answers


def rounds_for(seconds: float, *, probe: int = 100_000, repeats: int = 5) -> int:
    """How many :func:`python_work` rounds make about ``seconds`` of work per item on this machine.

    A round is a fixed amount of arithmetic, so its time is the machine's: the same rounds took four times longer
    on one of this project's hosts than on another.  A lesson that needs a stage of about a millisecond, whatever
    the machine, asks for ``rounds_for(0.001)``.  ``probe`` rounds are timed ``repeats`` times and the fastest is
    scaled (a busy moment only slows a timing, so the fastest is the machine's own speed).

    >>> rounds_for(0.001) > 100
    True
    """
    seconds = check_number("seconds", seconds)
    probe, repeats = check_count("probe", probe), check_count("repeats", repeats)
    fastest = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        python_work([1], probe)
        fastest = min(fastest, time.perf_counter() - started)
    return max(1, round(probe * seconds / fastest))


def cpu_bound_stages(
    rounds: Mapping[str, int] | None = None,
    *,
    inputs: str = "request",
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, tuple[Stage, list[str]]]:
    """A chain of pure-Python CPU-bound stages (:func:`python_work`), for threads against processes.

    ``rounds`` maps each stage, in chain order, to its work per item (default two equal stages,
    ``{"parse": 5_000, "score": 5_000}``: from about a quarter of a millisecond to over a millisecond per item, by
    host; :func:`rounds_for` sizes a stage in seconds instead); the first reads
    ``inputs``, each next one the previous.  Each ``fn`` is a ``functools.partial`` of a module-level
    function, so it pickles by name and runs in a worker process (``GraphServer(workers="processes")``).
    ``options`` sets a stage's knobs as in :func:`text_pipeline_stages`.

    >>> stages = cpu_bound_stages({"a": 3, "b": 3}, options={"b": {"max_batch_size": 4}})
    >>> list(stages), stages["b"][1], stages["b"][0].max_batch_size, stages["a"][0].fn([1, 2])
    (['a', 'b'], ['a'], 4, [662824084, 2818548041])
    """
    rounds = dict({"parse": 5_000, "score": 5_000} if rounds is None else rounds)
    options = dict(options or {})
    unknown = sorted(set(options) - set(rounds))
    if unknown:
        raise ValueError(f"options name stages that this graph does not have: {unknown}; its stages are {list(rounds)}")
    for name, count in rounds.items():
        check_non_negative_int(f"rounds[{name!r}]", count)
    stages, previous = {}, inputs
    for name, count in rounds.items():
        stages[name] = (Stage(fn=partial(python_work, rounds=count), **options.get(name, {})), [previous])
        previous = name
    return stages
