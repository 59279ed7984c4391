"""Evaluates the checkpoint the train stage left: y = w x + b against y = 3x + 2 on points the
training never saw. A workflow stage gets each upstream stage's newest complete checkpoint as
TAU_UPSTREAM_<STAGE>_CHECKPOINT and its output directory as TAU_UPSTREAM_<STAGE>_OUTPUT_DIR, both
read-only when the server runs as root."""
import json
import os
import sys


def main():
    checkpoint = os.environ.get("TAU_UPSTREAM_TRAIN_CHECKPOINT")
    if not checkpoint:
        print("no checkpoint from the train stage", file=sys.stderr)
        return 1
    with open(checkpoint) as f:
        state = json.load(f)
    points = [x / 7 for x in range(-30, 31, 3)]
    loss = sum((state["w"] * x + state["b"] - (3 * x + 2)) ** 2 for x in points) / len(points)
    with open(os.environ["TAU_METRICS_FILE"], "a") as f:
        f.write(json.dumps({"step": state["step"], "name": "loss", "value": loss,
                            "split": "eval"}) + "\n")
    with open(os.path.join(os.environ["TAU_OUTPUT_DIR"], "eval.json"), "w") as f:
        json.dump({"checkpoint": checkpoint, "step": state["step"], "loss": loss}, f)
    print(f"evaluated {os.path.basename(checkpoint)} (step {state['step']}): loss {loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
