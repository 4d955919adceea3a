"""The promise through the Hugging Face `Trainer`: the speedup the Trainer delivers with the
exported `TrainingArguments`, next to the study's.

    python benchmarks/hf_trainer.py [--export runs/hf-gpt2/best.yaml] [--steps 60] [--rounds 3]

Without the export it first runs the example study (`autotuner search --spec
examples/huggingface/gpt2.yaml`: GPT-2 built from a config, a dataset of dicts). Then, in one run,
it trains the same model with `transformers.Trainer` under the baseline's arguments and under the
tuned ones (`autotuner.integrations.transformers.training_arguments` of each config), alternating
baseline and tuned `--rounds` times. A run's throughput is taken by a callback over its optimizer
steps after the first `WARMUP_STEPS` (the Trainer's own `train_samples_per_second` counts the
loader's start and the first steps too); the speedup delivered is the median over the rounds of
tuned over baseline, each round's pair measured back to back.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import machine, write_results

from autotuner.apply import TunedConfig, load_config
from autotuner.integrations.transformers import training_arguments

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the example's factory imports as examples.huggingface.gpt2, as the spec names it
SPEC = "examples/huggingface/gpt2.yaml"
EXPORT = ROOT / "runs" / "hf-gpt2" / "best.yaml"
WARMUP_STEPS = 5


def trainer_throughput(config: TunedConfig, steps: int, folder: str) -> dict[str, float]:
    """Train the example's model for `steps` optimizer steps with the Trainer under `config`'s
    arguments; samples/s over the steps after `WARMUP_STEPS`."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from examples.huggingface.gpt2 import make_workload

    torch.manual_seed(0)
    workload = make_workload()
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks[state.global_step] = time.perf_counter()

    arguments = training_arguments(config)
    args = TrainingArguments(
        output_dir=folder,
        use_cpu=True,
        max_steps=steps,
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        seed=0,
        disable_tqdm=True,
        **arguments,
    )
    trainer = Trainer(model=workload.model, args=args, train_dataset=workload.dataset, callbacks=[Clock()])
    trainer.train()
    global_batch = config.params["batch_size"] * config.params["accumulation"]
    elapsed = marks[steps] - marks[WARMUP_STEPS]
    return {"samples_per_s": (steps - WARMUP_STEPS) * global_batch / elapsed, "seconds": elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=EXPORT)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per Trainer run")
    parser.add_argument("--rounds", type=int, default=3, help="baseline/tuned pairs")
    args = parser.parse_args()
    if not args.export.exists():
        autotuner = Path(sys.executable).with_name("autotuner")
        subprocess.run([str(autotuner), "search", "--spec", SPEC], cwd=ROOT, check=True)
    tuned = load_config(args.export)
    baseline = dataclasses.replace(tuned, params=dict(tuned.baseline["params"]))
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for number in range(args.rounds):
            base = trainer_throughput(baseline, args.steps, folder)
            best = trainer_throughput(tuned, args.steps, folder)
            rounds.append({"baseline": base, "tuned": best, "speedup": best["samples_per_s"] / base["samples_per_s"]})
            print(
                f"round {number + 1}: baseline {base['samples_per_s']:,.0f}/s, tuned {best['samples_per_s']:,.0f}/s: "
                f"{rounds[-1]['speedup']:.2f}x"
            )
    delivered = statistics.median(r["speedup"] for r in rounds)
    promised = float(tuned.speedup or 0.0)
    print(
        f"the Trainer delivered {delivered:.2f}x (median of {args.rounds}); the study's export says {promised:.2f}x: "
        f"ratio {delivered / promised:.3f}"
    )
    import transformers

    write_results(
        "hf_trainer.json",
        {
            "machine": machine(tuned.environment) + f", transformers {transformers.__version__}",
            "export": str(args.export.relative_to(ROOT) if args.export.is_absolute() else args.export),
            "tuned": tuned.params,
            "baseline": baseline.params,
            "steps": args.steps,
            "warmup_steps": WARMUP_STEPS,
            "rounds": rounds,
            "speedup_delivered": delivered,
            "speedup_promised": promised,
            "ratio": delivered / promised if promised else None,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
