"""The agent as an instance runs it: ``python3 broker/agent/agent.py`` as a subprocess with the
boot script's environment, against a fake broker, object store and metadata server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.fakes import ATTEMPT, JOB, ROOT, TOKEN, FakeBroker, fake_broker, tar_gz, untar

pytestmark = pytest.mark.timeout(60)

Program = Callable[[str], str]


def finish(agent: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    out, err = agent.communicate(timeout=timeout)
    return agent.returncode, out, err


def test_a_program_that_reports_and_exits_0_gets_its_checkpoint_progress_logs_and_exit_reported(
    fake: FakeBroker, program: Program, tmp_path: Path, agent_python: str
) -> None:
    seen = tmp_path / "seen.json"
    fake.spec["command"] = program(
        f"""
        import json, os, sys, time
        import broker_sdk

        folder = os.environ["BROKER_CHECKPOINT_DIR"]
        print("hello from the program", flush=True)
        broker_sdk.report(5)
        with open(os.path.join(folder, "model.txt"), "w") as out:
            out.write("weights at 10")
        broker_sdk.checkpoint_saved(os.path.join(folder, "model.txt"), step=10)
        env = {{k: v for k, v in os.environ.items() if k.startswith("BROKER_")}}
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        env["cwd"] = os.getcwd()
        with open({str(seen)!r}, "w") as out:
            json.dump(env, out)
        time.sleep(0.6)
        print("last words", file=sys.stderr, flush=True)
        """
    )
    instance = tmp_path / "instance"
    code, out, err = finish(fake.start_agent(instance, agent_python))

    assert code == 0, err
    (key,) = [k for k in fake.store if k.startswith(f"jobs/{JOB}/checkpoints/{ATTEMPT}/")]
    assert key.endswith(".tar.gz") and fake.store_types[key] == "application/gzip"
    assert untar(fake.store[key]) == {"model.txt": b"weights at 10"}
    reports = [c.body for c in fake.of("progress")]
    assert {"work_done": 10.0, "checkpoint_key": key} in reports
    assert reports[0]["checkpoint_key"] is None  # the first heartbeat, at once
    assert len(reports) >= 3  # every report_seconds while it runs
    assert fake.of("checkpoints")[0].body == {"work_done": 10.0}
    log = fake.log_text()
    assert "hello from the program\n" in log and "broker: step=5\n" in log
    assert "last words\n" in log
    (exit_call,) = fake.of("exit")
    assert exit_call.body["exit_code"] == 0 and exit_call.body["tail"].endswith("last words\n")
    routes = fake.routes()
    assert routes[:2] == ["run", "sdk"] and routes[-1] == "exit"
    assert routes.index("exit") > max(i for i, r in enumerate(routes) if r == "progress")
    assert all(c.headers["authorization"] == f"Bearer {TOKEN}" for c in fake.of("progress"))

    env = json.loads(seen.read_text())
    assert env["cwd"] == str(instance / "work")
    assert env["BROKER_CHECKPOINT_DIR"] == str(instance / "checkpoint")
    assert env["PYTHONPATH"].split(":")[0] == str(instance / "sdk")
    assert (env["BROKER_JOB_ID"], env["BROKER_ATTEMPT_ID"]) == (JOB, ATTEMPT)
    assert json.loads(env["BROKER_WORKLOAD"]) == {"reference_gpu_hours": 1.0}
    assert (env["BROKER_WORK_UNIT"], env["BROKER_TOTAL_WORK"]) == ("reference_gpu_hours", "100")
    assert env["BROKER_START_WORK"] == "0"
    assert "BROKER_AGENT_TOKEN" not in env and "BROKER_API_URL" not in env
    assert TOKEN not in out + err + log
    assert "hello from the program" in out  # the instance's own log has the output too


def test_the_restored_checkpoint_and_the_workdir_are_in_place_before_setup_and_command(
    fake: FakeBroker, tmp_path: Path
) -> None:
    old = f"jobs/{JOB}/checkpoints/att_old/7-1.tar.gz"
    fake.store[old] = tar_gz({"state.txt": "step 7"})
    fake.store["workdirs/team/w.tar.gz"] = tar_gz(
        {
            "prog.py": "import os\n"
            "folder = os.environ['BROKER_CHECKPOINT_DIR']\n"
            "print('restored:', open(os.path.join(folder, 'state.txt')).read())\n"
            "print('setup said:', open('setup.txt').read().strip())\n"
            "print('start work:', os.environ['BROKER_START_WORK'])\n",
            "data/input.txt": "x",
        }
    )
    fake.spec.update(
        restore={"key": old, "url": f"{fake.url}/store/{old}?X-Signature=s"},
        workdir={"url": f"{fake.url}/store/workdirs/team/w.tar.gz?X-Signature=s"},
        start_work=7.0,
        setup="test -f data/input.txt && echo ready > setup.txt",
        command="python3 prog.py",
        image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
    )
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    log = fake.log_text()
    assert "restored: step 7" in log and "setup said: ready" in log and "start work: 7" in log
    assert "runs the command on the host, not in pytorch/pytorch:2.5.1" in err
    assert fake.of("exit")[0].body["exit_code"] == 0
    assert "X-Signature" not in err  # presigned URLs stay out of the agent's log


def test_a_failing_program_is_reported_with_its_exit_code_and_last_stderr_line(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    fake.spec["command"] = program(
        """
        import sys
        for step in range(1, 5):
            print(f"broker: step={step}", flush=True)
        print("boom at step 4", file=sys.stderr, flush=True)
        sys.exit(3)
        """
    )
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    (exit_call,) = fake.of("exit")
    assert exit_call.body["exit_code"] == 3
    assert exit_call.body["tail"].splitlines()[-1] == "boom at step 4"
    assert not fake.of("preempted")
    assert fake.of("progress")[-1].body["work_done"] == 4.0


def test_a_failing_setup_ends_the_run_with_its_code_before_the_command(
    fake: FakeBroker, tmp_path: Path
) -> None:
    fake.spec.update(setup="echo installing; exit 7", command="echo should not run")
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    assert fake.of("exit")[0].body["exit_code"] == 7
    assert "installing" in fake.log_text() and "should not run" not in fake.log_text()


def test_output_past_the_log_limit_is_not_uploaded(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    limit, kept, truncated_at = 5000, 0, []

    def logs(number: int, text: str) -> tuple[int, dict]:
        nonlocal kept
        accepted = max(0, min(len(text), limit - kept))
        kept += len(text)
        if kept > limit and not truncated_at:
            truncated_at.append(number)
        return 200, {"accepted_bytes": accepted, "truncated": kept > limit}

    fake.answers["logs"] = logs
    fake.spec["log_limit_bytes"] = limit
    fake.spec["command"] = program(
        """
        import time
        for i in range(200):
            print("early line", i, "x" * 40, flush=True)
        time.sleep(1.0)
        for i in range(200):
            print("late line", i, flush=True)
        """
    )
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    assert len(fake.of("logs")) == truncated_at[0]  # nothing sent after the broker's "truncated"
    assert "early line 0 " in fake.log_text() and "late line" not in fake.log_text()
    assert "the log passed its limit (5000 bytes)" in err
    assert "late line 199" in fake.of("exit")[0].body["tail"]


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_a_preemption_notice_stops_the_program_uploads_its_checkpoint_and_reports_it(
    provider: str, program: Program, tmp_path: Path, agent_python: str
) -> None:
    with fake_broker(provider) as fake:
        fake.spec["command"] = program(
            """
            import os, signal, sys, time
            stopping = []
            signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
            step = 0
            while not stopping:
                step += 1
                print(f"broker: step={step}", flush=True)
                time.sleep(0.05)
            print("stop file there:", os.path.exists(os.environ["BROKER_STOP_FILE"]))
            path = os.path.join(os.environ["BROKER_CHECKPOINT_DIR"], "model.txt")
            with open(path, "w") as out:
                out.write(str(step))
            print(f"broker: step={step} checkpoint={path}", flush=True)
            sys.exit(143)
            """
        )
        agent = fake.start_agent(tmp_path / "instance", agent_python)
        fake.wait_for(lambda: any(c.body["work_done"] >= 3 for c in fake.of("progress")))
        fake.notice.set()
        code, _, err = finish(agent)

        assert code == 0, err
        (preempted,) = fake.of("preempted")
        reason = preempted.body["reason"]
        assert (
            ("instance-action: terminate" in reason) if provider == "aws" else "preempt" in reason
        )
        assert not fake.of("exit")  # stopped on purpose: not the program's error
        (key,) = fake.store
        saved = untar(fake.store[key])["model.txt"].decode()
        report = next(c for c in fake.of("progress") if c.body["checkpoint_key"] == key)
        assert report.body["work_done"] == float(saved)
        assert report.at < preempted.at
        assert "stop file there: True" in fake.log_text()
        poll = "aws notice poll" if provider == "aws" else "gce notice poll"
        assert fake.of(poll)


def test_a_notice_window_shorter_than_the_program_needs_still_gets_its_checkpoint(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    # On a local cloud at x1200 the 120 s AWS window is 0.1 wall seconds.
    fake.spec.update(notice_seconds=0.1)
    fake.spec["command"] = program(
        """
        import os, signal, sys, time
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        while not stopping:
            print("broker: step=1", flush=True)
            time.sleep(0.05)
        time.sleep(1.0)  # a slow save
        path = os.path.join(os.environ["BROKER_CHECKPOINT_DIR"], "model.txt")
        open(path, "w").write("saved")
        print(f"broker: step=2 checkpoint={path}", flush=True)
        sys.exit(143)
        """
    )
    agent = fake.start_agent(tmp_path / "instance")
    fake.wait_for(lambda: any(c.body["work_done"] >= 1 for c in fake.of("progress")))
    fake.notice.set()
    code, _, err = finish(agent)

    assert code == 0, err
    assert [untar(data) for data in fake.store.values()] == [{"model.txt": b"saved"}]
    assert fake.of("progress")[-1].body["work_done"] == 2.0 and fake.of("preempted")


def test_train_py_under_the_agent_keeps_its_work_through_a_notice(
    fake: FakeBroker, tmp_path: Path
) -> None:
    fake.seconds_per_work_unit = 2.0  # 1000 steps, 1 work unit: 2 s of wall time at this pace
    train = ROOT / "examples" / "train.py"
    fake.spec.update(command=f"{sys.executable} {train} --seed 5", total_work=1.0)
    agent = fake.start_agent(tmp_path / "instance", BROKER_LOCAL_PACE_URL=f"{fake.url}/pace")
    fake.wait_for(lambda: any(c.body["work_done"] >= 0.2 for c in fake.of("progress")))
    fake.notice.set()
    code, _, err = finish(agent)

    assert code == 0, err
    assert fake.of("preempted") and not fake.of("exit")
    assert json.loads(fake.of("pace")[0].body) == fake.spec["workload"]
    reports = [c.body for c in fake.of("progress")]
    key, last = next(
        (r["checkpoint_key"], r["work_done"]) for r in reversed(reports) if r["checkpoint_key"]
    )
    assert last >= max(r["work_done"] for r in reports) - 1e-9  # no reported work lost
    files = untar(fake.store[key])
    assert json.loads(files["state.json"])["step"] == round(last * 1000)
    assert "model.npz" in files and "train: SIGTERM at step" in fake.log_text()


LOOP_UNTIL_SIGTERM = """
    import signal, sys, time
    def stop(*_):
        open({marker!r}, "w").write("stopped")
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    step = 0
    while True:
        step += 1
        print(f"broker: step={{step}}", flush=True)
        time.sleep(0.05)
    """


def test_without_a_lease_renewal_in_time_the_program_is_stopped_and_the_agent_exits_1(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    marker = tmp_path / "stopped"
    fake.spec.update(
        command=program(LOOP_UNTIL_SIGTERM.format(marker=str(marker))),
        lease_seconds_left=3.0,
        clock_scale=2.0,  # 3 broker seconds: 1.5 wall seconds
    )

    def progress(number: int, body: dict) -> tuple[int, dict]:
        if number > 2:
            return 503, {"detail": "the broker is down"}
        ack = {"job_status": "running", "work_done": 0.0, "total_work": 100.0}
        return 200, {**ack, "should_stop": False, "lease_seconds_left": 3.0}

    fake.answers["progress"] = progress
    fake.answers["lapsed"] = lambda number, body: (503, {"detail": "the broker is down"})
    started = time.monotonic()
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 1, err
    assert marker.read_text() == "stopped"
    assert "renewed the lease" in err
    assert time.monotonic() - started < 15
    assert not fake.of("exit") and not fake.of("preempted")
    assert len(fake.of("progress")) >= 3  # it kept trying
    assert "could not report the lapsed lease" in err  # tried, for at most a few seconds


def test_a_lease_the_broker_answers_but_does_not_renew_is_reported_lapsed_at_once(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    """A broker that answers but whose loop fell behind: the agent stops at its lease's end
    and says so, so the attempt ends then rather than when the broker's sweep comes round."""
    marker = tmp_path / "stopped"
    fake.spec.update(
        command=program(LOOP_UNTIL_SIGTERM.format(marker=str(marker))),
        lease_seconds_left=3.0,
        clock_scale=2.0,
    )

    def progress(number: int, body: dict) -> tuple[int, dict]:
        ack = {"job_status": "running", "work_done": 0.0, "total_work": 100.0}
        return 200, {**ack, "should_stop": False, "lease_seconds_left": 0.0 if number > 2 else 3.0}

    fake.answers["progress"] = progress
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 1, err
    assert marker.read_text() == "stopped"
    assert len(fake.of("lapsed")) == 1 and fake.of("lapsed")[0].body == {}
    assert "reported the lapsed lease: job preempted" in err
    assert not fake.of("exit") and not fake.of("preempted")


