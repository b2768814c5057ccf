"""Simulated training on the local clouds' instances.

What runs on a real instance is the user's training script calling ``broker.agent``. Here a
thread stands in for every running broker instance: it reads the instance's resume
information (its user data, as a script on the instance would), advances work at a speed
drawn around the throughput model's prediction for that GPU, pays a restore overhead at
start, writes checkpoints to the object store at the job's interval and reports through the
same ``broker.agent`` client a real script uses. Time is the broker's clock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import boto3
import httpx
import numpy as np

from broker import clock
from broker.agent import Agent
from broker.bundled import bundled_throughput_model
from broker.core.throughput import ThroughputModel, Workload

log = logging.getLogger(__name__)

Resume = dict[str, Any]


@dataclass
class _Run:
    agent: Agent
    resume: Resume
    speed: float  # work per hour on this instance
    ready_at: datetime  # restore done: work starts
    last_seen: datetime
    last_checkpoint: datetime
    last_report: datetime
    work: float
    finished: bool = False  # the final checkpoint has been reported


def true_speed_factor(model: str, gpu: str, spread: float) -> float:
    """A fixed per-(model, GPU) deviation of real speed from the model's prediction."""
    if spread <= 0:
        return 1.0
    seed = int.from_bytes(hashlib.sha256(f"{model}|{gpu}".encode()).digest()[:8], "little")
    return float(np.exp(np.random.default_rng(seed).normal(0.0, spread)))


