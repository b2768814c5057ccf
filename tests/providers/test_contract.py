"""The Provider contract, run against AWS-on-moto and GCP-on-the-GCE-fake."""

from __future__ import annotations

import math
from collections import Counter
from datetime import timedelta

import numpy as np
import pytest

from broker.clock import ManualClock
from providers.base import CapacityError, InstanceRef, TransientError
from providers.local import Fault, LocalCloud
from providers.local.instances import NOTICE_SECONDS
from providers.retry import FAST_RETRY, RetryPolicy
from tests.providers.conftest import ProviderCase


def _launch(case: ProviderCase, **changes: object) -> InstanceRef:
    ref = case.provider.launch(case.request(**changes))  # type: ignore[arg-type]
    case.launched.append(ref)
    return ref


def test_launch_twice_with_the_same_token_gives_one_instance(case: ProviderCase) -> None:
    request = case.request()
    first = case.provider.launch(request)
    second = case.provider.launch(request)
    case.launched.append(first)
    assert first == second
    state = case.provider.describe(first)
    assert state.status == "running"
    assert state.market == "spot"
    assert state.tags["broker-job"] == "job-1"
    assert state.launched_at.tzinfo is not None
    matching = [r for r in case.provider.list_managed(case.region) if r == first]
    assert len(matching) == 1


def test_terminate_twice_is_not_an_error(case: ProviderCase) -> None:
    ref = _launch(case, market="on_demand")
    assert case.provider.describe(ref).market == "on_demand"
    case.provider.terminate(ref)
    case.provider.terminate(ref)
    state = case.provider.describe(ref)
    assert state.status == "terminated"
    assert ref not in case.provider.list_managed(case.region)


def test_no_spot_capacity_surfaces_as_capacity_error(
    case: ProviderCase, local_cloud: LocalCloud
) -> None:
    local_cloud.market.set_available(case.provider.name, case.market_zone, case.gpu, False)
    with pytest.raises(CapacityError):
        case.provider.launch(case.request(market="spot"))
    on_demand = _launch(case, market="on_demand")
    assert case.provider.describe(on_demand).status == "running"


def test_list_managed_finds_exactly_the_brokers_instances(case: ProviderCase) -> None:
    ours = _launch(case)
    elsewhere = _launch(case, region=case.other_region, zone=case.other_zone)
    unmanaged = case.launch_unmanaged()
    listed = case.provider.list_managed(case.region)
    ids = {ref.instance_id for ref in listed}
    assert ours.instance_id in ids
    assert unmanaged not in ids
    assert elsewhere.instance_id not in ids
    assert ids == case.raw_managed(case.region)
    assert elsewhere in case.provider.list_managed(case.other_region)


def test_list_managed_gives_each_instance_state_and_tags(case: ProviderCase) -> None:
    request = case.request()
    ref = case.provider.launch(request)
    case.launched.append(ref)
    listed = {found.instance_id: found for found in case.provider.list_managed(case.region)}
    found = listed[ref.instance_id]
    assert found == ref
    assert found.state.status == "running"
    assert found.state.market == "spot"
    assert found.state.tags["broker-job"] == "job-1"
    assert found.state.tags["broker-attempt"] == request.token
    assert found.state.launched_at.tzinfo is not None