@pytest.mark.parametrize("answer", ["should_stop", "409"])
def test_when_the_broker_says_the_attempt_is_over_the_program_is_stopped_quietly(
    answer: str, fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    marker = tmp_path / "stopped"
    fake.spec["command"] = program(LOOP_UNTIL_SIGTERM.format(marker=str(marker)))

    def progress(number: int, body: dict) -> tuple[int, dict]:
        if number < 3:
            ack = {"job_status": "running", "work_done": 0.0, "total_work": 100.0}
            return 200, {**ack, "should_stop": False, "lease_seconds_left": 600.0}
        if answer == "409":
            return 409, {"detail": "attempt ended"}
        ack = {"job_status": "cancelled", "work_done": 0.0, "total_work": 100.0}
        return 200, {**ack, "should_stop": True, "lease_seconds_left": 0.0}

    fake.answers["progress"] = progress
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    assert marker.read_text() == "stopped"
    assert not fake.of("exit") and not fake.of("preempted")


def test_a_refused_run_spec_ends_the_agent_without_running_anything(
    fake: FakeBroker, tmp_path: Path
) -> None:
    fake.answers["run"] = lambda number, body: (409, {"detail": "attempt ended"})
    code, _, err = finish(fake.start_agent(tmp_path / "instance"))

    assert code == 0, err
    assert fake.routes() == ["run"]


def test_the_agent_forwards_its_own_sigterm_to_the_program(
    fake: FakeBroker, program: Program, tmp_path: Path
) -> None:
    marker = tmp_path / "stopped"
    fake.spec["command"] = program(LOOP_UNTIL_SIGTERM.format(marker=str(marker)))
    agent = fake.start_agent(tmp_path / "instance")
    fake.wait_for(lambda: len(fake.of("progress")) >= 2)
    agent.send_signal(signal.SIGTERM)
    code, _, err = finish(agent)

    assert code == 1, err
    assert marker.read_text() == "stopped"
