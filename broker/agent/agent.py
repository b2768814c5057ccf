#!/usr/bin/env python3
"""The broker's agent: runs one attempt's program on a training instance and speaks for it.

The boot script exports BROKER_API_URL, BROKER_ATTEMPT_ID, BROKER_AGENT_TOKEN,
BROKER_PROVIDER and BROKER_NODE_RANK and runs this file with python3 (standard library only,
Python 3.8+).

1. Prepare: fetch the run spec (GET /v1/attempts/{id}/run); make $dir/checkpoint (the
   program's BROKER_CHECKPOINT_DIR), $dir/work (its working folder) and $dir/sdk (broker_sdk.py,
   on its PYTHONPATH); restore the latest checkpoint and unpack the workdir.
2. Run `setup` then `command` with bash in its own process group: inside `image` with docker
   on a cloud, on the host on a local instance.
3. While it runs: upload its output to /logs every log_flush_seconds (up to log_limit_bytes);
   report the work of its last `broker: step=<work>` line to /progress every report_seconds
   (the heartbeat); after a `broker: step=<work> checkpoint=<path>` line, tar the checkpoint
   folder, PUT it to the URL /checkpoints hands out and report /progress with its key; watch
   the cloud's metadata for a spot preemption notice.
4. End: when the program exits, report /exit with its code and the output's tail. On a notice,
   SIGTERM the program, upload the checkpoint it saves and report /preempted. When the broker
   says stop (should_stop, or 409: the attempt ended), stop the program and quit quietly. When
   no progress ack has renewed the spend lease in time (the broker is unreachable or behind),
   stop the program, report /lapsed if the broker answers within LAPSE_REPORT_SECONDS, and
   exit 1. The boot script powers the machine off after the agent exits.

A gang (a multi-node attempt: the run spec's ``gang``) shares one attempt and token; every
call names the node's rank (BROKER_NODE_RANK). Node 0 picks its address and a free port and
reports them (POST /rendezvous) before it starts the program; node k >= 1 restores the same
checkpoint, then asks for its run spec every RENDEZVOUS_POLL_SECONDS until the rendezvous is
known (giving up after RENDEZVOUS_WAIT_SECONDS, or BROKER_RENDEZVOUS_WAIT_SECONDS in the
agent's environment, with a non-zero exit report). Each program gets
BROKER_NODE_RANK, BROKER_NUM_NODES, BROKER_MASTER_ADDR, BROKER_MASTER_PORT and torchrun's
NODE_RANK, NNODES, MASTER_ADDR, MASTER_PORT. Only node 0 reports work and uploads checkpoints;
the other nodes' reports are heartbeats. A notice on node k >= 1 is reported at once (it has
nothing to save). A gang node's non-zero exit is reported only after a grace (the notice
window plus GANG_EXIT_GRACE_SECONDS, node 0 half of that constant more: it hears of every
node's loss) in which the attempt did not end: a program usually fails because another node
went away, and that node's notice, exit report or the broker's finding is the real cause.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any

PROGRESS_LINE = re.compile(r"^broker: step=(\S+)(?:\s+checkpoint=(.*?))?\s*$")
LOG_CHUNK_BYTES = 256 * 1024
LOG_BUFFER_BYTES = 16 * 1024 * 1024  # output kept while the broker does not take it
LINE_BYTES = 64 * 1024  # a longer line (a progress bar without newlines) is split
TAIL_LINES = 40
TAIL_CHARS = 4096
STOP_GRACE_SECONDS = 30.0
LAPSE_REPORT_SECONDS = 5.0  # the lapse report's time: the broker may be what is unreachable
UPLOAD_WAIT_SECONDS = 900.0  # how long an exiting program's last checkpoint may take
METADATA = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
NOTICE_FLOOR_SECONDS = 5.0
"""At least this long the program may take to stop after a notice, and as long again its
checkpoint's upload: on a fast (scaled) local clock the notice window is a fraction of a second,
and waiting past it costs nothing (the cloud reclaims the machine when it wants)."""
RENDEZVOUS_POLL_SECONDS = 1.0
RENDEZVOUS_WAIT_SECONDS = 600.0  # how long node k >= 1 waits for node 0's rendezvous
GANG_EXIT_GRACE_SECONDS = 10.0
PROGRAM_VARS = (  # what the program gets besides the job's env and gang_env's (docker: -e)
    "BROKER_JOB_ID",
    "BROKER_ATTEMPT_ID",
    "BROKER_CHECKPOINT_DIR",
    "BROKER_WORKLOAD",
    "BROKER_WORK_UNIT",
    "BROKER_TOTAL_WORK",
    "BROKER_START_WORK",
    "BROKER_STOP_FILE",
    "PYTHONPATH",
)
_print_lock = threading.Lock()


def say(message: str) -> None:
    """The agent's own diagnostics, on stderr (the instance's agent log). Never the token."""
    with _print_lock:
        sys.stderr.write("agent: " + message + "\n")
        sys.stderr.flush()


def shown(url: str) -> str:
    """A URL fit for a log line: without its query (a presigned URL's signature)."""
    return url.split("?", 1)[0]


# -- HTTP -------------------------------------------------------------------------------------


class HttpError(Exception):
    """A non-2xx answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail[:300]}")
        self.status = status


class NoRendezvous(Exception):
    """Node 0 of the gang reported no rendezvous in time."""


class Refused(Exception):
    """The broker refused the attempt for good: 409 (it ended), 401 or 404 (not our token)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the broker refused the attempt (HTTP {status})")
        self.status = status


def request(
    method: str,
    url: str,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    *,
    upload: str | None = None,
    save_to: str | None = None,
    timeout: float = 30.0,
    retry_for: float = 60.0,
) -> tuple[bytes, Any]:
    """One HTTP call: the body and headers of a 2xx answer (``upload``: a file sent as the body,
    ``save_to``: a file the body is written to). Connection errors, 429 and 5xx are retried
    with backoff for ``retry_for`` seconds; other answers raise HttpError at once."""
    started, delay = time.monotonic(), 0.5
    while True:
        try:
            with contextlib.ExitStack() as stack:
                sent = dict(headers or {})
                body: Any = data
                if upload is not None:
                    body = stack.enter_context(open(upload, "rb"))
                    sent["Content-Length"] = str(os.path.getsize(upload))
                call = urllib.request.Request(url, data=body, headers=sent, method=method)
                answer = stack.enter_context(urllib.request.urlopen(call, timeout=timeout))
                if save_to is None:
                    return answer.read(), answer.headers
                shutil.copyfileobj(answer, stack.enter_context(open(save_to, "wb")), 1 << 20)
                return b"", answer.headers
        except urllib.error.HTTPError as error:
            failure: Exception = HttpError(error.code, _detail(error))
            if error.code != 429 and error.code < 500:
                raise failure from None
        except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out
            failure = error
        if time.monotonic() - started + delay > retry_for:
            raise failure
        time.sleep(delay)
        delay = min(delay * 2, 10.0)


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        return error.read().decode("utf-8", "replace")
    except Exception:
        return str(error.reason)


class Broker:
    """The broker's agent routes, called with the attempt's token (as gang node ``node``)."""

    def __init__(self, api_url: str, attempt_id: str, token: str, node: int = 0) -> None:
        self.base = api_url.rstrip("/")
        self.attempt_id = attempt_id
        self.node = node
        self._auth = {"Authorization": "Bearer " + token}

    def call(self, method: str, path: str, data: bytes | None = None, **kwargs: Any) -> bytes:
        """``path`` under the API, e.g. ``/v1/agent/sdk?...``; 401/404/409 raise Refused."""
        headers = dict(self._auth, **kwargs.pop("headers", {}))
        try:
            return request(method, self.base + path, data, headers, **kwargs)[0]
        except HttpError as error:
            if error.status in (401, 404, 409):
                raise Refused(error.status) from None
            raise

    def attempt(self, method: str, route: str, payload: Any = None, **kwargs: Any) -> Any:
        """A JSON call to ``/v1/attempts/{id}/{route}``; ``text`` sends a text body instead.
        A gang node >= 1 names itself: a ``node`` field in a JSON body, else in the query."""
        text = kwargs.pop("text", None)
        query = ""
        if self.node and isinstance(payload, dict):
            payload = dict(payload, node=self.node)
        elif self.node:
            query = "?node=" + str(self.node)
        if text is not None:
            data, kind = text, "text/plain; charset=utf-8"
        else:
            data = None if payload is None else json.dumps(payload).encode()
            kind = "application/json"
        path = f"/v1/attempts/{urllib.parse.quote(self.attempt_id)}/{route}{query}"
        headers = {"Content-Type": kind} if data is not None else {}
        return json.loads(self.call(method, path, data, headers=headers, **kwargs) or b"null")


# -- files ------------------------------------------------------------------------------------


def pack(folder: str, archive: str) -> None:
    """A tar.gz of everything in ``folder`` (members relative to it)."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for name in sorted(os.listdir(folder)):
            tar.add(os.path.join(folder, name), arcname=name)


def unpack(archive: str, folder: str) -> None:
    """Extract a tar.gz into ``folder``, refusing members that would land outside it."""
    with tarfile.open(archive, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(folder, filter="data")
            return
        base = os.path.realpath(folder)
        for member in tar.getmembers():
            targets = [member.name]
            if member.issym() or member.islnk():
                targets.append(os.path.join(os.path.dirname(member.name), member.linkname))
            for target in targets:
                where = os.path.realpath(os.path.join(base, target))
                if member.isdev() or os.path.commonpath([base, where]) != base:
                    raise ValueError(f"unsafe archive member {member.name!r}")
        tar.extractall(folder)


def fetch_archive(source: dict[str, str], folder: str, scratch: str) -> None:
    """Download a tar.gz (``{"url"}``, or ``{"s3"}`` with the aws CLI) and unpack it."""
    fd, archive = tempfile.mkstemp(suffix=".tar.gz", dir=scratch)
    os.close(fd)
    try:
        if "url" in source:
            request("GET", source["url"], save_to=archive, timeout=120, retry_for=300)
        elif shutil.which("aws"):
            subprocess.run(["aws", "s3", "cp", "--quiet", source["s3"], archive], check=True)
        else:
            raise ValueError(f"{source.get('s3')} needs the aws CLI on the instance")
        unpack(archive, folder)
    finally:
        os.remove(archive)


# -- the program ------------------------------------------------------------------------------


def run_script(spec: dict[str, Any]) -> str:
    """The bash script: ``setup`` (a failure ends the run with its code), then ``command`` in
    place of the shell, so that a signal to the script reaches the program."""
    lines = []
    if (spec.get("setup") or "").strip():
        lines.append(f"bash -c {shlex.quote(spec['setup'])} || exit $?")
    lines.append(f"exec bash -c {shlex.quote(spec['command'])}")
    return "\n".join(lines) + "\n"


def container_name(spec: dict[str, Any]) -> str:
    return "broker-" + re.sub(r"[^A-Za-z0-9_.-]", "-", str(spec["attempt_id"]))


def command_argv(spec: dict[str, Any], dirs: dict[str, str], local: bool) -> list[str]:
    """How the program starts: ``bash -c <script>`` on the host, or, when the spec has an
    ``image`` and this is a cloud instance, the script inside that image with docker."""
    script = run_script(spec)
    if not spec.get("image") or local:
        return ["bash", "-c", script]
    # --init: a PID 1 that forwards signals (to the whole group, TINI_KILL_PROCESS_GROUP) and
    # reaps; --ipc host: PyTorch's data loader workers need more than docker's 64 MB /dev/shm.
    argv = ["docker", "run", "--rm", "--gpus", "all", "--network", "host", "--ipc", "host"]
    argv += ["--init", "--name", container_name(spec), "-e", "TINI_KILL_PROCESS_GROUP=1"]
    for folder in (dirs["checkpoint"], dirs["work"], dirs["sdk"]):
        argv += ["-v", f"{folder}:{folder}"]
    for name in sorted(
        set(spec.get("env") or {}) | set(PROGRAM_VARS) | set(gang_env(spec.get("gang")))
    ):
        argv += ["-e", name]  # the value comes from docker's own environment, not argv
    return argv + ["-w", dirs["work"], spec["image"], "bash", "-c", script]


def number(value: float) -> str:
    return format(float(value), ".12g")


def stop_file(dirs: dict[str, str]) -> str:
    """The file whose existence tells ``broker_sdk.should_stop()`` to say True."""
    return os.path.join(dirs["sdk"], "broker-stop")


def gang_env(gang: dict[str, Any] | None) -> dict[str, str]:
    """A gang node's rank, the node count and the rendezvous, under the broker's names and
    torchrun's; a single node gets BROKER_NODE_RANK=0 and BROKER_NUM_NODES=1 only."""
    if not gang or int(gang.get("nodes") or 1) <= 1:
        return {"BROKER_NODE_RANK": "0", "BROKER_NUM_NODES": "1"}
    rank, nodes = str(int(gang["node_rank"])), str(int(gang["nodes"]))
    addr, port = str(gang["master_addr"]), str(int(gang["master_port"]))
    return {
        "BROKER_NODE_RANK": rank,
        "BROKER_NUM_NODES": nodes,
        "BROKER_MASTER_ADDR": addr,
        "BROKER_MASTER_PORT": port,
        "NODE_RANK": rank,
        "NNODES": nodes,
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }


def program_env(spec: dict[str, Any], dirs: dict[str, str], base: dict[str, str]) -> dict[str, str]:
    """The program's environment: the host's (without the agent's BROKER_* variables and its
    token), the job's ``env``, the broker's variables (a gang's too) and the SDK on
    PYTHONPATH."""
    env = {k: v for k, v in base.items() if not k.startswith("BROKER_")}
    env.update(spec.get("env") or {})
    env.update(gang_env(spec.get("gang")))
    env.update(
        BROKER_JOB_ID=str(spec["job_id"]),
        BROKER_ATTEMPT_ID=str(spec["attempt_id"]),
        BROKER_CHECKPOINT_DIR=dirs["checkpoint"],
        BROKER_WORKLOAD=json.dumps(spec.get("workload") or {}, sort_keys=True),
        BROKER_WORK_UNIT=str(spec.get("work_unit") or "steps"),
        BROKER_TOTAL_WORK=number(spec["total_work"]),
        BROKER_START_WORK=number(spec.get("start_work") or 0.0),
        BROKER_STOP_FILE=stop_file(dirs),
    )
    if base.get("BROKER_LOCAL_PACE_URL"):
        env["BROKER_LOCAL_PACE_URL"] = base["BROKER_LOCAL_PACE_URL"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (dirs["sdk"], env.get("PYTHONPATH")) if p)
    return env


def signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(OSError):  # the group is gone
        os.killpg(process.pid, signum)


def stop_program(process: subprocess.Popen, grace: float, container: str | None) -> None:
    """SIGTERM the program (its process group, or its container), SIGKILL after ``grace``."""
    if process.poll() is None:
        if container:
            subprocess.run(["docker", "kill", "--signal", "TERM", container], capture_output=True)
        else:
            signal_group(process, signal.SIGTERM)
        try:
            process.wait(max(grace, 0.1))
        except subprocess.TimeoutExpired:
            say(f"the program did not stop within {grace:.0f} s: killing it")
            if container:
                subprocess.run(["docker", "kill", container], capture_output=True)
    signal_group(process, signal.SIGKILL)  # and whatever it left behind in its group
    process.wait()


class Output:
    """The program's output: echoed to the agent's stdout, kept for the log uploads (until
    the broker's limit) and its last lines for the exit report."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = bytearray()
        self.tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self.closed = False  # past the log limit: nothing more is uploaded

    def add(self, line: bytes) -> None:
        with _print_lock:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        with self.lock:
            self.tail.append(line)
            if self.closed:
                return
            self.pending += line
            excess = len(self.pending) - LOG_BUFFER_BYTES
            if excess > 0:
                del self.pending[:excess]
                say(f"the broker takes no output: dropped {excess} bytes of it")

    def take(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of output not yet uploaded, whole lines when possible."""
        with self.lock:
            chunk = bytes(self.pending[:limit])
            if len(chunk) == limit and b"\n" in chunk:
                chunk = chunk[: chunk.rindex(b"\n") + 1]
            del self.pending[: len(chunk)]
            return chunk

    def give_back(self, chunk: bytes) -> None:
        with self.lock:
            self.pending[:0] = chunk

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.pending = bytearray()

    def tail_text(self) -> str:
        with self.lock:
            text = b"".join(self.tail).decode("utf-8", "replace")
        return text[-TAIL_CHARS:]


# -- broker time ----------------------------------------------------------------------------


class LeaseClock:
    """Broker seconds, to hold the spend lease against: from the local stack's clock schedule
    when the instance was given it (BROKER_CLOCK_SCHEDULE: its scale may drop during the run),
    else monotonic wall time at the run spec's scale. A deliberate copy of the reader in
    ``broker.clock``: the agent imports nothing of the broker."""

    def __init__(self, scale: float, schedule: str | None) -> None:
        self.scale, self.schedule = scale, schedule
        self.segments: list[tuple[float, float, float]] = []
        self.checked = time.monotonic()
        if schedule:
            with contextlib.suppress(OSError, ValueError):
                self.segments = self.read()

    def read(self) -> list[tuple[float, float, float]]:
        assert self.schedule is not None
        with open(self.schedule) as handle:
            lines = [line for line in handle.read().splitlines(True) if line.endswith("\n")]
        segments = [(float(w), float(b), float(s)) for w, b, s in (x.split() for x in lines)]
        if not segments:
            raise ValueError("no clock segment")
        return segments

    def now(self) -> float:
        if not self.segments:
            return time.monotonic() * self.scale
        if time.monotonic() - self.checked >= 0.5:
            self.checked = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                self.segments = self.read()
        wall = time.time()
        current = self.segments[0]
        for segment in self.segments[1:]:
            if segment[0] > wall:
                break
            current = segment
        return current[1] + (wall - current[0]) * current[2]


# -- the run ----------------------------------------------------------------------------------


class Run:
    """One attempt's program under supervision: its threads and how it ends."""

    def __init__(self, broker: Broker, spec: dict[str, Any], dirs: dict[str, str]) -> None:
        self.broker, self.spec, self.dirs = broker, spec, dirs
        gang = spec.get("gang") or {}
        self.rank, self.nodes = broker.node, int(gang.get("nodes") or 1)
        scale = float(spec.get("clock_scale") or 1.0)
        self.clock = LeaseClock(scale, os.environ.get("BROKER_CLOCK_SCHEDULE"))
        self.total = float(spec["total_work"])
        self.work = self.accepted = float(spec.get("start_work") or 0.0)
        self.lease_until = self.clock.now() + float(spec["lease_seconds_left"])  # broker s
        self.output = Output()
        self.unreported: tuple[str, float] | None = None  # a checkpoint's key and work
        self.report_lock, self.flush_lock = threading.Lock(), threading.Lock()
        self.uploads = threading.Condition()
        self.wanted: float | None = None  # the newest checkpoint's work, waiting for upload
        self.uploading = False
        self.notice: str | None = None
        self.noticed_at = 0.0
        self.metadata_failed = False
        self.halt: tuple[str, int] | None = None
        self.wake, self.done = threading.Event(), threading.Event()
        self.process: subprocess.Popen | None = None
        self.container: str | None = None
        self.reader: threading.Thread | None = None

    # threads

    def thread(self, target: Callable[..., Any], *args: Any) -> threading.Thread:
        worker = threading.Thread(target=target, args=args, daemon=True)
        worker.start()
        return worker

    def guarded(self, action: Callable[[], Any], what: str) -> None:
        try:
            action()
        except Refused as error:
            self.stop_for(str(error), 0 if error.status == 409 else 1)
        except Exception as error:
            say(f"{what} failed: {error}")

    def every(self, seconds: float, action: Callable[[], Any], what: str) -> None:
        while not self.done.is_set():
            self.guarded(action, what)
            self.done.wait(max(seconds, 0.05))

    def stop_for(self, reason: str, code: int) -> None:
        if self.halt is None:
            self.halt = (reason, code)
        self.wake.set()

    def read(self, pipe: Any) -> None:
        for line in iter(lambda: pipe.readline(LINE_BYTES), b""):
            self.output.add(line if line.endswith(b"\n") else line + b"\n")
            match = PROGRESS_LINE.match(line.decode("utf-8", "replace"))
            if match:
                self.progress_line(match.group(1), match.group(2))

    def progress_line(self, step: str, checkpoint: str | None) -> None:
        if self.rank:  # node 0 speaks for a gang's work and checkpoints
            return
        try:
            work = float(step)
        except ValueError:
            return
        if not math.isfinite(work) or work < 0:
            return
        self.work = min(work, self.total)
        if checkpoint is not None:
            with self.uploads:
                self.wanted = self.work
                self.uploads.notify_all()

    # reports

    def report(self, checkpoint: tuple[str, float] | None = None) -> None:
        """POST /progress: a new checkpoint's key (until the broker takes it) or the work."""
        with self.report_lock:
            self.unreported = checkpoint or self.unreported
            key, work = self.unreported or (None, self.work)
            body = {"work_done": work, "checkpoint_key": key}
            retry = max(10.0, float(self.spec["report_seconds"]))
            try:
                ack = self.broker.attempt("POST", "progress", body, retry_for=retry)
            except HttpError as error:
                if error.status != 422:
                    raise
                # Refused (more work than the broker finds credible yet, say): the heartbeat
                # still has to land, with work it took before; a checkpoint is tried again.
                say(f"progress {body} refused: {error}")
                fallback = {"work_done": self.accepted, "checkpoint_key": None}
                ack = self.broker.attempt("POST", "progress", fallback, retry_for=retry)
            else:
                self.accepted = max(self.accepted, work)
                if self.unreported == (key, work):
                    self.unreported = None
        self.lease_until = self.clock.now() + float(ack["lease_seconds_left"])
        if ack.get("should_stop"):
            self.stop_for(f"the broker says stop (job {ack.get('job_status')})", 0)

    def flush_logs(self) -> None:
        """POST /logs until no output is pending, in chunks of at most 256 KiB."""
        with self.flush_lock:
            while True:
                chunk = self.output.take(LOG_CHUNK_BYTES)
                if not chunk:
                    return
                try:
                    ack = self.broker.attempt("POST", "logs", text=chunk, retry_for=20.0)
                except Exception:
                    self.output.give_back(chunk)
                    raise
                if ack.get("truncated"):
                    self.output.close()
                    limit = self.spec.get("log_limit_bytes")
                    say(f"the log passed its limit ({limit} bytes): no more output is uploaded")
                    return

    def upload_loop(self) -> None:
        """Uploads checkpoints one at a time: the newest marked one, once the last is sent."""
        while True:
            with self.uploads:
                while self.wanted is None:
                    self.uploads.wait()
                work, self.wanted, self.uploading = self.wanted, None, True
            try:
                self.guarded(functools.partial(self.upload_checkpoint, work), "checkpoint upload")
            finally:
                with self.uploads:
                    self.uploading = False
                    self.uploads.notify_all()

    def upload_checkpoint(self, work: float) -> None:
        fd, archive = tempfile.mkstemp(
            prefix="checkpoint-", suffix=".tar.gz", dir=self.dirs["root"]
        )
        os.close(fd)
        try:
            pack(self.dirs["checkpoint"], archive)
            place = self.broker.attempt("POST", "checkpoints", {"work_done": work})
            headers = {"Content-Type": "application/gzip"}
            request(
                "PUT", place["url"], headers=headers, upload=archive, timeout=120, retry_for=300
            )
            self.report(checkpoint=(place["key"], work))
            say(f"checkpoint at {number(work)} uploaded: {place['key']}")
        finally:
            os.remove(archive)

    def uploads_done(self, timeout: float) -> bool:
        def idle() -> bool:
            return self.wanted is None and not self.uploading

        with self.uploads:
            return self.uploads.wait_for(idle, max(timeout, 0.0))

    # preemption notices

    def noticed(self, reason: str) -> None:
        # The broker takes at most 200 printable characters.
        self.notice = re.sub(r"[\x00-\x1f\x7f]", " ", reason)[:200]
        self.noticed_at = time.monotonic()
        say(f"preemption notice: {self.notice}")
        self.wake.set()

    def metadata_trouble(self, error: Exception) -> None:
        if not self.metadata_failed:  # once: off a cloud there is no metadata server at all
            self.metadata_failed = True
            say(f"the metadata server does not answer ({error}): no preemption notices")

    def watch_aws(self, meta: str, interval: float) -> None:
        token, token_until = "", 0.0
        while not self.done.is_set():
            try:
                if time.monotonic() > token_until:
                    ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
                    url = meta + "/latest/api/token"
                    token = request("PUT", url, b"", ttl, timeout=5, retry_for=0)[0].decode()
                    token_until = time.monotonic() + 21000
                url = meta + "/latest/meta-data/spot/instance-action"
                headers = {"X-aws-ec2-metadata-token": token}
                body = request("GET", url, None, headers, timeout=5, retry_for=0)[0]
                return self.noticed("spot instance-action: " + aws_action(body))
            except HttpError as error:
                if error.status == 401:
                    token_until = 0.0
                elif error.status != 404:  # 404: no notice
                    self.metadata_trouble(error)
            except (OSError, http.client.HTTPException) as error:
                self.metadata_trouble(error)
            self.done.wait(interval)

    def watch_gcp(self, meta: str, interval: float) -> None:
        etag, wait = "", int(max(1.0, min(10.0, interval * 2)))
        while not self.done.is_set():
            query = {"wait_for_change": "true", "timeout_sec": str(wait)}
            if etag:
                query["last_etag"] = etag
            url = meta + "/computeMetadata/v1/instance/preempted?" + urllib.parse.urlencode(query)
            try:
                body, headers = request(
                    "GET", url, None, {"Metadata-Flavor": "Google"}, timeout=wait + 10, retry_for=0
                )
                if body.strip().upper() == b"TRUE":
                    return self.noticed("gce instance preempted")
                etag = headers.get("ETag") or etag
                self.done.wait(0.1)
            except (HttpError, OSError, http.client.HTTPException) as error:
                self.metadata_trouble(error)
                self.done.wait(interval)

    # the run itself

    def start(self, base_env: dict[str, str], local: bool) -> None:
        argv = command_argv(self.spec, self.dirs, local)
        if os.path.exists(stop_file(self.dirs)):
            os.remove(stop_file(self.dirs))
        if self.spec.get("image") and local:
            image = self.spec["image"]
            say(f"the local cloud runs the command on the host, not in {image}")
        self.container = container_name(self.spec) if argv[0] == "docker" else None
        self.process = subprocess.Popen(
            argv,
            cwd=self.dirs["work"],
            env=program_env(self.spec, self.dirs, base_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # one stream: the log and the tail keep the program's order
            start_new_session=True,  # its own process group: signals reach all of it
        )
        self.reader = self.thread(self.read, self.process.stdout)

    def supervise(self, base_env: dict[str, str], local: bool, meta: str) -> int:
        """Run the program to its end; the agent's exit code."""
        try:
            self.start(base_env, local)
        except OSError as error:
            return report_exit(self.broker, 127, f"agent: could not start the program: {error}")
        signal.signal(signal.SIGTERM, lambda signum, frame: self.stop_for("agent got SIGTERM", 1))
        spec = self.spec
        self.thread(self.every, float(spec["report_seconds"]), self.report, "progress report")
        self.thread(self.every, float(spec["log_flush_seconds"]), self.flush_logs, "log upload")
        self.thread(self.upload_loop)
        interval = max(0.25, min(5.0, float(spec["notice_seconds"]) / 4))
        watch = self.watch_gcp if spec.get("provider") == "gcp" else self.watch_aws
        self.thread(watch, meta, interval)
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                return self.exited(self.process.returncode)
            if self.notice is not None:
                return self.preempted()
            if self.halt is not None:
                return self.stop(*self.halt)
            if self.clock.now() > self.lease_until:
                return self.lapsed()
            self.wake.wait(0.2)
            self.wake.clear()

    def wind_down(self, grace: float) -> None:
        """Stop the program (unless it exited) and read the rest of its output."""
        assert self.process is not None
        open(stop_file(self.dirs), "w").close()
        stop_program(self.process, grace, self.container)
        if self.reader is not None:
            self.reader.join(5.0)

    def exited(self, code: int) -> int:
        self.wind_down(0.0)
        say(f"the program exited with code {code}")
        self.uploads_done(UPLOAD_WAIT_SECONDS)
        if code != 0 and self.nodes > 1 and self.cause_reported_elsewhere():
            self.done.set()
            assert self.halt is not None
            say(f"not reporting the exit: {self.halt[0]}")
            return self.halt[1]
        self.done.set()
        self.guarded(self.flush_logs, "log upload")
        self.guarded(self.report, "progress report")
        return report_exit(self.broker, code, self.output.tail_text())

    def cause_reported_elsewhere(self) -> bool:
        """A gang node's program failed: keep heartbeating for the grace (the notice window
        plus GANG_EXIT_GRACE_SECONDS, half as much again on node 0) and say whether the
        attempt ended meanwhile (another node's notice or exit, the broker finding a node
        gone): then this exit is not the cause."""
        grace = float(self.spec["notice_seconds"]) + GANG_EXIT_GRACE_SECONDS
        if self.rank == 0:  # it hears of every node's failure: let the failed node speak first
            grace += GANG_EXIT_GRACE_SECONDS / 2
        say(f"waiting up to {grace:.0f} s before reporting the exit: another node may explain it")
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.guarded(self.report, "progress report")
            if self.halt is not None:
                return True
            time.sleep(min(RENDEZVOUS_POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))
        return False

    def preempted(self) -> int:
        if self.rank:  # nothing to save here: let the gang stop before this node's peers fail
            self.guarded(self.flush_logs, "log upload")
            self.report_notice()
            self.wind_down(NOTICE_FLOOR_SECONDS)
            self.done.set()
            return 0
        window, elapsed = float(self.spec["notice_seconds"]), time.monotonic() - self.noticed_at
        self.wind_down(max(window * 0.75 - elapsed, NOTICE_FLOOR_SECONDS))
        elapsed = time.monotonic() - self.noticed_at
        self.uploads_done(max(window - elapsed, NOTICE_FLOOR_SECONDS))
        self.done.set()
        self.guarded(self.flush_logs, "log upload")
        self.report_notice()
        return 0

    def report_notice(self) -> None:
        try:
            answer = self.broker.attempt("POST", "preempted", {"reason": self.notice})
            say(f"reported the preemption: job {answer.get('job_status')}")
        except Refused as error:
            say(str(error))

    def lapsed(self) -> int:
        """The lease ended unrenewed: stop the program and, while it winds down, say so to
        the broker (if it answers), so that the attempt ends now rather than when the
        broker's sweep finds the lease lapsed."""
        say("no progress ack renewed the lease in time: stopping")
        report = self.thread(self.report_lapse)
        self.wind_down(STOP_GRACE_SECONDS)
        self.done.set()
        report.join(LAPSE_REPORT_SECONDS)
        return 1

    def report_lapse(self) -> None:
        try:
            answer = self.broker.attempt(
                "POST", "lapsed", {}, timeout=LAPSE_REPORT_SECONDS, retry_for=LAPSE_REPORT_SECONDS
            )
            say(f"reported the lapsed lease: job {answer.get('job_status')}")
        except Refused as error:
            say(str(error))
        except (HttpError, OSError, http.client.HTTPException) as error:
            say(f"could not report the lapsed lease: {error}")

    def stop(self, reason: str, code: int) -> int:
        say(reason)
        self.wind_down(STOP_GRACE_SECONDS)
        self.done.set()
        return code


def aws_action(body: bytes) -> str:
    try:
        notice = json.loads(body)
        return f"{notice.get('action')} at {notice.get('time')}"
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")[:100]


def report_exit(broker: Broker, code: int, tail: str) -> int:
    """POST /exit with the program's code (minus the signal that killed it) and tail."""
    body = {"exit_code": max(-255, min(255, code)), "tail": tail[-TAIL_CHARS:]}
    try:
        answer = broker.attempt("POST", "exit", body, retry_for=300.0)
    except Refused as error:
        say(str(error))
        return 0
    except (HttpError, OSError) as error:
        say(f"could not report the exit: {error}")
        return 1
    say(f"reported exit code {code}: job {answer.get('job_status')}")
    return 0


def prepare(broker: Broker, spec: dict[str, Any], dirs: dict[str, str]) -> str | None:
    """Fetch the SDK and restore the checkpoint (errors raise), then unpack the workdir: a
    message when that fails (the job's own fault: a bad URL, an archive that is not one)."""
    sdk = broker.call("GET", "/v1/agent/sdk?attempt=" + urllib.parse.quote(broker.attempt_id))
    with open(os.path.join(dirs["sdk"], "broker_sdk.py"), "wb") as out:
        out.write(sdk)
    if spec.get("restore"):
        fetch_archive(spec["restore"], dirs["checkpoint"], dirs["root"])
        say(f"restored checkpoint {spec['restore'].get('key')}")
    if spec.get("workdir"):
        source = spec["workdir"]
        try:
            fetch_archive(source, dirs["work"], dirs["root"])
        except Exception as error:
            where = shown(source.get("url") or source.get("s3") or "?")
            return f"agent: could not fetch the workdir {where}: {error}"
    return None


def make_dirs(root: str) -> dict[str, str]:
    root = os.path.realpath(root)
    dirs = {name: os.path.join(root, name) for name in ("checkpoint", "work", "sdk")}
    for folder in dirs.values():
        os.makedirs(folder, exist_ok=True)
    dirs["root"] = root
    return dirs


def own_address(api_url: str, local: bool) -> str:
    """The address the gang's other nodes reach this one at: the source address of this
    host's route to the API (a UDP socket's connect sends nothing); 127.0.0.1 on a local
    cloud, where every node is a process of the same host."""
    if local:
        return "127.0.0.1"
    parts = urllib.parse.urlsplit(api_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        family, kind, _, _, where = socket.getaddrinfo(
            parts.hostname or "", port, type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, kind) as probe:
            probe.connect(where)
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def free_port() -> int:
    """A TCP port no one listens on now (the program binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def join_gang(broker: Broker, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The run spec with the gang's rendezvous: node 0 picks and reports it; node k >= 1 asks
    for it every RENDEZVOUS_POLL_SECONDS (NoRendezvous after RENDEZVOUS_WAIT_SECONDS). A single
    node's spec as it is."""
    gang = spec.get("gang")
    if not gang or int(gang.get("nodes") or 1) <= 1:
        return spec
    if broker.node == 0:
        addr = own_address(broker.base, bool(env.get("BROKER_LOCAL_INSTANCE")))
        body = {"node": 0, "addr": addr, "port": free_port()}
        spec = dict(spec, gang=broker.attempt("POST", "rendezvous", body, retry_for=120.0))
        say(f"gang of {gang['nodes']}: the rendezvous is {addr}:{body['port']}")
        return spec
    wait = float(env.get("BROKER_RENDEZVOUS_WAIT_SECONDS") or RENDEZVOUS_WAIT_SECONDS)
    deadline = time.monotonic() + wait
    while not (spec.get("gang") or {}).get("master_addr"):
        if time.monotonic() > deadline:
            raise NoRendezvous(f"node 0 reported no rendezvous within {wait:.0f} s: giving up")
        time.sleep(RENDEZVOUS_POLL_SECONDS)
        spec = broker.attempt("GET", "run", retry_for=60.0)
    gang = spec["gang"]
    say(
        f"node {broker.node} of {gang['nodes']}: the rendezvous is {gang['master_addr']}:"
        f"{gang['master_port']}"
    )
    return spec


def main() -> int:
    env = dict(os.environ)
    missing = [
        n for n in ("BROKER_API_URL", "BROKER_ATTEMPT_ID", "BROKER_AGENT_TOKEN") if not env.get(n)
    ]
    if missing:
        say(f"{', '.join(missing)} not set")
        return 2
    try:
        rank = int(env.get("BROKER_NODE_RANK") or 0)
        if rank < 0:
            raise ValueError(rank)
    except ValueError:
        say(f"BROKER_NODE_RANK is not a node rank: {env.get('BROKER_NODE_RANK')!r}")
        return 2
    broker = Broker(
        env["BROKER_API_URL"], env["BROKER_ATTEMPT_ID"], env["BROKER_AGENT_TOKEN"], rank
    )
    dirs = make_dirs(env.get("BROKER_INSTANCE_DIR") or "/opt/broker")
    try:
        spec = broker.attempt("GET", "run", retry_for=600.0)
        problem = prepare(broker, spec, dirs)
        if problem is None:
            spec = join_gang(broker, spec, env)
    except Refused as error:
        say(str(error))
        return 0 if error.status == 409 else 1
    except NoRendezvous as error:
        problem = f"agent: node {rank}: {error}"
    except Exception as error:  # the broker or the store unreachable, a broken checkpoint
        say(f"could not prepare the run: {error}")
        return 1
    if problem is not None:
        say(problem)
        return report_exit(broker, 1, problem)
    provider = spec.get("provider") or env.get("BROKER_PROVIDER") or "aws"
    meta = (env.get("BROKER_METADATA_URL") or METADATA.get(provider, METADATA["aws"])).rstrip("/")
    node = f" node {rank}" if spec.get("gang") else ""
    say(f"attempt {spec['attempt_id']}{node}: running {spec['command'][:200]!r}")
    run = Run(broker, spec, dirs)
    return run.supervise(env, bool(env.get("BROKER_LOCAL_INSTANCE")), meta)


if __name__ == "__main__":
    sys.exit(main())
