"""A small GPU training step with PyTorch: a linear model on random data, on the GPU tau hands out.

tau sets CUDA_VISIBLE_DEVICES to the GPU it placed the run on, so `cuda:0` is that GPU. The example uses
torch when it is installed (locally: `runtime.pip: [torch]`, or a python3 that has torch).
"""
import json
import os
import sys
import time


def main():
    try:
        import torch
    except ImportError:
        print("this example needs PyTorch: add `pip: [torch]` under runtime, or use a python3 with torch",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("CUDA is not available to this process (CUDA_VISIBLE_DEVICES="
              f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})", file=sys.stderr)
        return 3
    dev = torch.device("cuda:0")
    print(f"GPU: {torch.cuda.get_device_name(dev)}  CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    torch.manual_seed(0)
    x = torch.randn(8192, 1024, device=dev)
    true_w = torch.randn(1024, 1, device=dev)
    y = x @ true_w
    model = torch.nn.Linear(1024, 1, bias=False).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics_path = os.environ.get("TAU_METRICS_FILE", "metrics.jsonl")
    start = time.time()
    with open(metrics_path, "a") as metrics:
        for step in range(1, 201):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if step % 20 == 0:
                value = loss.item()
                metrics.write(json.dumps({"step": step, "name": "loss", "value": value}) + "\n")
                print(f"step {step:4d} loss {value:.6f}", flush=True)
    torch.cuda.synchronize()
    print(f"done in {time.time() - start:.2f}s on {torch.cuda.get_device_name(dev)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
