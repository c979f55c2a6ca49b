"""Queueing theory the simulator is checked against (notebooks 04 and 05, and the tests).

- Pollaczek-Khinchine: the mean wait of an M/G/1 queue from the first two
  moments of the service time; M/D/1 and M/M/1 are its two textbook cases.
- Greedy batching without a cap (the model of Y. Inoue, "Queueing analysis of
  GPU-based inference servers with dynamic batching: a closed-form
  characterization", Performance Evaluation, 2021): the sizes of successive
  batches form a Markov chain, and the mean latency follows exactly from its
  stationary distribution.  Computed here numerically, not by simulation.
- Batch means: a confidence interval for the mean of correlated samples, which
  is what the latencies of consecutive requests are.
- Networks of queues (notebook 06): Erlang C for M/M/c, Jackson's theorem for
  exponential stations in series, and the two-branch fork-join.
"""

from __future__ import annotations

import math

import numpy as np

from infergraph_lite.core.arguments import check_count, check_int
from infergraph_lite.core.metrics import t_quantile

__all__ = [
    "batch_means_interval",
    "fork_join_mean_latency",
    "greedy_batching_mean_latency",
    "jackson_tandem_mean_latency",
    "md1_mean_latency",
    "mm1_mean_latency",
    "mmc_mean_latency",
    "pk_mean_wait",
    "t_quantile",
]


def pk_mean_wait(arrival_rate: float, mean_service: float, second_moment: float) -> float:
    """Pollaczek-Khinchine: mean time in queue of M/G/1, ``lambda * E[S^2] / (2 (1 - rho))``.

    >>> pk_mean_wait(0.5, 1.0, 1.0)    # M/D/1 at half load
    0.5
    """
    rho = arrival_rate * mean_service
    if not 0 <= rho < 1:
        raise ValueError(f"load rho = arrival_rate * mean_service must be in [0, 1), got {rho!r}")
    return arrival_rate * second_moment / (2 * (1 - rho))


def md1_mean_latency(arrival_rate: float, service_time: float) -> float:
    """Mean latency (wait + service) of M/D/1: ``s + rho * s / (2 (1 - rho))``.

    >>> round(md1_mean_latency(0.9, 1.0), 9)
    5.5
    """
    return service_time + pk_mean_wait(arrival_rate, service_time, service_time**2)


def mm1_mean_latency(arrival_rate: float, mean_service: float) -> float:
    """Mean latency of M/M/1: ``1 / (mu - lambda)`` (P-K with ``E[S^2] = 2 / mu^2``).

    >>> round(mm1_mean_latency(0.5, 1.0), 6)
    2.0
    """
    return mean_service + pk_mean_wait(arrival_rate, mean_service, 2 * mean_service**2)


