"""Notebook 06's picture of a stage graph: every stage a box with its knobs, optionally coloured by utilization.

A drawing helper only (nothing here simulates); the lesson calls :func:`draw_stages` on its stage dicts.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from infergraph_lite.core.stage import Exponential, Stage, prepare_stages

__all__ = ["describe_stage", "draw_stages"]


def describe_stage(stage: Stage) -> str:
    """One stage's knobs in three short lines: its service time, its batching, its replicas.

    >>> print(describe_stage(Stage(service_time=(2.0, 0.15), max_batch_size=16, max_wait=1.0, replicas=2)))
    2 + 0.15·b ms
    batch ≤ 16, wait 1 ms
    × 2 replicas
    >>> print(describe_stage(Stage(service_time=Exponential(1.5))).splitlines()[0])
    exp. mean 1.5 ms
    """
    s = stage.service_time
    if isinstance(s, Exponential):
        cost = f"exp. mean {s.mean:g} ms"
    elif isinstance(s, tuple):
        cost = f"{s[0]:g} + {s[1]:g}·b ms"
    elif callable(s):
        cost = "measured s(b)"
    else:
        cost = f"{s:g} ms"
    batching = ("no batching" if stage.max_batch_size == 1
                else f"batch ≤ {stage.max_batch_size}, wait {stage.max_wait:g} ms")
    return f"{cost}\n{batching}\n× {stage.replicas} replica{'s' if stage.replicas > 1 else ''}"


def draw_stages(stages: Mapping[str, tuple[Stage, list[str]]], title: str, ax: Axes | None = None,
                utilization: Mapping[str, float] | None = None) -> Axes:
    """Draw the stage graph level by level from its ``request`` input, each stage with its knobs; with
    ``utilization`` (stage -> fraction busy) each box also shows it, coloured green (idle) to red (busy).

    >>> graph = {"pre": (Stage(service_time=0.4), ["request"]), "model": (Stage(service_time=2.0), ["pre"])}
    >>> ax = draw_stages(graph, "two stages", utilization={"pre": 0.2, "model": 0.9})
    >>> ax.get_title(), [t.get_text().splitlines()[0] for t in ax.texts if t.get_text()]
    ('two stages', ['request', 'pre', 'model'])
    >>> plt.close(ax.figure)
    """
    plan = prepare_stages(stages)
    pos = {"request": (0.0, 0.0)}
    for depth, level in enumerate(plan.levels, start=1):
        for k, name in enumerate(level):
            pos[name] = (float(depth), (len(level) - 1) / 2 - k)
    if ax is None:
        size = (2.9 * (len(plan.levels) + 1), 1.3 + 1.5 * max(map(len, plan.levels)))
        ax = plt.subplots(figsize=size)[1]
    for name, (_, deps) in stages.items():
        for dep in deps:
            ax.annotate("", xy=pos[name], xytext=pos[dep],
                        arrowprops={"arrowstyle": "-|>", "color": "0.45", "shrinkA": 34, "shrinkB": 34})
    colours = plt.get_cmap("RdYlGn_r")
    ax.text(*pos["request"], "request", ha="center", va="center", bbox={"boxstyle": "round", "fc": "0.92"})
    for name, (stage, _) in stages.items():
        fill = "#dbe9f6" if utilization is None else colours(min(utilization[name], 1.0))
        extra = "" if utilization is None else f"\nutilization {utilization[name]:.0%}"
        ax.text(*pos[name], f"{name}\n{describe_stage(stage)}{extra}", ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "fc": fill, "ec": "0.4"})
    xs, ys = zip(*pos.values())
    ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.set_title(title)
    ax.axis("off")
    return ax
