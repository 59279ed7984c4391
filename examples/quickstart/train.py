"""A tiny training loop: fits y = 3x + 2 by gradient descent, in pure Python.

It shows what tau gives a job:
  TAU_METRICS_FILE    append one JSON object per metric point (step, name, value)
  TAU_CHECKPOINT_DIR  stable across attempts; write checkpoints here
  TAU_RESUME_FROM     set on a retried attempt to the newest complete checkpoint
  TAU_OUTPUT_DIR      where results go

Checkpoint protocol: write the checkpoint to a temporary name in TAU_CHECKPOINT_DIR, flush and fsync it,
then rename it to its final name `ckpt-<step>.json`. A rename is atomic, so a checkpoint that exists under
its final name is complete; a crash mid-write leaves only a `.tmp` file, which is never resumed from.
"""
import argparse
import json
import os
import random
import sys
import time


def save_checkpoint(directory, step, state):
    final = os.path.join(directory, f"ckpt-{step:06d}.json")
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    return final


def latest_checkpoint(directory):
    names = sorted(n for n in os.listdir(directory) if n.startswith("ckpt-") and n.endswith(".json"))
    return os.path.join(directory, names[-1]) if names else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sleep", type=float, default=0.01)
    args = parser.parse_args()

    lr = float(os.environ.get("LEARNING_RATE", "0.05"))
    ckpt_dir = os.environ.get("TAU_CHECKPOINT_DIR", "checkpoints")
    out_dir = os.environ.get("TAU_OUTPUT_DIR", "output")
    metrics_path = os.environ.get("TAU_METRICS_FILE", os.path.join(out_dir, "metrics.jsonl"))
    os.makedirs(ckpt_dir, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)

    w, b, start = 0.0, 0.0, 0
    resume = os.environ.get("TAU_RESUME_FROM") or latest_checkpoint(ckpt_dir)
    if resume:
        with open(resume) as f:
            state = json.load(f)
        w, b, start = state["w"], state["b"], state["step"]
        print(f"resumed from {resume} at step {start}")

    print(f"run {os.environ.get('TAU_RUN_NAME', '?')} attempt {os.environ.get('TAU_ATTEMPT', '?')}: "
          f"training for {args.steps} steps, lr={lr}")
    rng = random.Random(0)
    data = [(x, 3 * x + 2 + rng.uniform(-0.1, 0.1)) for x in [i / 10 for i in range(-20, 21)]]
    loss = float("nan")
    with open(metrics_path, "a") as metrics:
        for step in range(start + 1, args.steps + 1):
            gw = gb = loss = 0.0
            for x, y in data:
                err = w * x + b - y
                loss += err * err / len(data)
                gw += 2 * err * x / len(data)
                gb += 2 * err / len(data)
            w -= lr * gw
            b -= lr * gb
            metrics.write(json.dumps({"step": step, "name": "loss", "value": loss, "split": "train"}) + "\n")
            metrics.flush()
            if step % 5 == 0 or step == args.steps:
                print(f"step {step:4d}  loss {loss:.5f}  w {w:.3f}  b {b:.3f}", flush=True)
                save_checkpoint(ckpt_dir, step, {"step": step, "w": w, "b": b})
            time.sleep(args.sleep)

    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump({"w": w, "b": b, "final_loss": loss}, f)
    print(f"done: w={w:.3f} b={b:.3f} loss={loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
