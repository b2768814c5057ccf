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
step K (to try out restarts).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
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
    pace = pace_seconds_per_step(per_step)
    began, first, last_line = time.monotonic(), step, 0.0
    paced_at = began
    while step < args.steps and not stop:
        if step == args.fail_at_step:
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
        if step % args.checkpoint_every == 0 or step == args.steps:
            path = save_checkpoint(folder, params, step, meta)
            loss, accuracy = evaluate(params, x, y)
            print(f"train: step {step}/{args.steps} loss {loss:.4f} accuracy {accuracy:.3f}")
            print(f"broker: step={work(step)} checkpoint={path}", flush=True)
            last_line = time.monotonic()
        elif time.monotonic() - last_line >= PRINT_SECONDS:
            print(f"broker: step={work(step)}", flush=True)
            last_line = time.monotonic()
    if step < args.steps:  # stopped by SIGTERM: keep what was done
        path = save_checkpoint(folder, params, step, meta)
        print(f"train: SIGTERM at step {step}/{args.steps}: checkpoint saved", flush=True)
        print(f"broker: step={work(step)} checkpoint={path}", flush=True)
        return 143
    loss, accuracy = evaluate(params, x, y)
    print(f"train: done, {args.steps} steps, loss {loss:.4f} accuracy {accuracy:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
