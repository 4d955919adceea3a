"""What each PyTorch knob value does on this device, one at a time, against a fixed config.

    python benchmarks/knobs.py [--device cuda:0] [--tiny] [--rounds 5] [--out FILE]

For each built-in workload (and a Hugging Face GPT-2 built from a config, where transformers is
installed), the base config (bf16 on a GPU, fp32 on a CPU; no compile, no workers) and the same
config with one knob changed, for every value the backend lets this device and workload use
(`PyTorchBackend.unsupported_reason` with the probe's own capabilities; the others are listed
with the reason). Every variant is built once through `TunedTraining`, as a trial builds it;
then, in each of `--rounds` rounds, every variant runs one timed window of steps, in turn, so
a drifting machine (clocks, a neighbour) touches them all alike; each window starts a fresh
loader and drains its prefetch queue untimed, so no variant times batches its workers made while
another ran. Reported per variant: the
median samples/s over the rounds, its ratio to the base's, the loss after the windows (a knob
that changes numerics shows here; drift itself is the search's job), and on a GPU the peak
memory allocated (activation checkpointing's saving shows here).

Writes `benchmarks/results/knobs-<cpu|gpu>.json` (`--out` to choose), naming the device.
`--tiny` shrinks the workloads to seconds (tests/e2e/test_knobs_benchmark.py runs it on the CPU, so it cannot rot).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotuner.backends.pytorch import PYTORCH, TorchCapabilities  # noqa: E402
from autotuner.backends.pytorch import builtin as workloads  # noqa: E402
from autotuner.backends.pytorch.apply import TunedTraining, resolve_device  # noqa: E402
from autotuner.backends.pytorch.probe import environment, workload_capabilities  # noqa: E402
from autotuner.backends.pytorch.workload import TorchWorkload  # noqa: E402
from autotuner.trials.outcomes import Unsupported  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
VARIED = (
    "memory_format",
    "optimizer",
    "checkpointing",
    "attention",
    "pin_memory",
    "prefetch_factor",
    "cudnn_benchmark",
)


def hf_gpt2(layers: int, dim: int, heads: int, length: int, vocab: int, samples: int) -> TorchWorkload:
    """A Hugging Face GPT-2 from a config (random weights), on batches of dicts with labels."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, n_positions=length, vocab_size=vocab)
    config.bos_token_id = config.eos_token_id = 0
    ids = torch.randint(vocab, (samples, length), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": ids[i], "labels": ids[i]} for i in range(samples)]
    return TorchWorkload(
        model=GPT2LMHeadModel(config),
        dataset=dataset,  # type: ignore[arg-type]
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-4),
    )


def cases(tiny: bool, gpu: bool) -> dict[str, tuple[Callable[[], TorchWorkload], int]]:
    """Workload name -> (factory, micro-batch)."""
    if tiny:
        return {
            "mlp": (lambda: workloads.mlp(samples=512), 64),
            "cnn": (lambda: workloads.cnn(samples=256, width=8), 32),
            "gpt": (lambda: workloads.gpt(layers=2, dim=32, heads=2, length=32, vocab=64, samples=256), 16),
            "resnet": (lambda: workloads.resnet(samples=256), 16),
            "hf-gpt2": (lambda: hf_gpt2(2, 32, 2, 32, 64, 256), 16),
        }
    scale = 4 if gpu else 1
    layers, dim, heads, length = (8, 512, 8, 512) if gpu else (2, 128, 2, 128)
    return {
        "mlp": (lambda: workloads.mlp(), 256 * scale),
        "cnn": (lambda: workloads.cnn(samples=4096, width=32 * scale), 64 * scale),
        "gpt": (
            lambda: workloads.gpt(layers=layers, dim=dim, heads=heads, length=length, vocab=512, samples=2048),
            8 * scale,
        ),
        "resnet": (lambda: workloads.resnet(samples=4096), 32 * scale),
        "hf-gpt2": (lambda: hf_gpt2(layers, dim, heads, length, 512, 2048), 8 * scale),
    }


def variants(base: dict[str, Any], caps: TorchCapabilities) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Name -> config (the base, and the base with one knob changed), and name -> why skipped."""
    run: dict[str, dict[str, Any]] = {"base": base}
    skipped: dict[str, str] = {}
    for knob in VARIED:
        definition = PYTORCH.knobs[knob]
        values = definition.choices or (4,)
        for value in values:
            if value == base[knob]:
                continue
            config = {**base, knob: value}
            if knob == "prefetch_factor" or (knob == "pin_memory" and base["workers"] == 0):
                config["workers"] = 2  # only workers prefetch; pinning is measured with them too
            name = f"{knob}={value}" + (" workers=2" if config["workers"] != base["workers"] else "")
            reason = PYTORCH.unsupported_reason(config, caps)
            if reason:
                skipped[name] = reason
            else:
                run[name] = config
    if base["workers"] == 0:
        run["workers=2"] = {**base, "workers": 2}
    return run, skipped


def batches(tuned: TunedTraining, workload: TorchWorkload) -> Iterator[Any]:
    """The workload's batches, shuffled alike for every variant, for as long as asked."""
    loader = tuned.make_loader(workload.dataset, seed=0)
    while True:
        yield from loader


