"""The promise through the Hugging Face `Trainer`: the speedup the Trainer delivers with the
exported `TrainingArguments`, next to the study's.

    python benchmarks/hf_trainer.py [--export runs/hf-gpt2/best.yaml] [--steps 60] [--rounds 5]

It first runs the example study (`autotuner search --spec examples/huggingface/gpt2.yaml`: GPT-2
built from a config, a dataset of dicts) in a fresh folder, so that the study and the Trainer run
under the same conditions; `--export` takes an export instead, refused when its trials ran under
other thread settings (on 2 cores, `OMP_WAIT_POLICY=PASSIVE` alone halves the Trainer's baseline:
the comparison would measure that). Then, in the same run, it trains the same model with
`transformers.Trainer` under the baseline's arguments and under the tuned ones
(`autotuner.backends.pytorch.integrations.transformers.training_arguments` of each config), alternating baseline
and tuned `--rounds` times. A run's throughput is taken by a callback over its optimizer
steps after the first `WARMUP_STEPS` (the Trainer's own `train_samples_per_second` counts the
loader's start and the first steps too); the speedup delivered is the median over the rounds of
tuned over baseline, each round's pair measured back to back.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import ROOT, machine, run_search, write_results

from autotuner.apply import TunedConfig, load_config
from autotuner.backends.pytorch.integrations.transformers import training_arguments
from autotuner.measurement.hardware import thread_settings
from autotuner.study.fingerprint import describe_threads

sys.path.insert(0, str(ROOT))  # the example's factory imports as examples.huggingface.gpt2, as the spec names it
SPEC = ROOT / "examples" / "huggingface" / "gpt2.yaml"
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
    parser.add_argument("--export", type=Path, help="an export of the example study (default: run the study)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per Trainer run")
    parser.add_argument("--rounds", type=int, default=5, help="baseline/tuned pairs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.export is None:
            search = run_search(SPEC, "hf-gpt2", Path(folder), path=ROOT)
            if search.exit_code:
                return search.exit_code
            args.export = Path(folder) / "runs" / "hf-gpt2" / "best.yaml"
            source = f"{SPEC.relative_to(ROOT)}, searched in this run ({search.wall_s:.0f} s)"
        else:
            source = str(args.export)
        tuned = load_config(args.export)
        studied, here = tuned.environment.get("threads", {}), thread_settings()
        if {k: v for k, v in studied.items() if k != "intra_op"} != here:
            print(
                f"hf_trainer.py: error: {args.export} was measured with threads {describe_threads(studied)}, "
                f"this run has {describe_threads(here)}: run it with the study's settings, or without --export",
                file=sys.stderr,
            )
            return 2
        return _compare(tuned, source, args.steps, args.rounds, folder)


def _compare(tuned: TunedConfig, source: str, steps: int, count: int, folder: str) -> int:
    """The Trainer under the baseline's and the tuned arguments, `count` pairs back to back."""
    import transformers

    baseline = dataclasses.replace(tuned, params=dict(tuned.baseline["params"]))
    rounds, speedups = [], []
    for number in range(count):
        base = trainer_throughput(baseline, steps, folder)
        best = trainer_throughput(tuned, steps, folder)
        speedups.append(best["samples_per_s"] / base["samples_per_s"])
        rounds.append({"baseline": base, "tuned": best, "speedup": speedups[-1]})
        print(
            f"round {number + 1}: baseline {base['samples_per_s']:,.0f}/s, tuned {best['samples_per_s']:,.0f}/s: "
            f"{speedups[-1]:.2f}x"
        )
    delivered = statistics.median(speedups)
    promised = float(tuned.speedup or 0.0)
    print(
        f"the Trainer delivered {delivered:.2f}x (median of {count}); the study's export says {promised:.2f}x: "
        f"ratio {delivered / promised:.3f}"
    )
    write_results(
        "hf_trainer.json",
        {
            "machine": machine(tuned.environment) + f", transformers {transformers.__version__}",
            "export": source,
            "study_baseline_per_s": tuned.baseline.get("throughput"),
            "study_tuned_per_s": tuned.metrics.get("throughput"),
            "tuned": tuned.params,
            "baseline": baseline.params,
            "steps": steps,
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