def greedy_batching_mean_latency(arrival_rate: float, alpha: float, beta: float, max_size: int = 2000) -> float:
    """Exact mean latency of greedy batching with no cap and service ``alpha + beta * b``.

    Greedy: a free server takes *everything* waiting.  So the next batch holds
    the requests that arrived during the current batch's service — Poisson
    with mean ``lambda * s(b)`` — or, if none did, the next single arrival,
    served at once.  That makes successive batch sizes a Markov chain.  A
    request in the next batch waited, on average, half of the current batch's
    service (Poisson arrivals are uniform over it), then its own batch's
    service.  The chain is truncated at ``max_size`` (checked negligible).

    >>> round(greedy_batching_mean_latency(1e-6, 1.0, 0.5), 4)   # almost no load: one request, s(1)
    1.5
    """
    if not 0 < arrival_rate * beta < 1:
        raise ValueError(f"need 0 < arrival_rate * beta < 1 for stability, got {arrival_rate * beta!r}")
    sizes = np.arange(1, max_size + 1)
    service = alpha + beta * sizes
    # P[next batch = k | current = b]: Poisson(lambda s(b)) at k >= 1, with the k = 0 mass moved to k = 1.
    k = np.arange(0, max_size + 1)
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, max_size + 1)))])
    means = arrival_rate * service[:, None]
    pmf = np.exp(k[None, :] * np.log(means) - means - log_fact[None, :])  # rows b, columns k = 0..max
    transition = pmf[:, 1:].copy()
    transition[:, 0] += pmf[:, 0]
    if np.max(1 - transition.sum(axis=1)[: max_size // 2]) > 1e-9:
        raise ValueError("max_size is too small for this load: raise it")
    transition /= transition.sum(axis=1, keepdims=True)
    # Stationary distribution: the left eigenvector for eigenvalue 1, by power iteration from uniform.
    pi = np.full(max_size, 1.0 / max_size)
    for _ in range(100_000):
        nxt = pi @ transition
        if np.abs(nxt - pi).sum() < 1e-14:
            break
        pi = nxt
    # Per transition b -> k: total latency of the k requests of the new batch.
    wait_if_arrived = service[:, None] / 2  # each arrived during the previous service, uniformly
    total = pmf[:, 1:] * sizes[None, :] * (wait_if_arrived + service[None, :])
    total_per_b = total.sum(axis=1) + pmf[:, 0] * service[0]  # idle: the next one is served alone, no wait
    requests_per_b = (pmf[:, 1:] * sizes[None, :]).sum(axis=1) + pmf[:, 0]
    return float(pi @ total_per_b / (pi @ requests_per_b))


def batch_means_interval(samples: np.ndarray, n_batches: int = 20, confidence: float = 0.999) -> tuple[float, float]:
    """Mean and half-width of a confidence interval by the method of batch means.

    Consecutive latencies are correlated, so the naive standard error is too
    small.  Means of ``n_batches`` long consecutive blocks are nearly
    independent; their spread gives an honest interval.  With only
    ``n_batches`` means the half-width uses Student's t with ``n_batches - 1``
    degrees of freedom: 3.88 standard errors for 99.9 % with 20 batches (the
    normal 3.29 would be too narrow).

    >>> mean, half = batch_means_interval(np.arange(1000.0))
    >>> mean, half > 0
    (499.5, True)
    """
    samples = np.asarray(samples, dtype=float)
    n_batches = check_int("n_batches", n_batches, minimum=2)
    if len(samples) < n_batches:
        raise ValueError(f"need at least n_batches={n_batches} samples, got {len(samples)}")
    usable = len(samples) - len(samples) % n_batches
    means = samples[:usable].reshape(n_batches, -1).mean(axis=1)
    t = t_quantile(confidence, n_batches - 1)
    return float(samples.mean()), float(t * means.std(ddof=1) / math.sqrt(n_batches))


# --- networks of queues (notebook 06) ------------------------------------------------------------------
#
# - Erlang C: the mean latency of M/M/c, c servers sharing one FIFO queue.
# - Jackson's theorem: in an open network of exponential servers fed by Poisson arrivals, each station
#   behaves as if alone (M/M/c with the traffic it receives), so a tandem's mean latency is the sum of its
#   stations' (and, for single servers, the sojourn times are independent).
# - Fork-join: a request split into k tasks, one per parallel exponential server, and done when the last
#   one is.  Exact only for k = 2 (Flatto & Hahn 1984; the form below is Nelson & Tantawi's 1988):
#   (12 - rho) / 8 * 1 / (mu - lambda).  For k > 2, Nelson & Tantawi's scaling approximation.


def mmc_mean_latency(arrival_rate: float, mean_service: float, servers: int = 1) -> float:
    """Mean latency (wait + service) of M/M/c by Erlang's C formula.

    ``servers=1`` is M/M/1, ``1 / (mu - lambda)``.  Two servers at 80 % load each:

    >>> round(mmc_mean_latency(1.0, 1.0, 1), 6), round(mmc_mean_latency(1.6, 1.0, 2), 4)
    (inf, 2.7778)

    Little's law turns the latency into requests in the system, queued ones included: 9 servers offered 6
    servers' worth of work (3 per ms, 2 ms each) are busy 67 % of the time and hold 0.71 requests each (notebook 06:
    what an autoscaler's ``target_ongoing_requests`` counts):

    >>> round(3.0 * mmc_mean_latency(3.0, 2.0, 9) / 9, 2), round(3.0 * 2.0 / 9, 2)
    (0.71, 0.67)
    """
    servers = check_count("servers", servers)
    if arrival_rate <= 0 or mean_service <= 0:
        raise ValueError("arrival_rate and mean_service must be > 0")
    offered = arrival_rate * mean_service  # in servers' worth of work, a = lambda / mu
    rho = offered / servers
    if rho >= 1:
        return math.inf
    # Erlang C: P(wait) = (a^c / c!) / (1 - rho) / (sum_{k<c} a^k / k! + (a^c / c!) / (1 - rho))
    terms = [offered**k / math.factorial(k) for k in range(servers)]
    last = offered**servers / math.factorial(servers) / (1 - rho)
    p_wait = last / (sum(terms) + last)
    return mean_service + p_wait * mean_service / (servers * (1 - rho))


def jackson_tandem_mean_latency(arrival_rate: float, stations: list[float | tuple[float, int]]) -> float:
    """Mean end-to-end latency of exponential stations in series (Jackson's theorem).

    Each station is a mean service time (one server) or ``(mean service time, servers)``; every request
    visits every station once.  The network's mean latency is the sum of the stations' M/M/c latencies.

    >>> round(jackson_tandem_mean_latency(0.5, [1.0, (1.5, 2)]), 4)   # 1/(1 - 0.5) + M/M/2 at 37.5 % per server
    3.7455
    """
    total = 0.0
    for station in stations:
        mean, servers = station if isinstance(station, tuple) else (station, 1)
        total += mmc_mean_latency(arrival_rate, mean, servers)
    return total


def fork_join_mean_latency(arrival_rate: float, mean_service: float, branches: int = 2) -> float:
    """Mean latency of a fork-join over ``branches`` identical exponential servers (Poisson arrivals).

    Every request sends one task to each branch's FIFO queue and finishes when its last task does.  With
    ``rho = lambda / mu``:

    - 1 branch: M/M/1, ``1 / (mu - lambda)``;
    - 2 branches: exact (Flatto & Hahn; Nelson & Tantawi), ``(12 - rho) / 8 * 1 / (mu - lambda)``:
      1.5x one branch at light load, falling to 1.375x near saturation;
    - k > 2: Nelson & Tantawi's approximation, ``[H_k / H_2 + 4/11 (1 - H_k / H_2) rho] * R_2``, with
      ``H_k = 1 + 1/2 + ... + 1/k`` (within a few per cent of simulation for k <= 32, in their paper).

    >>> round(fork_join_mean_latency(0.5, 1.0, 2), 4)   # (12 - 0.5) / 8 / (1 - 0.5)
    2.875
    """
    branches = check_count("branches", branches)
    rho = arrival_rate * mean_service
    if not 0 < rho < 1:
        raise ValueError(f"load rho = arrival_rate * mean_service must be in (0, 1), got {rho!r}")
    one = mean_service / (1 - rho)  # 1 / (mu - lambda)
    if branches == 1:
        return one
    two = (12 - rho) / 8 * one
    if branches == 2:
        return two
    harmonic = sum(1 / i for i in range(1, branches + 1))
    ratio = harmonic / 1.5
    return (ratio + 4 / 11 * (1 - ratio) * rho) * two

