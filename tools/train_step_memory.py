"""Where a training step's peak memory goes, eager against llmk.patch: one step of the e2e
benchmark's model (random weights, AdamW) after a warm-up step, torch.cuda.max_memory_allocated
over it, and the allocations live at the step's peak grouped by the Python frames that made
them (torch's memory history). Needs a CUDA GPU.

    PYTHONPATH=python:bench python3 tools/train_step_memory.py [--family llama] [--layers 2]
        [--tokens 4096] [--impls eager llmk] > memory.txt
"""
import argparse
import collections

import torch

from llmk_bench.suites import e2e

# Frames worth naming in a group's key: the model, llmk, and torch's Python layers.
KEEP = ("llmk", "transformers", "torch/autograd", "torch/optim", "torch/nn")


def frames_key(frames):
    kept = [f for f in frames if f.get("filename", "").endswith(".py") and any(k in f["filename"] for k in KEEP)]
    names = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']}:{f['name']}" for f in kept[:4]]
    return " < ".join(names) or "(no Python frame)"


def live_at_peak(trace):
    """The allocations live when the trace's allocated bytes peaked, and that peak."""
    live, current, peak, peak_at = {}, 0, 0, -1
    for i, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in live:
            current -= live.pop(event["addr"])["size"]
        if current > peak:
            peak, peak_at = current, i
    live = {}
    for event in trace[:peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return list(live.values()), peak


def measure(impl, args):
    model = e2e.build(args.family, args.layers, "cuda")
    with e2e.implementation(impl, model, args.family, {}) as (model, forward):
        ids = e2e._ids(model.config.vocab_size, args.tokens, "cuda", seed=args.tokens + 1)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=e2e.LR)

        def step():
            forward(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        step()  # the optimizer's state exists from here on
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=200000)
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak_total = torch.cuda.max_memory_allocated()
        model.eval()
    live, peak = live_at_peak(snapshot["device_traces"][torch.cuda.current_device()])
    groups = collections.defaultdict(lambda: [0, 0])
    for event in live:
        group = groups[frames_key(event.get("frames", []))]
        group[0] += event["size"]
        group[1] += 1
    print(f"== {impl}: {before / 2**30:.2f} GiB allocated before the step, max_memory_allocated "
          f"{peak_total / 2**30:.2f} GiB; at the step's peak {peak / 2**30:.2f} GiB more, {len(live)} blocks:")
    for key, (size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"  {size / 2**30:7.3f} GiB  {count:5d}  {key}")
    del model, forward, optimizer
    torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="llama", choices=sorted(e2e.FAMILIES))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--impls", nargs="+", default=["eager", "llmk"], choices=["eager", "llmk"])
    parser.add_argument("--top", type=int, default=20, help="groups printed per implementation")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_step_memory: needs a CUDA GPU (torch.cuda.is_available() is False)")
    print(f"# {args.family}, {args.layers} layers, 1 x {args.tokens} tokens, {torch.cuda.get_device_name()}")
    for impl in args.impls:
        measure(impl, args)


if __name__ == "__main__":
    main()
