"""Ray Serve's autoscaling settings, once: the simulated autoscaler (notebook 06) and the Ray deployment (07) use them.

:class:`AutoscalingConfig` carries the fields of Ray Serve's ``autoscaling_config``
(``ray.serve.config.AutoscalingConfig``) under Ray's own names, with Ray's defaults and Ray's units (seconds);
:meth:`AutoscalingConfig.to_ray_config` is the dict a deployment's ``autoscaling_config`` takes, and
:meth:`AutoscalingConfig.desired` is the rule of Ray's default policy ("replica queue length").  The simulator
(:func:`~infergraph_lite.simulation.autoscale.simulate_autoscaling`) reads the same object, converting seconds to
its own time unit.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from infergraph_lite.core.arguments import check_count, check_non_negative_int, check_number

__all__ = ["AutoscalingConfig"]


@dataclass(frozen=True)
class AutoscalingConfig:
    """Ray Serve's ``autoscaling_config`` for one deployment, validated; times in seconds, as Ray's.

    Fields, all Ray's names and defaults:

    - ``min_replicas`` (1; 0 lets Ray scale to zero), ``max_replicas`` (1), ``initial_replicas`` (None: start at
      ``min_replicas``): the range Ray keeps the replica count in;
    - ``target_ongoing_requests`` (2): ongoing requests (queued at a replica plus being served) per replica that
      Ray aims for: it wants ``ceil(total ongoing / target)`` replicas.  A count, not a busy fraction: the queued
      requests count too, so a replica serving one request at a time holds more ongoing requests on average than
      the fraction of time it is busy (M/M/c, Erlang C: 9 replicas offered 6 replicas' worth of work hold 0.71
      ongoing requests each while 67 % busy; notebook 06);
    - ``metrics_interval_s`` (10): how often replicas report their ongoing requests;
      ``look_back_period_s`` (30): the window those reports are averaged over;
    - ``upscale_delay_s`` (30), ``downscale_delay_s`` (600): how long a decision to add (remove) replicas must
      hold, decision after decision, before Ray acts on it;
    - ``upscaling_factor``, ``downscaling_factor`` (None: 1): a multiplier on each change, to damp (< 1) or
      amplify (> 1) it.

    Ray decides once per control loop, every 0.1 s (``RAY_SERVE_CONTROL_LOOP_INTERVAL_S``, not part of the
    config); a delay asks for ``int(delay / 0.1)`` decisions in a row.

    >>> config = AutoscalingConfig(target_ongoing_requests=2, max_replicas=3, upscale_delay_s=3)
    >>> config.to_ray_config()["upscale_delay_s"], config.desired(mean_ongoing=9.0, current=1)
    (3.0, 3)
    >>> AutoscalingConfig(min_replicas=3, max_replicas=1)
    Traceback (most recent call last):
    ...
    ValueError: max_replicas (1) must be >= min_replicas (3)
    """

    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None

    def __post_init__(self) -> None:
        # Normalise as we validate (ints stay ints, times become floats), so equal settings compare equal.
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("min_replicas", check_non_negative_int("min_replicas", self.min_replicas))
        put("max_replicas", check_count("max_replicas", self.max_replicas))
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})")
        if self.initial_replicas is not None:
            put("initial_replicas", check_non_negative_int("initial_replicas", self.initial_replicas))
            if not self.min_replicas <= self.initial_replicas <= self.max_replicas:
                raise ValueError(f"initial_replicas ({self.initial_replicas}) must lie in [min_replicas, "
                                 f"max_replicas] = [{self.min_replicas}, {self.max_replicas}]")
        for name in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s"):
            put(name, check_number(name, getattr(self, name)))
        for name in ("upscale_delay_s", "downscale_delay_s"):
            put(name, check_number(name, getattr(self, name), positive=False))
        for name in ("upscaling_factor", "downscaling_factor"):
            if getattr(self, name) is not None:
                put(name, check_number(name, getattr(self, name)))

    @property
    def start_replicas(self) -> int:
        """The replicas a deployment starts with: ``initial_replicas``, or else ``min_replicas``."""
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas

    def to_ray_config(self) -> dict[str, Any]:
        """The dict for a Ray Serve deployment's ``autoscaling_config``.

        Fields left at None are left out, and so is ``metrics_interval_s`` at Ray's default: recent Ray
        deprecates that field (warning when it is given) in favour of environment variables, so it is passed
        only when it says something Ray's default does not.

        >>> AutoscalingConfig(max_replicas=4, upscale_delay_s=5).to_ray_config()
        {'min_replicas': 1, 'max_replicas': 4, 'target_ongoing_requests': 2.0, 'look_back_period_s': 30.0,
         'upscale_delay_s': 5.0, 'downscale_delay_s': 600.0}
        """
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None
                and not (f.name == "metrics_interval_s" and getattr(self, f.name) == f.default)}

    def desired(self, mean_ongoing: float, current: int) -> int:
        """Ray's desired replica count for this average of ongoing requests, scaled and clipped.

        ``mean_ongoing / target_ongoing_requests`` replicas, the change from ``current`` multiplied by the
        up- or downscaling factor, rounded up, within ``[min_replicas, max_replicas]``.

        >>> AutoscalingConfig(target_ongoing_requests=2, max_replicas=10).desired(mean_ongoing=9.0, current=2)
        5
        """
        wanted = mean_ongoing / self.target_ongoing_requests  # = current * (ongoing per replica / target)
        up = wanted > current
        factor = (self.upscaling_factor if up else self.downscaling_factor) or 1.0
        scaled = math.ceil(current + factor * (wanted - current) - 1e-9)
        if math.ceil(wanted - 1e-9) < current and scaled == current:  # a small factor must not stall a downscale
            scaled -= 1
        return max(self.min_replicas, min(self.max_replicas, scaled))
