"""The spot model's prior: what the bundled availability traces say of each (provider, zone,
instance family) before the broker has seen any attempt of its own.

A zone and family a trace covers gets that trace's runs of spot windows and outages
(``broker.core.spot_model.PRIOR_RUNS`` of them, its traces pooled); every other key gets the
fleet (every trace pooled, fewer runs: ``FLEET_PRIOR_RUNS``). The traces were taken on p3 (V100)
and p2 (K80) instances (``TRACE_FAMILIES``). They name AWS zones (us-east-1a); the catalog and
the attempts use zone ids (use1-az6). Zone names map to ids per account on real AWS and the
traces do not say theirs, so the rule is the local cloud's: ``TRACE_ZONE_IDS`` is moto's fixed
table, under which the market replay (``providers.local.market``) drives the zone id a trace
is matched to by that same trace. On a real account the zone-level match is a guess within
the right region, which the broker's observations correct (``broker.services.spot_model``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import numpy as np

from broker.core import spot_model as core
from broker.core.offers import OfferTable
from broker.core.spot_chain import run_lengths
from pricing.traces import bundled_traces

Key = tuple[str, str, str]  # (provider, zone, family)
FLEET = "fleet"
DIGITS = 4  # run lengths are kept to 0.36 s
TRACE_FAMILIES = {"V100": "p3", "K80": "p2"}  # the instances the traces' GPUs ran on
# The zone ids of the zones the traces name, as the local cloud (moto) maps them.
TRACE_ZONE_IDS = {
    "us-east-1a": "use1-az6",
    "us-east-1c": "use1-az2",
    "us-east-1d": "use1-az4",
    "us-east-1f": "use1-az5",
    "us-east-2b": "use2-az2",
    "us-west-2a": "usw2-az2",
    "us-west-2b": "usw2-az1",
    "us-west-2c": "usw2-az3",
}


@dataclass(frozen=True)
class Prior:
    """The runs a model starts from, and the traces they came from."""

    source: str  # FLEET or the trace names, comma-separated
    up: tuple[float, ...]
    down: tuple[float, ...]


def rounded(runs: Iterable[float]) -> tuple[float, ...]:
    """Run lengths as the model keeps them (``DIGITS`` decimals of an hour)."""
    return tuple(round(float(r), DIGITS) for r in runs)


def _prior(names: list[str], ups: list[np.ndarray], downs: list[np.ndarray], n: int) -> Prior:
    return Prior(
        ",".join(names),
        rounded(core.prior_sample(np.concatenate(ups), n)),
        rounded(core.prior_sample(np.concatenate(downs), n)),
    )


@cache
def zone_priors() -> dict[Key, Prior]:
    """The prior of each (provider, zone id, family) a bundled trace covers (its traces
    pooled)."""
    pooled: dict[Key, tuple[list[str], list[np.ndarray], list[np.ndarray]]] = {}
    for trace in bundled_traces():
        zone, name = TRACE_ZONE_IDS.get(trace.zone), TRACE_FAMILIES.get(trace.gpu.upper())
        if zone is None or name is None:
            continue
        up, down = run_lengths(trace.available, trace.gap_seconds / 3600.0)
        names, ups, downs = pooled.setdefault(("aws", zone, name), ([], [], []))
        names.append(trace.name)
        ups.append(up)
        downs.append(down)
    return {key: _prior(*runs, core.PRIOR_RUNS) for key, runs in pooled.items()}


@cache
def fleet_prior() -> Prior:
    """Every bundled trace pooled, down-weighted: the prior of a zone with no trace."""
    runs = [run_lengths(t.available, t.gap_seconds / 3600.0) for t in bundled_traces()]
    prior = _prior([], [u for u, _ in runs], [d for _, d in runs], core.FLEET_PRIOR_RUNS)
    return Prior(FLEET, prior.up, prior.down)


def prior_for(key: Key) -> Prior:
    """The prior of one (provider, zone, family)."""
    return zone_priors().get(key) or fleet_prior()


@cache
def prior_stats(prior: Prior) -> core.SpotStats:
    """Rates of a prior alone (a key before its first refit)."""
    return core.spot_stats(core.zone_history(prior.up, prior.down))


def prior_rate(key: Key) -> float:
    """Preemptions per hour on spot of one key's prior."""
    return prior_stats(prior_for(key)).preemptions_per_hour


def offer_keys(offers: OfferTable) -> np.ndarray:
    """Each offer row's key, joined by ``\\x1f`` (split with ``split_key``)."""
    return np.char.add(
        np.char.add(np.char.add(offers.provider, "\x1f"), offers.zone),
        np.char.add("\x1f", core.families(offers)),
    )


def split_key(joined: str) -> Key:
    """The (provider, zone, family) of one ``offer_keys`` entry."""
    provider, zone, name = joined.split("\x1f")
    return provider, zone, name


def prior_rates(offers: OfferTable) -> np.ndarray:
    """Every offer row's prior preemption rate (one fit per distinct key)."""
    if len(offers) == 0:
        return np.zeros(0)
    unique, inverse = np.unique(offer_keys(offers), return_inverse=True)
    values = np.array([prior_rate(split_key(str(k))) for k in unique])
    return values[inverse.reshape(-1)]
