"""The demo's jobs: each a valid submission running examples/train.py, one meant to fail."""

from __future__ import annotations

from broker.devstack.demo import (
    EXAMPLES,
    PROGRAM_STEPS,
    DemoJob,
    demo_jobs,
    unmet_expectation,
)
from broker.services.job_spec import JobSubmission
from tests.conftest import START


def test_every_demo_job_runs_train_py_from_the_examples_folder():
    assert (EXAMPLES / "job.yaml").is_file()
    jobs = demo_jobs(START)
    seeds = set()
    for job in jobs:
        run = job.spec["run"]
        assert run["command"].startswith("python train.py --seed ")
        assert f"--steps {PROGRAM_STEPS}" in run["command"]
        assert run["env"] == {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        seeds.add(run["command"].split()[3])
        spec = {**job.spec, "run": {**run, "workdir": "s3://bucket/workdirs/t/w.tar.gz"}}
        JobSubmission.model_validate(spec)
    assert len(seeds) == len(jobs)
    failing = [j for j in jobs if j.expect == "fails"]
    assert len(failing) == 1 and failing[0].spec["max_restarts_on_errors"] == 1
    command = failing[0].spec["run"]["command"]
    assert f"--fail-at-step {PROGRAM_STEPS // 2} --exit-code 3" in command


def test_the_failing_job_is_expected_to_end_failed_with_its_exit_code():
    job = DemoJob("vision", {"name": "crash"}, expect="fails", id="job_1")
    assert unmet_expectation(job) is None  # admitted, not finished yet
    job.final = {"status": "failed", "status_reason": "exit code 3: boom"}
    assert unmet_expectation(job) is None
    job.final = {"status": "succeeded", "status_reason": "program exited 0"}
    assert "should fail with exit code 3, not succeeded" in (unmet_expectation(job) or "")
    refused = DemoJob("vision", {"name": "crash"}, expect="fails", refusal="402 no money")
    assert "should be fails: 402 no money" in (unmet_expectation(refused) or "")
    assert unmet_expectation(DemoJob("nlp", {"name": "big"}, "over_budget", refusal="402")) is None
