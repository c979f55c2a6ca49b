"""models.py and viz.py: the notebooks' models learn, and the pictures carry their labels."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest

from infergraph_lite import TraceEvent, run_graph
from infergraph_lite.examples import listing_graph, listing_image, text_pipeline
from infergraph_lite.models import (
    HashingEmbedder,
    SoftmaxRegression,
    TinyMLP,
    load_texts,
    tokenize,
    train_text_models,
)
from infergraph_lite.viz import draw_levels, plot_timeline, to_networkx
from tests.graphs import banana_nodes


def test_review_models_generalise_to_held_out_reviews():
    rows = load_texts()
    train, test = rows[:300], rows[300:]
    embedder, topic_model, sentiment_model = train_text_models(train)
    X = embedder.embed_batch([tokenize(r.text) for r in test])
    assert np.mean(np.array(topic_model.predict(X)) == [r.topic for r in test]) >= 0.95
    assert np.mean(np.array(sentiment_model.predict(X)) == [r.sentiment for r in test]) >= 0.85


def test_text_pipeline_answers_through_every_stage():
    nodes = text_pipeline(*train_text_models(load_texts()))
    out = run_graph(nodes, {"text": "The hotel was awful by the sea."})
    assert out["tokenize"][:2] == ["the", "hotel"]
    assert out["merge"]["topic"]["label"] == "travel" and out["merge"]["sentiment"]["label"] == "negative"
    assert out["format"].startswith("travel (") and "negative (" in out["format"]


def test_embedder_is_deterministic_and_normalised():
    a = HashingEmbedder(128).embed(tokenize("the coffee was wonderful"))
    b = HashingEmbedder(128).embed(tokenize("the coffee was wonderful"))
    np.testing.assert_array_equal(a, b)
    assert np.isclose(np.linalg.norm(a), 1.0)
    assert not HashingEmbedder(16).embed([]).any()


def test_softmax_regression_errors_are_clear():
    with pytest.raises(ValueError, match="X has 2 rows but labels has 1"):
        SoftmaxRegression().fit(np.zeros((2, 3)), ["a"])
    with pytest.raises(RuntimeError, match=r"call fit\(\) before predict_proba\(\)"):
        SoftmaxRegression().predict_proba(np.zeros((1, 3)))


def test_tiny_mlp_is_row_independent_so_batching_cannot_change_answers():
    mlp = TinyMLP(in_dim=16, hidden=32, out_dim=4, seed=1)
    batch = np.random.default_rng(0).standard_normal((6, 16))
    np.testing.assert_allclose(mlp(batch)[2], mlp(batch[2:3])[0])


def test_listing_graph_runs_and_is_reproducible():
    inputs = {"image_bytes": listing_image(seed=3), "title": "garden hose"}
    first = run_graph(listing_graph(lookup_seconds=0), inputs)["fuse"]
    assert first == run_graph(listing_graph(lookup_seconds=0), inputs)["fuse"]
    assert set(first) == {"category", "price", "safe"}


def test_draw_levels_labels_every_node_level_and_the_highlight():
    ax = draw_levels(banana_nodes(), ["text"], highlight=["pre", "modelA", "combine"], title="Seed")
    texts = {t.get_text() for t in ax.texts}
    assert texts == {"text", "pre", "modelA", "modelB", "combine"}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["input", "level 0", "level 1", "level 2", "critical path"]
    assert ax.get_title() == "Seed"
    plt.close("all")


def test_to_networkx_marks_inputs_and_edges_follow_data():
    g = to_networkx(banana_nodes())
    assert g.nodes["text"]["kind"] == "input" and g.nodes["pre"]["kind"] == "node"
    assert ("pre", "modelA") in g.edges and ("modelA", "pre") not in g.edges


def test_plot_timeline_has_units_rows_and_one_legend_entry_per_thread():
    trace = [TraceEvent("a", "t1", 0.0, 0.010), TraceEvent("b", "t2", 0.002, 0.005), TraceEvent("c", "t1", 0.010, 0.02)]
    ax = plot_timeline(trace, highlight=["a", "c"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert ax.get_xlabel() == "time since the run started (ms)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["thread 1", "thread 2", "critical path"]
    assert ax.patches[0].get_width() == pytest.approx(10.0)  # 10 ms bar for node a
    plt.close("all")