class SimulatedTraining:
    """Pretends to train on every running broker instance it can see."""

    def __init__(
        self,
        sources: list[Callable[[], Iterator[tuple[str, Resume]]]],
        storage_put: Callable[[str, bytes], None],
        *,
        throughput: ThroughputModel | None = None,
        report_every_seconds: float = 300,
        restore_seconds: float = 360,
        speed_spread: float = 0.1,
        noise: float = 0.03,
        seed: int = 7,
        http: httpx.Client | None = None,
    ) -> None:
        self._sources = sources
        self._put = storage_put
        self._throughput = throughput or bundled_throughput_model()
        self._report_every = report_every_seconds
        self._restore = restore_seconds
        self._spread = speed_spread
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self._http = http
        self._runs: dict[str, _Run] = {}
        # Per job id: real speed / predicted beyond the usual spread (a slower host, say).
        self.speed_overrides: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _speed(self, resume: Resume, gpu: str, gpu_count: int) -> float:
        workload = Workload.from_mapping(resume["workload"])
        rate = float(
            self._throughput.work_per_hour(workload, np.array([gpu]), np.array([gpu_count]))[0]
        )
        return rate * true_speed_factor(workload.model or "reference", gpu, self._spread)

    def step(self) -> int:
        """Advance every visible run to now; returns how many instances are training."""
        now = clock.now()
        seen: set[str] = set()
        complete = True
        for source in self._sources:
            try:
                instances = list(source())
            except Exception as error:  # a flaky local cloud must not kill the thread
                log.warning("listing instances failed: %s", error)
                complete = False
                continue
            for attempt_id, resume in instances:
                if "token" not in resume:
                    continue  # not launched by the broker's runner: nothing trains there
                seen.add(attempt_id)
                try:
                    self._advance(attempt_id, resume, now)
                except Exception as error:  # e.g. a checkpoint write refused: retried next step
                    log.warning("training step failed: %s", error, extra={"attempt_id": attempt_id})
        if complete:  # a failed listing says nothing about which instances are gone
            for gone in set(self._runs) - seen:
                self._runs.pop(gone).agent.close()
        return len(self._runs)

    def _advance(self, attempt_id: str, resume: Resume, now: datetime) -> None:
        run = self._runs.get(attempt_id)
        if run is None:
            agent = Agent(resume["api_url"], attempt_id, resume["token"], client=self._http)
            speed = self._speed(resume, resume["gpu"], int(resume["gpu_count"]))
            run = _Run(
                agent,
                resume,
                speed,
                ready_at=now + timedelta(seconds=self._restore),
                last_seen=now,
                last_checkpoint=now,
                last_report=now,
                work=float(resume["start_work"]),
            )
            self._runs[attempt_id] = run
        start = max(run.last_seen, run.ready_at)
        if now > start:
            hours = (now - start).total_seconds() / 3600
            jitter = max(0.0, 1.0 + self._rng.normal(0.0, self._noise))
            jitter *= self.speed_overrides.get(str(resume.get("job_id")), 1.0)
            run.work = min(run.work + run.speed * hours * jitter, float(resume["total_work"]))
        run.last_seen = now
        interval = float(resume["checkpoint_interval_seconds"])
        done = run.work >= float(resume["total_work"])
        if done and run.finished:
            return  # the final checkpoint is reported; the broker will stop the instance
        try:
            if done or (now - run.last_checkpoint).total_seconds() >= interval:
                key = f"{resume['checkpoint_prefix']}/{attempt_id}/work-{run.work:.6g}"
                self._put(key, json.dumps({"work_done": run.work}).encode())
                ack = run.agent.checkpoint_saved(key, run.work)
                run.last_checkpoint = run.last_report = now
                run.finished = done
            elif (now - run.last_report).total_seconds() >= self._report_every:
                ack = run.agent.report(run.work)
                run.last_report = now
            else:
                return
        except httpx.HTTPError as error:
            log.warning(
                "progress report failed", extra={"attempt_id": attempt_id, "error": str(error)}
            )
            return
        if ack.should_stop:
            log.debug("job ended; run stops", extra={"attempt_id": attempt_id})

    def start(self, interval_seconds: float = 0.5) -> SimulatedTraining:
        """Step in a background thread every ``interval_seconds`` of wall time."""

        def loop() -> None:
            while not self._stop.wait(interval_seconds):
                self.step()

        self._thread = threading.Thread(target=loop, name="simulated-training", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def ec2_instances(
    endpoint_url: str | None, regions: list[str], **credentials: Any
) -> Callable[[], Iterator[tuple[str, Resume]]]:
    """A source of running broker instances on EC2 with their user data (the instance's view)."""
    from providers.aws import hide_user_data_in_botocore_logs

    hide_user_data_in_botocore_logs()  # DescribeInstanceAttribute returns the agent token
    clients = {
        r: boto3.client("ec2", region_name=r, endpoint_url=endpoint_url, **credentials)
        for r in regions
    }

    resumes: dict[str, tuple[str, Resume]] = {}  # user data never changes: read it once

    def running() -> Iterator[tuple[str, Resume]]:
        for client in clients.values():
            pages = client.get_paginator("describe_instances").paginate(
                Filters=[
                    {"Name": "tag-key", "Values": ["broker-attempt"]},
                    {"Name": "instance-state-name", "Values": ["running"]},
                ]
            )
            for page in pages:
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        key = instance["InstanceId"]
                        if key not in resumes:
                            resumes[key] = _ec2_resume(client, instance)
                        yield resumes[key]

    return running


def _ec2_resume(client: Any, instance: dict[str, Any]) -> tuple[str, Resume]:
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    reply = client.describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )
    raw = reply.get("UserData", {}).get("Value", "")
    return tags["broker-attempt"], json.loads(base64.b64decode(raw)) if raw else {}


def gce_instances(endpoint_url: str, project: str) -> Callable[[], Iterator[tuple[str, Resume]]]:
    """A source of running broker instances on Compute Engine with their resume metadata."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    from providers.gcp_instance import RESUME_METADATA_KEY

    client = compute_v1.InstancesClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options=ClientOptions(api_endpoint=endpoint_url),
    )

    def running() -> Iterator[tuple[str, Resume]]:
        request = compute_v1.AggregatedListInstancesRequest(
            project=project, filter="labels.broker-attempt:*"
        )
        for _zone, scoped in client.aggregated_list(request=request):
            for instance in scoped.instances:
                if instance.status != "RUNNING":
                    continue
                items = {item.key: item.value for item in instance.metadata.items}
                raw = items.get(RESUME_METADATA_KEY)
                if raw:
                    resume = json.loads(raw)
                    yield resume.get("attempt_id", ""), resume

    return running
