"""One reconcile pass over many managed instances on the local clouds: cloud calls and time.

Launches ``--instances`` broker-tagged instances (light, in-process) spread over two EC2
regions (moto) and two GCE zones in two regions (the fake), each with its running attempt in
the database, then times ``--passes`` reconcile passes. ``--baseline FILE`` also times the
reconcile module in FILE (e.g. ``git show HEAD:broker/services/reconcile.py > old.py``),
called as ``reconcile(engine, providers, regions_of)``. Cloud calls are the requests the
local clouds served during the pass. CPU seconds include the local clouds' threads (they run
in this process). Prints a table, then one JSON line.

    python -m bench.reconcile --instances 1000 --baseline /tmp/old_reconcile.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker import clock
from broker.clock import ManualClock
from broker.db.engine import create_schema, make_engine, open_session
from broker.services import admission, lifecycle
from broker.services.job_spec import JobSpec
from broker.services.plans import ChosenPlan
from broker.services.reconcile import reconcile
from broker.services.teams import create_team
from providers.aws import AwsProvider
from providers.base import TAG_ATTEMPT, TAG_JOB, TAG_TEAM, LaunchRequest, Provider
from providers.gcp import GcpProvider
from providers.local import LocalCloud

AWS_REGIONS = ["us-east-1", "us-west-2"]
GCP_ZONES = ["us-central1-a", "us-east1-b"]
WHERE = [
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge"),
    ("aws", "us-west-2", "us-west-2a", "p3.2xlarge"),
    ("gcp", "us-central1", "us-central1-a", "n1-standard-8"),
    ("gcp", "us-east1", "us-east1-b", "n1-standard-8"),
]
PRICE = 3_060_000  # micro-dollars an hour
SPEC = {
    "name": "bench",
    "workload": {"model": "ResNet-50", "batch_size": 128, "steps": 40000},
    "resources": {"gpus": 1, "gpu_types": ["V100"]},
    "deadline": "2027-06-01T12:00:00Z",
    "max_cost": "100.00",
    "market": "on_demand",
    "run": {"command": "python train.py"},
}


def _populate(engine: Any, providers: dict[str, Provider], count: int) -> None:
    """``count`` jobs, each with a running attempt on a launched, tagged instance."""
    with open_session(engine) as session:
        team = create_team(session, "bench", 10**15, "month", 0.8, clock.now())
        spec = JobSpec.model_validate(SPEC)
        for n in range(count):
            provider, region, zone, instance_type = WHERE[n % len(WHERE)]
            job, _ = admission.submit(session, team.id, spec, clock.now())
            plan = ChosenPlan(
                provider=provider,
                region=region,
                zone=zone,
                instance_type=instance_type,
                gpu="V100",
                gpu_count=1,
                market="on_demand",
                price_per_hour_micros=PRICE,
                expected_hours=1.0,
                expected_cost_micros=PRICE,
                worst_case_cost_micros=PRICE,
                p_deadline=1.0,
            )
            begun = lifecycle.begin_attempt(session, job.id, plan, clock.now())
            assert begun is not None
            attempt, _token = begun
            ref = providers[provider].launch(
                LaunchRequest(
                    token=attempt.id,
                    provider=provider,
                    region=region,
                    zone=zone,
                    instance_type=instance_type,
                    market="on_demand",
                    gpu="V100",
                    tags={TAG_JOB: job.id, TAG_ATTEMPT: attempt.id, TAG_TEAM: team.id},
                )
            )
            lifecycle.launch_succeeded(
                session, attempt.id, ref.instance_id, clock.now(), lease_seconds=86400.0
            )


def _load(path: Path) -> Callable[..., Any]:
    spec = importlib.util.spec_from_file_location("baseline_reconcile", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.reconcile  # type: ignore[no-any-return]


def _measure(cloud: LocalCloud, passes: int, run: Callable[[], Any]) -> dict[str, Any]:
    served = [0]
    decide = cloud.faults.decide

    def counted() -> Any:  # every request either local cloud serves asks the injector once
        served[0] += 1
        return decide()

    cloud.faults.decide = counted  # type: ignore[method-assign]
    walls, cpus, calls = [], [], []
    try:
        for _ in range(passes):
            served[0] = 0
            wall, cpu = time.perf_counter(), time.process_time()
            report = run()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            calls.append(served[0])
            assert not report.orphans_terminated and not report.attempts_marked_gone, report
            assert not report.failures, report.failures
    finally:
        cloud.faults.decide = decide  # type: ignore[method-assign]
    return {
        "cloud_calls": statistics.median(calls),
        "wall_s": round(statistics.median(walls), 3),
        "cpu_s": round(statistics.median(cpus), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--baseline", type=Path, default=None)
    args = parser.parse_args()

    manual = ManualClock(datetime.now(UTC))
    clock.set_clock(manual)
    folder = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    url = args.database_url or f"sqlite:///{folder / 'broker.db'}"
    engine = make_engine(url)
    create_schema(engine)
    with LocalCloud(
        aws_regions=AWS_REGIONS,
        gcp_zones=GCP_ZONES,
        market_interval_seconds=None,
        clock=manual,
        instance_runner="light",
    ) as cloud:
        settings = cloud.settings()
        providers: dict[str, Provider] = {
            "aws": AwsProvider.from_settings(settings),
            "gcp": GcpProvider.from_settings(settings),
        }
        started = time.perf_counter()
        _populate(engine, providers, args.instances)
        print(f"launched {args.instances} instances in {time.perf_counter() - started:.1f} s")
        results = {"after": _measure(cloud, args.passes, lambda: reconcile(engine, providers))}
        if args.baseline is not None:
            old = _load(args.baseline)
            regions = {name: p.regions() for name, p in providers.items()}
            results["before"] = _measure(
                cloud, args.passes, lambda: old(engine, providers, regions.__getitem__)
            )
    for name, figures in results.items():
        print(
            f"{name:>6}: {figures['cloud_calls']:>6} cloud calls  "
            f"{figures['wall_s']:>7.3f} s wall  {figures['cpu_s']:>7.3f} s CPU"
        )
    database = "postgresql" if url.startswith("postgresql") else "sqlite"
    print(
        json.dumps(
            {"instances": args.instances, "passes": args.passes, "database": database, **results}
        )
    )


if __name__ == "__main__":
    main()