def test_describe_many_batches_the_calls_and_reports_gone_instances_as_such(
    case: ProviderCase, local_cloud: LocalCloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    batched = type(case.provider).from_settings(
        local_cloud.settings(), retry=FAST_RETRY, describe_batch=2
    )
    running = [_launch(case), _launch(case)]
    ended = _launch(case, market="on_demand")
    case.provider.terminate(ended)
    unknown = InstanceRef(
        case.provider.name,
        case.region,
        ended.zone,
        "i-0123456789abcdef0" if case.provider.name == "aws" else "broker-never-launched",
    )
    served = Counter[str]()
    decide = local_cloud.faults.decide

    def counted() -> object:  # every request either local cloud serves asks the injector
        served["calls"] += 1
        return decide()

    monkeypatch.setattr(local_cloud.faults, "decide", counted)

    states = batched.describe_many([*running, ended, unknown])

    assert set(states) == {*running, ended, unknown}
    assert [states[ref].status for ref in running] == ["running", "running"]  # type: ignore[union-attr]
    assert states[ended] is not None and states[ended].status == "terminated"
    assert states[unknown] is None
    # Four refs, two a call. GCE also reads the zone's operations for each instance not
    # listed. EC2: a status call per pair of ids (sorted), then a full describe, two ids a
    # call, of every id not shown up: the ended one, and both of the pair whose status call
    # the unknown id failed.
    if case.provider.name == "aws":
        ids = sorted(ref.instance_id for ref in [*running, ended, unknown])
        pairs = [ids[:2], ids[2:]]
        failed = next(pair for pair in pairs if unknown.instance_id in pair)
        described = {*failed, ended.instance_id}
        assert served["calls"] == len(pairs) + math.ceil(len(described) / 2)
    else:
        assert served["calls"] == 4


def test_regions_are_the_configured_ones(case: ProviderCase) -> None:
    assert {case.region, case.other_region} <= set(case.provider.regions())


def test_spot_instance_is_preempted_a_notice_window_after_its_trace_turns_unavailable(
    case: ProviderCase, local_cloud: LocalCloud, market_clock: ManualClock
) -> None:
    market = local_cloud.market
    name = case.provider.name
    market.set_available(name, case.market_zone, "*", None)  # follow the real trace
    trace = market.trace_for(name, case.market_zone, case.gpu)
    assert trace is not None
    current = int(market.position_seconds() // trace.gap_seconds) + 1
    turns = np.flatnonzero(trace.available[:-1] & ~trace.available[1:])
    tick = int(turns[turns >= current][0])
    # Middle of the last available tick, then one tick later: unavailable.
    market_clock.set(
        market.start_time
        + timedelta(seconds=(tick + 0.5) * trace.gap_seconds - market.offset_seconds)
    )
    assert market.is_available(name, case.market_zone, case.gpu)
    ref = _launch(case)
    market.step()
    assert case.provider.describe(ref).status == "running"
    market_clock.advance(trace.gap_seconds)
    assert not market.is_available(name, case.market_zone, case.gpu)
    market.step()  # the notice: the instance runs on through the window
    assert case.provider.describe(ref).status == "running"
    market_clock.advance(NOTICE_SECONDS[name] - 1)
    market.step()
    assert case.provider.describe(ref).status == "running"
    market_clock.advance(1)
    assert market.step() >= 1
    state = case.provider.describe(ref)
    assert state.status == "preempted"
    assert state.reason == "spot_preempted"
    assert state.terminated_at is not None


@pytest.mark.parametrize("kind", [Fault.THROTTLE, Fault.SERVER_ERROR, Fault.UNAVAILABLE])
def test_injected_faults_are_retried_and_succeed(
    case: ProviderCase, local_cloud: LocalCloud, kind: Fault
) -> None:
    local_cloud.faults.fail_next(3, kind)
    ref = _launch(case)
    assert local_cloud.faults.injected[kind] == 3
    local_cloud.faults.fail_next(2, kind)
    assert case.provider.describe(ref).status == "running"
    local_cloud.faults.fail_next(2, kind)
    case.provider.terminate(ref)


def test_a_fraction_of_faulty_calls_does_not_break_the_lifecycle(
    case: ProviderCase, local_cloud: LocalCloud
) -> None:
    local_cloud.faults.reset(rate=0.3)
    refs = [_launch(case) for _ in range(3)]
    for ref in refs:
        assert case.provider.describe(ref).status == "running"
        case.provider.terminate(ref)
    assert local_cloud.faults.total_injected > 0


def test_persistent_throttling_gives_up_with_transient_error(
    case: ProviderCase, local_cloud: LocalCloud
) -> None:
    ref = _launch(case)
    impatient = type(case.provider).from_settings(
        local_cloud.settings(), retry=RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.02)
    )
    local_cloud.faults.fail_next(10, Fault.THROTTLE)
    with pytest.raises(TransientError):
        impatient.describe(ref)