def measure(
    make: Callable[[], TorchWorkload], batch: int, device: torch.device, rounds: int, steps: int
) -> dict[str, Any]:
    probe = make()
    caps = PYTORCH.capabilities({**environment(device).capabilities, **workload_capabilities(probe, device, 2)})
    precision = "bf16" if device.type == "cuda" else "fp32"
    base = {
        **{name: knob.reference for name, knob in PYTORCH.knobs.items()},
        "precision": precision,
        "batch_size": batch,
        "accumulation": 1,
    }
    configs, skipped = variants(base, caps)
    runs: dict[str, Any] = {}
    live: dict[str, tuple[TorchWorkload, TunedTraining, Iterator[Any]]] = {}
    for name, config in configs.items():
        torch.manual_seed(0)
        workload = make()
        try:
            tuned = TunedTraining(
                config,
                workload.model,
                workload.optimizer(workload.model.parameters()),
                device=device,
                collate_fn=workload.collate_fn,
                checkpoint_blocks=workload.checkpoint_blocks,
            )
        except Unsupported as exc:
            skipped[name] = str(exc)
            continue
        live[name] = (workload, tuned, batches(tuned, workload))
        runs[name] = {"config": {k: config[k] for k in VARIED + ("workers",)}, "rates": [], "peak_mb": None}

    def step(name: str) -> torch.Tensor:
        workload, tuned, stream = live[name]
        torch.backends.cudnn.benchmark = bool(tuned.config["cudnn_benchmark"])  # process-wide: per variant
        batch_ = tuned.to_device(next(stream))
        with tuned.autocast():
            loss = workload.loss(tuned.model, batch_)
        tuned.backward(loss)
        tuned.step()
        return loss.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for name in list(live):  # warm-up, and the peak memory of a step
        try:
            for _ in range(3):
                step(name)
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                step(name)
                sync()
                runs[name]["peak_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        except Unsupported as exc:
            skipped[name] = str(exc)
            del live[name], runs[name]
    for _ in range(rounds):
        for name in live:
            # A fresh loader for each window, its queue drained before the clock starts: a loader
            # kept alive fills its queue while the other variants run, and its window would then
            # time batches made for free (and its workers would load the CPU under the others).
            workload, tuned, _ = live[name]
            live[name] = (workload, tuned, batches(tuned, workload))
            for _ in range(1 + tuned.config["workers"] * tuned.config["prefetch_factor"]):
                step(name)
            sync()
            start = time.perf_counter()
            for _ in range(steps):
                loss = step(name)
            sync()
            live[name] = (workload, tuned, iter(()))  # its workers shut down
            runs[name]["rates"].append(steps * batch / (time.perf_counter() - start))
            runs[name]["loss"] = round(float(loss), 5)
    base_rate = statistics.median(runs["base"]["rates"])
    for entry in runs.values():
        entry["samples_per_s"] = round(statistics.median(entry["rates"]), 1)
        entry["vs_base"] = round(entry["samples_per_s"] / base_rate, 3)
        entry["rates"] = [round(r, 1) for r in entry["rates"]]
    live.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch_size": batch, "precision": precision, "variants": runs, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--tiny", action="store_true", help="seconds-sized workloads (a dry run)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed window")
    parser.add_argument("--only", nargs="*", help="these workloads only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    env = environment(device)
    out = args.out or RESULTS / f"knobs-{'gpu' if device.type == 'cuda' else 'cpu'}.json"
    result: dict[str, Any] = {
        "device": env.device_name,
        "versions": dict(env.versions),
        "python": platform.python_version(),
        "command": "python benchmarks/knobs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rounds": args.rounds,
        "steps_per_window": args.steps,
        "workloads": {},
    }
    for name, (make, batch) in cases(args.tiny, device.type == "cuda").items():
        if args.only and name not in args.only:
            continue
        if name == "hf-gpt2":
            try:
                import transformers  # noqa: F401
            except ImportError:
                continue
        started = time.perf_counter()
        try:
            result["workloads"][name] = measure(make, batch, device, args.rounds, args.steps)
        except Exception as exc:  # one workload's failure is a finding, not the end of the run
            result["workloads"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        result["workloads"][name]["wall_s"] = round(time.perf_counter() - started, 1)
        entry = result["workloads"][name]
        print(f"{name}: {entry.get('error') or ''}", flush=True)
        for variant, data in entry.get("variants", {}).items():
            peak = f", peak {data['peak_mb']:,.0f} MB" if data["peak_mb"] else ""
            print(
                f"  {variant:<40} {data['samples_per_s']:>10,.1f}/s  {data['vs_base']:.2f}x  loss {data['loss']}{peak}"
            )
        for variant, why in entry.get("skipped", {}).items():
            print(f"  {variant:<40} skipped: {why}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")  # after each workload: a cut-off run keeps the rest
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
