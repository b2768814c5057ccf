"""A real, broker-ready training program: a small MLP classifier on data made from ``--seed``.

    python train.py --seed 1 --steps 2000

Only numpy and the standard library. What makes it broker-ready (see docs/workloads.md):

- it prints ``broker: step=<work>`` lines as it trains, and ``broker: step=<work>
  checkpoint=<file>`` once a checkpoint is completely written (atomically: a temp file, then a
  rename) into ``$BROKER_CHECKPOINT_DIR``; step ``i`` of ``--steps`` is ``i * total / steps``
  work units of the job's workload (``$BROKER_TOTAL_WORK``);
- it resumes from the checkpoint in that folder (the agent restores the job's latest there);
- on SIGTERM (a spot notice, a cancel) it finishes the step, checkpoints and exits: 0 when all
  the work is done, else 143;
- on a local cloud (``$BROKER_LOCAL_PACE_URL``) it trains no faster than the simulated GPU would.

Minibatches depend only on (seed, step), so a run resumed from a checkpoint ends with exactly
the parameters of an uninterrupted one. ``--fail-at-step K --exit-code C`` exits with C at
step K (to try out restarts; ``--fail-node R``: only on node R of a gang).

Multi-node mode (``$BROKER_NUM_NODES`` > 1, a gang): every node trains the same steps and they
move in lockstep through a barrier over TCP. Node 0 listens on ``$BROKER_MASTER_PORT``, the
others connect to ``$BROKER_MASTER_ADDR``; each says which step its checkpoint restored (they
must agree), then after every step each sends ``done <step>`` and waits for node 0's ``go`` (or
``stop``: a node got SIGTERM, and the whole gang stops at that step). Only node 0 writes
checkpoints and prints the ``broker:`` lines. A node whose peer vanishes (the connection
closes, or is silent for ``--gang-timeout`` seconds) exits 1 saying so, so one lost node stops
the gang.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import BinaryIO

import numpy as np

SAMPLES, FEATURES, HIDDEN = 4096, 32, 64
PARAMS = ("w1", "b1", "w2", "b2")
PRINT_SECONDS = 0.2  # at most this often a progress line between checkpoints
PACE_RECHECK_SECONDS = 2.0  # how often a paced run asks its local cloud for the pace again
PEER_LOST = 1  # a gang node's exit code when a peer vanished


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env_steps = None
    if os.environ.get("BROKER_WORK_UNIT") == "steps" and os.environ.get("BROKER_TOTAL_WORK"):
        env_steps = max(1, round(float(os.environ["BROKER_TOTAL_WORK"])))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=env_steps or 1000)
    parser.add_argument("--checkpoint-every", type=int, default=None, help="default: steps/20")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--fail-at-step", type=int, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--fail-node", type=int, default=None, help="default: every node")
    parser.add_argument(
        "--gang-timeout", type=float, default=300.0, help="seconds a gang waits for a peer"
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    args.checkpoint_every = max(1, args.checkpoint_every or args.steps // 20)
    return args


def dataset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points whose label a hidden nonlinear rule decides (with some label noise)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES))
    w = rng.normal(size=FEATURES)
    logits = 4 * np.sin(1.5 * x @ w / np.sqrt(FEATURES)) + 2 * x[:, 0] * x[:, 1]
    y = (rng.random(SAMPLES) < 1 / (1 + np.exp(-logits))).astype(np.float64)
    return x, y


def init_params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    return {
        "w1": rng.normal(scale=FEATURES**-0.5, size=(FEATURES, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(scale=HIDDEN**-0.5, size=HIDDEN),
        "b2": np.zeros(()),
    }


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The hidden layer's activations and the predicted probabilities of label 1."""
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    return hidden, 1 / (1 + np.exp(-(hidden @ params["w2"] + params["b2"])))


