"""models.py and viz.py: the notebooks' models learn, and the pictures carry their labels."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest

from infergraph_lite import TraceEvent, run_graph, simulate_llm
from infergraph_lite.lessons.examples import listing_graph, listing_image, text_pipeline
from infergraph_lite.lessons.models import (
    HashingEmbedder,
    SoftmaxRegression,
    TinyMLP,
    load_texts,
    tokenize,
    train_text_models,
)
from infergraph_lite.lessons.viz import draw_levels, edge_crossings, plot_slots, plot_timeline, to_networkx
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


def _bars(ax, idle):
    # (row, left, width) of the bars plot_slots drew: running (solid) or idle (hatched)
    return sorted((round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_width()) for p in ax.patches
                  if bool(p.get_hatch()) == idle)


@pytest.mark.parametrize("scheduling", ["static", "continuous"])
def test_plot_slots_draws_each_request_in_its_slot_and_hatches_exactly_the_idle_time(scheduling):
    lengths = [3, 8, 2, 6, 5, 1, 7, 4]
    r = simulate_llm(n_requests=8, prompt_tokens=16, output_tokens=lengths, step_time=1.0, max_num_seqs=4,
                     scheduling=scheduling, slot_placement="lru")
    ax = plot_slots(r.first_token - 1, r.finish, r.slot, until=15, unit="engine steps", title=scheduling)
    running, idle = _bars(ax, idle=False), _bars(ax, idle=True)
    assert sorted(running) == sorted((int(s), f - 1 - (n - 1), n) for s, f, n in zip(r.slot, r.finish, lengths))
    assert sum(w for *_, w in running) + sum(w for *_, w in idle) == 4 * 15   # every slot-step drawn once
    assert sum(w for *_, w in idle) == 4 * 15 - sum(lengths)
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(i) for i in range(8))
    assert ax.get_xlabel() == "time (engine steps)" and ax.get_ylabel() == "sequence slot"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["slot 0", "slot 1", "slot 2", "slot 3"]
    assert len(ax.get_legend().get_texts()) == 2 and ax.get_title() == scheduling
    plt.close("all")


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(start=[0, 1], end=[2, 3], slot=[0, 0]), "overlap in slot 0"),
    (dict(start=[0], end=[2, 3], slot=[0]), "one value per request"),
    (dict(start=[2], end=[1], slot=[0]), "start <= end"),
    (dict(start=[0], end=[1], slot=[-1]), "slot number >= 0"),
    (dict(start=[0], end=[1], slot=[2], slots=2), "slots=2 but a request ran in slot 2"),
])
def test_plot_slots_refuses_what_no_engine_could_have_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plot_slots(**kwargs)
    plt.close("all")


def _drawn_geometry(ax):
    """Each edge's polyline and each node's box, read back from what draw_levels drew."""
    boxes = {p.get_gid()[len("node:"):]: (p.get_x(), p.get_y(), p.get_x() + p.get_width(), p.get_y() + p.get_height())
             for p in ax.patches if (p.get_gid() or "").startswith("node:")}
    edges = {tuple(line.get_gid()[len("edge:"):].split("->")): line.get_xydata()
             for line in ax.lines if (line.get_gid() or "").startswith("edge:")}
    return boxes, edges


def _enters(p, q, box, samples=400):
    """Whether any of `samples` points along p-q lies strictly inside box (a plain geometric check)."""
    left, bottom, right, top = box
    t = np.linspace(0.0, 1.0, samples)
    x, y = p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])
    eps = 1e-9
    return bool(np.any((x > left + eps) & (x < right - eps) & (y > bottom + eps) & (y < top - eps)))


def _random_layered_dag(seed: int) -> tuple[dict, list[str]]:
    rng = np.random.default_rng(seed)
    names: list[str] = []
    nodes = {}
    for i in range(14):
        candidates = [*names, "x", "y"]
        deps = sorted(set(rng.choice(candidates, size=int(rng.integers(1, 4))).tolist()))
        nodes[f"n{i}"] = (None, deps)
        names.append(f"n{i}")
    return nodes, ["x", "y"]


LISTING_SHAPE = {name: (None, deps) for name, (_, deps) in listing_graph(lookup_seconds=0).items()}
TEXT_SHAPE = {"tokenize": (None, ["text"]), "embed": (None, ["tokenize"]), "topic": (None, ["embed"]),
              "sentiment": (None, ["embed"]), "merge": (None, ["topic", "sentiment"]), "format": (None, ["merge"])}


@pytest.mark.parametrize(("nodes", "inputs"), [
    (banana_nodes(), ["text"]),
    (LISTING_SHAPE, ["image_bytes", "title"]),
    (TEXT_SHAPE, ["text"]),
    *[_random_layered_dag(seed) for seed in range(6)],
], ids=["banana", "listing", "text pipeline", *[f"random {seed}" for seed in range(6)]])
def test_draw_levels_edges_run_from_box_to_box_and_through_no_other_box(nodes, inputs):
    ax = draw_levels(nodes, inputs)
    boxes, edges = _drawn_geometry(ax)
    expected_edges = {(d, name) for name, (_, deps) in nodes.items() for d in deps}
    assert set(edges) == expected_edges and set(boxes) == set(nodes) | set(inputs)
    for (u, v), points in edges.items():
        # Starts on the right side of the source's box, ends (arrowhead) on the left side of the target's.
        assert points[0][0] == pytest.approx(boxes[u][2]) and boxes[u][1] < points[0][1] < boxes[u][3]
        assert points[-1][0] == pytest.approx(boxes[v][0]) and boxes[v][1] < points[-1][1] < boxes[v][3]
        for p, q in itertools.pairwise(points):
            crossed = [name for name, box in boxes.items() if _enters(p, q, box)]
            assert not crossed, f"edge {u} -> {v} runs through the box of {crossed}"
    heads = {p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("arrowhead:")}
    assert heads == {f"arrowhead:{u}->{v}" for u, v in expected_edges}
    plt.close("all")


def test_listing_graph_skip_edge_goes_around_the_box_in_its_way():
    # The defect that prompted routing: text_embedding -> price_model drawn straight ran through a level-2 box.
    boxes, edges = _drawn_geometry(draw_levels(LISTING_SHAPE, ["image_bytes", "title"]))
    first, last = edges["text_embedding", "price_model"][0], edges["text_embedding", "price_model"][-1]
    assert any(_enters(first, last, boxes[name]) for name in ("safety_model", "image_embedding"))  # straight, it would
    assert len(edges["text_embedding", "price_model"]) > 2  # ... so the edge is routed
    plt.close("all")


def _drawn_crossings(ax) -> int:
    """How often two drawn edges cross, counted on the lines in the picture (segments of different edges)."""
    _, edges = _drawn_geometry(ax)
    segments = [(edge, p, q) for edge, points in edges.items() for p, q in itertools.pairwise(points)]

    def side(a, b, c):
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    return sum(e != f and side(r, s, p) * side(r, s, q) < -1e-12 and side(p, q, r) * side(p, q, s) < -1e-12
               for (e, p, q), (f, r, s) in itertools.combinations(segments, 2))


@pytest.mark.parametrize(("nodes", "inputs", "fewest"), [
    (banana_nodes(), ["text"], 0),
    (TEXT_SHAPE, ["text"], 0),
    # image_embedding and text_embedding both feed category_model and price_model: two of those edges must cross.
    (LISTING_SHAPE, ["image_bytes", "title"], 1),
], ids=["banana", "text pipeline", "listing"])
def test_draw_levels_orders_columns_so_that_edges_cross_as_little_as_they_must(nodes, inputs, fewest):
    assert _drawn_crossings(draw_levels(nodes, inputs)) == edge_crossings(nodes, inputs) == fewest
    plt.close("all")


def test_edge_crossings_counts_the_crossings_drawn():
    # On random DAGs, with long edges through lanes, the count is the picture's.
    for seed in range(6):
        nodes, inputs = _random_layered_dag(seed)
        assert _drawn_crossings(draw_levels(nodes, inputs)) == edge_crossings(nodes, inputs)
        plt.close("all")
