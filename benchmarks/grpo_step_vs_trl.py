"""One GRPO step on the same batch, ours vs TRL 1.16, side by side: median s/step and TRL ÷ ours (issue 25 item 6).

The batch, identical on both sides:

* the prompt: one ``EchoRL/Arithmetic-v0`` task (``--task-seed``) as a system + user chat (the system prompt is
  :class:`~echorl_agent.llm_rl.algorithms.grpo.trainer.GRPOTrainer`'s) rendered with SmolLM2's chat template -- the prompt ids are
  checked equal on both sides every step;
* ``--group`` completions of exactly ``--max-tokens`` tokens at temperature 1 (ours: the engine's ``ignore_eos``;
  TRL: ``max_completion_length`` + ``generation_kwargs={"min_new_tokens": ...}``, so EOS cannot end a completion);
* SmolLM2-135M-Instruct in float32 (two copies of the safetensors folder our loader caches), LoRA r=8, alpha 16,
  dropout 0 on q/k/v/o/gate/up/down of the top 2 layers (ours: ``LLMPolicyConfig(lora_rank=8, train_layers=2)``;
  TRL: the same ``peft.LoraConfig`` with ``layers_to_transform``);
* one optimizer step on the group: no reference model (ours has none; TRL ``beta=0``), clip 0.2, lr 2e-4 constant,
  gradient-norm clip 1.0, Adam(W, weight decay 0), TRL ``num_iterations=1`` and ``loss_type="grpo"`` (token mean per
  sequence, then the mean over sequences, as ours);
* the reward, one function for both: the env's judgement of the completion plus 0.001 × its length in characters,
  so every group has reward variance and both trainers really update (asserted every timed step: ours changes its
  LoRA weights, TRL logs ``frac_reward_zero_std == 0`` and a non-zero gradient norm).

Ours is one ``GRPOTrainer.sample_group(seed)`` + ``GRPOTrainer.update([group])`` (what ``step()`` does for one
prompt; the update includes pushing the weights to the rollout engine). ``--ours`` picks one or more variants of our
trainer, each ``DTYPE[:SAMPLER]``: the rollout engine's weights (``LLMPolicyConfig.engine_weight_dtype``: float32,
int8, int4) and the token sampler (``GRPOConfig.sampler``: multinomial, inverse_cdf); the default ``float32`` is the
exact mode. Every variant is its own trainer (its own model copies) and they all step on the same batch. TRL is one optimizer step of
``trl.GRPOTrainer`` (``model.generate``, reward, forward + backward, clipping, optimizer step), timed from its
``on_step_begin`` to its ``on_step_end`` callback; its generation time is read from TRL's own profiling contexts.

Order, in one process: one warm-up step each (not counted), then ``--rounds`` rounds of ours (each variant in
turn), TRL, ours, TRL, ... (TRL's training loop drives the rounds; our steps run inside its ``on_step_begin``
callback, before TRL's timer).
Prints a table and appends one JSON line (date, threads, load average before/after, per-round times) to
``benchmarks/results/grpo_step_vs_trl.jsonl``.

Run: ``python benchmarks/grpo_step_vs_trl.py --rounds 3 --threads 1 --ours float32 int8:inverse_cdf``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "grpo_step_vs_trl.jsonl"
ENV_ID = "EchoRL/Arithmetic-v0"
LENGTH_BONUS = 1e-3
"""Reward per character of the completion (on top of the env's judgement): gives every group reward variance."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (ours, TRL) after one warm-up step each")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per completion (exactly, on both sides)")
    ap.add_argument("--group", type=int, default=8, help="completions of the one prompt per step")
    ap.add_argument("--task-seed", type=int, default=0, help="seed of the Arithmetic-v0 task (the prompt)")
    ap.add_argument("--seed", type=int, default=0, help="sampling / trainer seed of both sides")
    ap.add_argument("--ours", nargs="+", default=["float32"], metavar="DTYPE[:SAMPLER]",
                    help="our variants, each an engine weight dtype (float32, int8, int4) and optionally a sampler "
                         "(multinomial, inverse_cdf), e.g. float32 int8:inverse_cdf")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL's default gradient checkpointing (off by default: it only slows a 135M model on CPU)")
    ap.add_argument("--out", type=Path, default=OUT, help="JSON-lines file the run is appended to")
    args = ap.parse_args(argv)
    for name in ("rounds", "threads", "max_tokens", "group"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.group < 2:
        ap.error(f"--group must be >= 2 (GRPO advantages are relative to the group), got {args.group}")
    try:
        args.variants = [parse_variant(v) for v in args.ours]
    except ValueError as e:
        ap.error(str(e))
    if len(set(args.variants)) != len(args.variants):
        ap.error(f"--ours lists a variant twice: {args.ours}")
    return args


def parse_variant(spec: str) -> tuple[str, str]:
    """``"int8:inverse_cdf"`` -> ``("int8", "inverse_cdf")``; the sampler defaults to multinomial."""
    from echorl_agent.llm.engine.config import SAMPLERS, WEIGHT_DTYPES

    dtype, _, sampler = spec.partition(":")
    sampler = sampler or "multinomial"
    if dtype not in WEIGHT_DTYPES or sampler not in SAMPLERS:
        raise ValueError(f"--ours {spec!r}: expected DTYPE[:SAMPLER] with DTYPE in {WEIGHT_DTYPES} and SAMPLER in "
                         f"{SAMPLERS}")
    return dtype, sampler


def variant_name(variant: tuple[str, str]) -> str:
    """The label of a variant in the table and the JSON rows (``int8:inverse_cdf``; the default sampler is omitted)."""
    dtype, sampler = variant
    return dtype if sampler == "multinomial" else f"{dtype}:{sampler}"


# ---------------------------------------------------------------------------------------------- the shared batch
def task_messages(env: Any, task_seed: int, system_prompt: str) -> list[dict[str, str]]:
    """The chat of task ``task_seed`` as both trainers see it (system + the env's observation)."""
    obs, _ = env.reset(seed=task_seed)
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": obs}]


def prompt_ids_both(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """Prompt ids as ours renders them (``LoadedModel.chat_ids``) and as TRL 1.16 does (one batched
    ``apply_chat_template(conversation=[...], add_generation_prompt=True, tokenize=True)``)."""
    from echorl_agent.llm import LoadedModel

    ours = LoadedModel(None, tokenizer, "").chat_ids(messages)
    trl = tokenizer.apply_chat_template(conversation=[messages], add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"][0]
    return list(ours), [int(t) for t in trl]


def reward(env: Any, task_seed: int, text: str) -> float:
    """The env's reward for answering task ``task_seed`` with ``text`` (a fresh episode) + the length bonus."""
    env.reset(seed=task_seed)
    _, r, *_ = env.step(text)
    return float(r) + LENGTH_BONUS * len(text)


def ours_config(args: argparse.Namespace, variant: tuple[str, str] = ("float32", "multinomial")) -> Any:
    from echorl_agent.llm_rl.algorithms.grpo.config import GRPOConfig
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    dtype, sampler = variant
    return GRPOConfig(env_id=ENV_ID, group_size=args.group, prompts_per_step=1, max_tokens=args.max_tokens,
                      seed=args.seed, sampler=sampler,
                      lm=LLMPolicyConfig(lora_rank=8, train_layers=2, engine_weight_dtype=dtype))


def trl_config_kwargs(args: argparse.Namespace, cfg: Any, output_dir: str) -> dict[str, Any]:
    """``trl.GRPOConfig`` arguments matching our ``GRPOConfig`` ``cfg``: one optimizer step per group of ``--group``."""
    return dict(
        output_dir=output_dir, max_steps=args.rounds + 1, per_device_train_batch_size=args.group,
        gradient_accumulation_steps=1, num_generations=args.group, max_completion_length=args.max_tokens,
        generation_kwargs={"min_new_tokens": args.max_tokens}, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=cfg.epochs, epsilon=cfg.clip_range, loss_type="grpo", scale_rewards="group",
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm, gradient_checkpointing=args.trl_gradient_checkpointing,
        use_cpu=True, bf16=False, report_to="none", save_strategy="no", logging_steps=1, seed=args.seed,
        dataloader_num_workers=0, disable_tqdm=True,
    )


def lora_config(policy: Any, layer_ids: list[int]) -> Any:
    """The ``peft.LoraConfig`` our :class:`~echorl_agent.llm_rl.lm.TrainableLM` builds from ``policy`` (an
    ``LLMPolicyConfig``) on decoder layers ``layer_ids``, for TRL."""
    from peft import LoraConfig

    return LoraConfig(r=policy.lora_rank, lora_alpha=policy.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=list(policy.lora_targets), layers_to_transform=list(layer_ids),
                      task_type="CAUSAL_LM")


# ---------------------------------------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer
    from trl.extras import profiling

    import echorl_envs  # noqa: F401  (registers the envs)
    from echorl_agent.llm import load_model
    from echorl_agent.llm_rl.algorithms.grpo.trainer import GRPOTrainer

    class BenchGRPOTrainer(GRPOTrainer):
        def judge(self, seed: int, text: str) -> float:  # the shared reward (env judgement + length bonus)
            return reward(self.env, seed, text)

    def exact_length(trainer: GRPOTrainer) -> GRPOTrainer:
        engine_submit = trainer.lm.engine.submit_group

        def submit_group(prompt, params=None, n=1, **kw):  # every completion exactly max_tokens long (ignore_eos)
            return engine_submit(prompt, dataclasses.replace(params, ignore_eos=True), n, **kw)

        trainer.lm.engine.submit_group = submit_group
        return trainer

    names = [variant_name(v) for v in args.variants]
    trainers = {name: exact_length(BenchGRPOTrainer(ours_config(args, v))) for name, v in zip(names, args.variants,
                                                                                                strict=True)}
    ours = trainers[names[0]]
    cfg = ours.cfg

    judge_env = gym.make(ENV_ID)
    messages = task_messages(judge_env, args.task_seed, cfg.system_prompt)
    base = load_model(cfg.lm.model)  # TRL's own float32 copy of the same weights
    ids_ours, ids_trl = prompt_ids_both(base.tokenizer, messages)
    if ids_ours != ids_trl or any(t.prompt_ids(args.task_seed) != ids_ours for t in trainers.values()):
        raise AssertionError("the two sides render different prompt ids")

    def trl_reward(completions: list, task_seed: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(judge_env, s, t) for s, t in zip(task_seed, texts, strict=True)]

    trl_reward.__name__ = "judge_plus_length"

    prof: dict[str, float] = {}
    record = profiling.ProfilingContext._log_metrics

    def log_metrics(self, duration: float) -> None:  # TRL's profiling contexts, collected per step
        prof[self.name.rsplit(".", 1)[-1]] = prof.get(self.name.rsplit(".", 1)[-1], 0.0) + duration
        record(self, duration)

    profiling.ProfilingContext._log_metrics = log_metrics

    seen: dict[str, Any] = {}

    class CheckedTRL(TRLTrainer):
        def _prepare_inputs(self, generation_batch):  # what the loss sees: prompt and completion token counts
            out = super()._prepare_inputs(generation_batch)
            if self.model.training:
                mask = out["prompt_mask"].bool()
                seen["prompts"] = [out["prompt_ids"][i][mask[i]].tolist() for i in range(mask.shape[0])]
                seen["completion_tokens"] = out["completion_mask"].sum(1).tolist()
                seen["advantages"] = out["advantages"].tolist()
            return out

    rounds: list[dict[str, Any]] = []

    def ours_step(ours: GRPOTrainer) -> dict[str, float]:
        before = ours.lm.trainable_state()
        t0 = time.perf_counter()
        group = ours.sample_group(args.task_seed)
        t1 = time.perf_counter()
        stats = ours.update([group])
        t2 = time.perf_counter()
        after = ours.lm.trainable_state()
        lengths = [len(o.token_ids) for o in group.completions]
        if lengths != [args.max_tokens] * args.group:
            raise AssertionError(f"ours sampled completions of {lengths} tokens, not {args.max_tokens}")
        if stats["frac_zero_std"] != 0 or stats["num_samples"] != args.group:
            raise AssertionError(f"our update skipped the group: {stats}")
        if all(torch.equal(before[k], after[k]) for k in before):
            raise AssertionError("our update did not change the LoRA weights")
        return {"s": t2 - t0, "sample_s": t1 - t0, "update_s": t2 - t1, "reward_std": float(np.std(group.rewards)),
                "loss": stats["loss"], "is_weight_mean": stats["is_weight_mean"]}

    class Alternate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            rounds.append({"ours": {name: ours_step(t) for name, t in trainers.items()}})
            prof.clear()
            seen.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            row = rounds[-1]
            row["trl_s"] = time.perf_counter() - self.t0
            row["trl_generate_s"] = prof.get("generate")
            row["trl_rest_s"] = None if row["trl_generate_s"] is None else row["trl_s"] - row["trl_generate_s"]
            if seen.get("prompts") != [ids_ours] * args.group:
                raise AssertionError("TRL's prompt ids differ from ours")
            if seen["completion_tokens"] != [args.max_tokens] * args.group:
                raise AssertionError(f"TRL's completions have {seen['completion_tokens']} tokens, not {args.max_tokens}")

        def on_log(self, a, state, control, logs=None, **kw):
            if not logs or "frac_reward_zero_std" not in logs:
                return
            row = rounds[-1]
            row.update(trl_step_time_s=logs.get("step_time"), trl_reward_std=logs.get("reward_std"),
                       trl_grad_norm=logs.get("grad_norm"), trl_loss=logs.get("loss"))
            if logs["frac_reward_zero_std"] != 0 or not logs.get("grad_norm"):
                raise AssertionError(f"TRL's step had no signal: {logs}")
            name = "warm-up" if len(rounds) == 1 else f"round {len(rounds) - 1}"
            ours_txt = ", ".join(f"ours {v} {o['s']:.2f} s (sample {o['sample_s']:.2f}, update {o['update_s']:.2f})"
                                 for v, o in row["ours"].items())
            print(f"{name}: {ours_txt}, TRL {row['trl_s']:.2f} s", flush=True)

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = Dataset.from_list([{"prompt": messages, "task_seed": args.task_seed}])
        trl = CheckedTRL(model=base.model, processing_class=base.tokenizer, reward_funcs=trl_reward,
                         args=TRLConfig(**trl_config_kwargs(args, cfg, tmp)), train_dataset=ds,
                         peft_config=lora_config(cfg.lm, ours.lm.layer_ids), callbacks=[Alternate()])
        trl.remove_callback(PrinterCallback)  # the table below reports the steps
        trl.train()
    profiling.ProfilingContext._log_metrics = record
    if len(rounds) != args.rounds + 1 or any("trl_s" not in r for r in rounds):
        raise AssertionError(f"expected {args.rounds + 1} steps per side, got {rounds}")
    return {"prompt_tokens": len(ids_ours), "rounds": rounds}


HEADERS = ["side", "step s", "sample / generate s", "update / rest s", "TRL ÷ this", "step s per round"]
"""Columns of the printed table: one row per side, medians over the timed rounds (TRL rest = its step minus its
``model.generate``)."""


def _median(vals: list[float | None]) -> float | None:
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per side (``"TRL"``, then ``"ours <variant>"``): the medians over the timed rounds of its step, its two parts
    (sample + update, TRL: generate + rest; a round without a reading is left out) and ``trl_over`` = median TRL
    step ÷ median step of this side (the ratio of the medians, not the median of the per-round ratios)."""
    trl = {"s": _median([r["trl_s"] for r in rows]), "first_s": _median([r.get("trl_generate_s") for r in rows]),
           "second_s": _median([r.get("trl_rest_s") for r in rows]), "per_round": [r["trl_s"] for r in rows]}
    out = {"TRL": {**trl, "trl_over": 1.0}}
    for name in rows[0]["ours"]:
        o = [r["ours"][name] for r in rows]
        s = _median([x["s"] for x in o])
        out[f"ours {name}"] = {"s": s, "first_s": _median([x["sample_s"] for x in o]),
                               "second_s": _median([x["update_s"] for x in o]), "trl_over": trl["s"] / s,
                               "per_round": [x["s"] for x in o]}
    return out


def set_environ(threads: int) -> None:
    """Environment of a TRL comparison run (unless already set): ``threads`` OpenMP threads, offline, quiet TRL."""
    for k, v in {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                 "TRL_EXPERIMENTAL_SILENCE": "1"}.items():
        os.environ.setdefault(k, v)


def measured(run_fn, args) -> tuple[dict, dict]:
    """``run_fn(args)`` with the run's environment set; returns its result and the record's common fields."""
    set_environ(args.threads)
    load_before = os.getloadavg()
    t = time.perf_counter()
    res = run_fn(args)
    return res, {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads, "rounds": args.rounds,
                 "seed": args.seed, "load_before": list(load_before), "load_after": list(os.getloadavg()),
                 "wall_s": time.perf_counter() - t, "argv": sys.argv[1:]}


def append_record(path: Path, record: dict) -> None:
    """Append one JSON line to the results file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    res, common = measured(run, args)
    from tabulate import tabulate

    timed = res["rounds"][1:]
    med = summarize(timed)

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    table = [[side, cell(m["s"]), cell(m["first_s"]), cell(m["second_s"]), cell(m["trl_over"]),
              ", ".join(cell(v) for v in m["per_round"])] for side, m in med.items()]
    print(f"GRPO step, 1 prompt ({res['prompt_tokens']} tokens) x {args.group} completions x {args.max_tokens} tokens, "
          f"{args.threads} thread(s), load average {common['load_before'][0]:.2f} -> {common['load_after'][0]:.2f} "
          f"(medians of {args.rounds} rounds; ours: sample + update, TRL: generate + rest)")
    print(tabulate(table, headers=HEADERS, tablefmt="github"))
    append_record(args.out, {**common, "group": args.group, "max_tokens": args.max_tokens,
                             "task_seed": args.task_seed, "trl_gradient_checkpointing": args.trl_gradient_checkpointing,
                             "ours": [variant_name(v) for v in args.variants], "prompt_tokens": res["prompt_tokens"],
                             "median": med, "warmup": res["rounds"][0], "per_round": timed})


if __name__ == "__main__":
    main()