def evaluate(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Log loss and accuracy on the whole data set."""
    _, p = forward(params, x)
    loss = -np.mean(y * np.log(p + 1e-12) + (1 - y) * np.log(1 - p + 1e-12))
    return float(loss), float(np.mean((p > 0.5) == (y > 0.5)))


def train_step(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, args: argparse.Namespace, step: int
) -> None:
    """One SGD step on the minibatch of ``step``: updates ``params``."""
    rows = np.random.default_rng([args.seed, 2, step]).integers(0, len(x), args.batch_size)
    xb, yb = x[rows], y[rows]
    hidden, p = forward(params, xb)
    d_out = (p - yb) / len(yb)
    d_hidden = np.outer(d_out, params["w2"]) * (1 - hidden**2)
    grads = {
        "w2": hidden.T @ d_out,
        "b2": d_out.sum(),
        "w1": xb.T @ d_hidden,
        "b1": d_hidden.sum(axis=0),
    }
    for name in PARAMS:
        params[name] -= args.lr * grads[name]


def _atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        write(out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def save_checkpoint(folder: str, params: dict[str, np.ndarray], step: int, meta: dict) -> str:
    """Write the parameters and step (model.npz), then state.json; each atomically."""
    path = os.path.join(folder, "model.npz")
    arrays = dict(params, step=np.array(step))
    _atomic_write(path, lambda out: np.savez(out, **arrays))
    state = json.dumps(dict(meta, step=step), sort_keys=True).encode()
    _atomic_write(os.path.join(folder, "state.json"), lambda out: out.write(state))
    return path


def load_checkpoint(folder: str, seed: int, steps: int) -> tuple[dict[str, np.ndarray], int] | None:
    """The parameters and step in ``folder``'s checkpoint, or None when there is none."""
    path = os.path.join(folder, "model.npz")
    if not os.path.exists(path):
        return None
    with open(os.path.join(folder, "state.json")) as file:
        state = json.load(file)
    if (state.get("seed"), state.get("steps")) != (seed, steps):
        sys.exit(f"train: the checkpoint in {folder} is of another run: {state}")
    with np.load(path) as data:
        return {name: data[name].copy() for name in PARAMS}, int(data["step"])


class PeerLost(Exception):
    """A node of the gang vanished: its connection closed or stayed silent too long."""


class Gang:
    """The gang's step barrier over TCP (node 0 the hub): ``join`` once, then ``sync`` after
    every step. One newline-terminated ASCII message at a time on each connection."""

    def __init__(self, rank: int, nodes: int, addr: str, port: int, timeout: float) -> None:
        self.rank, self.nodes, self.addr, self.port = rank, nodes, addr, port
        self.timeout = timeout
        self.peers: dict[int, tuple[socket.socket, BinaryIO]] = {}  # node 0: rank -> conn

    @classmethod
    def from_env(cls, timeout: float) -> Gang | None:
        """The gang the broker's agent described, or None for a single node."""
        nodes = int(os.environ.get("BROKER_NUM_NODES") or 1)
        if nodes <= 1:
            return None
        rank = int(os.environ["BROKER_NODE_RANK"])
        addr, port = os.environ["BROKER_MASTER_ADDR"], int(os.environ["BROKER_MASTER_PORT"])
        return cls(rank, nodes, addr, port, timeout)

    def join(self, step: int) -> None:
        """Connect the gang and check that every node restored the same ``step``."""
        if self.rank == 0:
            self._accept(step)
        else:
            self._connect(step)

    def _accept(self, step: int) -> None:
        with socket.create_server(("", self.port)) as server:
            server.settimeout(self.timeout)
            while len(self.peers) < self.nodes - 1:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    raise PeerLost(
                        f"only {len(self.peers) + 1} of {self.nodes} nodes came"
                    ) from None
                conn.settimeout(self.timeout)
                reader = conn.makefile("rb")
                _, rank, their_step = self._read(reader, "a joining node").split()
                self.peers[int(rank)] = (conn, reader)
                if int(their_step) != step:
                    self._tell_all(f"stop node {rank} restored step {their_step}, node 0 {step}")
                    raise PeerLost(f"node {rank} restored step {their_step}, node 0 step {step}")
        self._tell_all("start")

    def _connect(self, step: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn = socket.create_connection((self.addr, self.port), timeout=self.timeout)
                break
            except OSError as error:  # node 0's program may not listen yet
                if time.monotonic() > deadline:
                    raise PeerLost(f"node 0 at {self.addr}:{self.port}: {error}") from None
                time.sleep(0.2)
        reader = conn.makefile("rb")
        self.peers[0] = (conn, reader)
        conn.sendall(f"hello {self.rank} {step}\n".encode())
        answer = self._read(reader, "node 0")
        if answer != "start":
            raise PeerLost(f"node 0 said {answer!r}")

    def sync(self, step: int, stopping: bool) -> bool:
        """The barrier after ``step``: True when the gang stops there (a node is stopping)."""
        if self.rank != 0:
            conn, reader = self.peers[0]
            self._send(conn, f"done {step} {'stop' if stopping else 'go'}", "node 0")
            return self._read(reader, "node 0") != "go"
        for rank, (_, reader) in sorted(self.peers.items()):
            done, their_step, wish = self._read(reader, f"node {rank}").split()
            if int(their_step) != step:
                raise PeerLost(f"node {rank} is at step {their_step}, node 0 at {step}")
            stopping = stopping or wish == "stop"
        self._tell_all("stop" if stopping else "go")
        return stopping

    def _tell_all(self, message: str) -> None:
        for rank, (conn, _) in sorted(self.peers.items()):
            self._send(conn, message, f"node {rank}")

    def _send(self, conn: socket.socket, message: str, who: str) -> None:
        try:
            conn.sendall(message.encode() + b"\n")
        except OSError as error:
            raise PeerLost(f"{who} vanished ({error})") from None

    def _read(self, reader: BinaryIO, who: str) -> str:
        try:
            line = reader.readline()
        except OSError as error:  # a timeout, a reset
            raise PeerLost(f"{who} vanished ({error or 'silent too long'})") from None
        if not line.endswith(b"\n"):
            raise PeerLost(f"{who} vanished (connection closed)")
        return line.decode().strip()


def pace_seconds_per_step(work_per_step: float) -> float:
    """Wall seconds a step may take at least: on a local cloud, the simulated GPU's pace."""
    url = os.environ.get("BROKER_LOCAL_PACE_URL")
    if not url:
        return 0.0
    query = urllib.parse.urlencode({"workload": os.environ.get("BROKER_WORKLOAD", "{}")})
    try:
        with urllib.request.urlopen(f"{url}?{query}", timeout=30) as answer:
            seconds = float(json.load(answer)["seconds_per_work_unit"])
    except (OSError, ValueError, KeyError) as error:
        print(f"train: no pace from {url} ({error}): full speed", file=sys.stderr, flush=True)
        return 0.0
    return seconds * work_per_step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gang = Gang.from_env(args.gang_timeout)
    try:
        return train(args, gang)
    except PeerLost as error:
        print(f"train: node {gang.rank if gang else 0}: {error}: stopping", file=sys.stderr)
        return PEER_LOST


def train(args: argparse.Namespace, gang: Gang | None) -> int:
    """The training loop; with a ``gang``, in lockstep with its other nodes (PeerLost when
    one vanishes)."""
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    rank = gang.rank if gang else 0
    lead = rank == 0  # the node that checkpoints and reports: node 0, or the only one
    folder = os.environ.get("BROKER_CHECKPOINT_DIR") or tempfile.mkdtemp(prefix="train-ckpt-")
    os.makedirs(folder, exist_ok=True)
    total = float(os.environ.get("BROKER_TOTAL_WORK") or args.steps)
    per_step = total / args.steps

    def work(step: int) -> str:
        return format(step * per_step, ".10g")

    x, y = dataset(args.seed)
    params, step = init_params(args.seed), 0
    restored = load_checkpoint(folder, args.seed, args.steps)
    start_work = float(os.environ.get("BROKER_START_WORK") or 0.0)
    if restored is not None:
        params, step = restored
        print(f"train: resuming from step {step} (checkpoint in {folder})", flush=True)
    elif start_work > 0:
        print(f"train: no checkpoint in {folder}: starting over, not at {start_work}", flush=True)
    meta = {"seed": args.seed, "steps": args.steps}
    if gang is not None:
        gang.join(step)
        print(f"train: node {rank} of {gang.nodes} joined the gang at step {step}", flush=True)
    pace = pace_seconds_per_step(per_step)
    began, first, last_line = time.monotonic(), step, 0.0
    paced_at = began
    stopping = False  # a gang stops together, at a barrier
    while step < args.steps and not stopping:
        if gang is None and stop:
            break
        if step == args.fail_at_step and args.fail_node in (None, rank):
            print(f"boom at step {step}", file=sys.stderr, flush=True)
            return args.exit_code
        if pace and time.monotonic() - paced_at >= PACE_RECHECK_SECONDS:
            # A local cloud's clock may slow down (a busy laptop): keep the simulated pace.
            paced_at = time.monotonic()
            now_pace = pace_seconds_per_step(per_step)
            if now_pace and abs(now_pace - pace) > 1e-6 * pace:
                pace, began, first = now_pace, paced_at, step
        if pace:  # do the steps the wall time allows, then sleep (briefly: SIGTERM may come)
            ahead = (step + 1 - first) * pace - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(min(ahead, 0.05))
                continue
        train_step(params, x, y, args, step)
        step += 1
        if gang is not None:
            stopping = gang.sync(step, bool(stop))
        if step % args.checkpoint_every == 0 or step == args.steps:
            loss, accuracy = evaluate(params, x, y)
            print(
                f"train: step {step}/{args.steps} loss {loss:.4f} accuracy {accuracy:.3f}",
                flush=True,
            )
            if lead:
                path = save_checkpoint(folder, params, step, meta)
                print(f"broker: step={work(step)} checkpoint={path}", flush=True)
            last_line = time.monotonic()
        elif lead and time.monotonic() - last_line >= PRINT_SECONDS:
            print(f"broker: step={work(step)}", flush=True)
            last_line = time.monotonic()
    if step < args.steps:  # stopped by SIGTERM (this node's, or a gang node's): keep the work
        if not lead:
            print(f"train: node {rank}: the gang stopped at step {step}/{args.steps}", flush=True)
            return 143
        path = save_checkpoint(folder, params, step, meta)
        print(f"train: SIGTERM at step {step}/{args.steps}: checkpoint saved", flush=True)
        print(f"broker: step={work(step)} checkpoint={path}", flush=True)
        return 143
    loss, accuracy = evaluate(params, x, y)
    print(f"train: done, {args.steps} steps, loss {loss:.4f} accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
