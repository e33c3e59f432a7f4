"""One GiGPO iteration (ours) vs one TRL 1.16 ``GRPOTrainer`` step with ``environment_factory``, alternating in one
process: seconds per iteration, env steps/s and TRL ÷ ours (issue 25 item 6).

The nearest thing a TRL user could run for multi-turn RL on a text game is ``GRPOTrainer(environment_factory=...)``
(experimental in TRL 1.16): one environment per rollout, the model *generates* tool calls, TRL parses them, calls the
environment's public methods and appends the results to the conversation, and regenerates until the model stops
calling tools (or ``max_tool_calling_iterations``). Our GiGPO policy instead *scores* the admissible actions (one
engine call over the candidates per step) and is trained on per-step advantages.

Both sides, each round:

* ``EchoRL/BabyAI-GoToLocal-v0``, 24-step episodes, the same 2 start seeds (round ``r``: ``--seed + 2r`` and
  ``--seed + 2r + 1``), 4 episodes per seed = 8 episodes, reward = the episode's env return;
* SmolLM2-135M-Instruct from the embedded weights, float32, LoRA r=8 / alpha 16 on q/k/v/o/gate/up/down of the top 2
  layers (the same ``peft.LoraConfig`` as ``grpo_step_vs_trl.py``), lr 1e-4, clip 0.2, gradient-norm clip 1.0, one
  optimizer step, no reference model.

Warm start (untimed, ``--warm-start-episodes``, default 8 expert episodes x 3 passes, lr 1e-3): SmolLM2-135M-Instruct
as it ships emits no tool call in TRL's (Qwen2.5) format nor in SmolLM2's own (0 of 16 samples each, temperature 1,
also with a format example or a one-shot demo turn in the prompt), so TRL's rollouts would never reach the env and
every group would have zero reward variance. Both sides therefore first learn from the same expert episodes: TRL's
model copy by SFT on the expert's tool calls (LoRA r=16 on every layer, merged; cached in ``<echorl cache>/bench/``),
ours by behaviour cloning (its own LoRA). ``--warm-start-episodes 0`` runs both as they ship.

Ours: :class:`~echorl_agent.llm_rl.algorithms.gigpo.trainer.GiGPOTrainer` as the ``gigpo-2x4-lean`` loop of ``llm_rl_loop_speed.py``
but with history 0 (2 groups x K=4, ``show_admissible=False``); one ``iteration()`` = 8 episodes of rollouts +
advantages + the update + the weight sync to the engine.

TRL: ``GRPOTrainer`` with ``environment_factory`` = :func:`echorl_envs.integrations.trl.make_trl_environment` (the
same gym env, ``max_episode_steps=24``; one tool, ``act(action)``; the observation lists the admissible actions, as
the model has to spell one; ``get_reward`` = the episode's return), 2 dataset rows (the seeds) x
``num_generations=4``, ``max_tool_calling_iterations=24``, ``--max-completion-tokens`` over the whole multi-turn
completion (tool results included, TRL's budget) and ``--max-turn-tokens`` new tokens per turn. SmolLM2's own chat
template cannot render tool calls, so the tokenizer gets TRL's Qwen2.5 ChatML template (``prepare_tokenizer``; same
special tokens), which TRL's parser reads (``<tool_call>{json}</tool_call>``). Timed from TRL's ``on_step_begin`` to
``on_step_end`` (generation turns + tool calls + reward + forward/backward + optimizer step); our iteration runs
inside ``on_step_begin``, before TRL's timer.

Counted per round: env steps (ours: actions; TRL: ``act`` calls that reached the env), TRL's tool calls (all, those
that failed in TRL -- unknown tool or bad arguments -- and the env steps whose action was not admissible), generate
turns, prompt tokens prefilled and tokens generated (TRL: summed over its ``model.generate`` calls, which re-prefill
the whole conversation every turn; ours: the engine's prefilled tokens, it generates none), episode returns.

Run: ``python benchmarks/gigpo_iteration_vs_trl.py --rounds 2 --threads 1`` (a TRL iteration takes minutes). Prints a table and appends one JSON
line to ``benchmarks/results/gigpo_iteration_vs_trl.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step_vs_trl import append_record, lora_config, measured  # noqa: E402  (shared with the GRPO step bench)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "gigpo_iteration_vs_trl.jsonl"
ENV_ID = "EchoRL/BabyAI-GoToLocal-v0"
MAX_STEPS = 24
"""Env steps per episode (both sides) and TRL's ``max_tool_calling_iterations``."""
GROUPS, K = 2, 4
"""Start seeds per iteration and episodes per seed (TRL: dataset rows per step and ``num_generations``)."""
SYSTEM = ("You are an agent in a text game. In every turn, call the `act` tool with exactly one of the admissible "
          "actions, until the episode is over.")
"""System message of TRL's prompt (ours keeps :class:`LLMPolicyConfig`'s: it scores actions, it does not call tools)."""
SFT_SEED, SFT_LR = 100_000, 1e-3
"""Seeds of the warm-start expert episodes (far from the benchmark's) and the warm-start lr of both sides."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds (ours, TRL) after --warmup untimed ones")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (model load, first-call costs)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--seed", type=int, default=0, help="first start seed; also the trainers' seed")
    ap.add_argument("--max-completion-tokens", type=int, default=2048,
                    help="TRL's max_completion_length: the whole multi-turn completion, tool results included")
    ap.add_argument("--max-turn-tokens", type=int, default=64, help="TRL: new tokens per generate turn")
    ap.add_argument("--warm-start-episodes", type=int, default=8,
                    help="expert episodes both sides learn from first (untimed): ours by behaviour cloning, TRL's "
                         "model copy by SFT on the tool calls; 0: both as they ship (TRL's model then calls no tool)")
    ap.add_argument("--warm-start-epochs", type=int, default=3, help="passes over those episodes")
    ap.add_argument("--out", type=Path, default=OUT, help="JSON-lines file the run is appended to")
    args = ap.parse_args(argv)
    for name in ("rounds", "threads", "max_completion_tokens", "max_turn_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup", "warm_start_episodes", "warm_start_epochs"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    return args


def round_seeds(args: argparse.Namespace, r: int) -> list[int]:
    """The start seeds of round ``r`` (0 = the first warm-up round), one per group / dataset row."""
    return [args.seed + GROUPS * r + g for g in range(GROUPS)]


def ours_config(args: argparse.Namespace) -> Any:
    from echorl_agent.llm_rl.algorithms.gigpo.config import GiGPOConfig
    from echorl_agent.llm_rl.config import LLMPolicyConfig

    return GiGPOConfig(env_id=ENV_ID, groups=GROUPS, group_size=K, history=0, max_episode_steps=MAX_STEPS,
                       learning_rate=1e-4, seed=args.seed,
                       # a small entropy bonus keeps every sample in the update, so the learner runs (and is timed)
                       # even when every group's returns are equal -- TRL's step always runs its forward + backward
                       ent_coef=1e-3,
                       lm=LLMPolicyConfig(lora_rank=8, train_layers=2, show_admissible=False))


def trl_config_kwargs(args: argparse.Namespace, cfg: Any, output_dir: str) -> dict[str, Any]:
    """``trl.GRPOConfig`` arguments for one optimizer step per ``GROUPS`` rows x ``K`` rollouts, matching ``cfg``."""
    return dict(
        output_dir=output_dir, max_steps=args.warmup + args.rounds, per_device_train_batch_size=GROUPS * K,
        gradient_accumulation_steps=1, num_generations=K, shuffle_dataset=False,
        max_completion_length=args.max_completion_tokens, generation_kwargs={"max_new_tokens": args.max_turn_tokens},
        max_tool_calling_iterations=MAX_STEPS, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=cfg.epochs, epsilon=cfg.clip_range, loss_type="grpo", scale_rewards="group",
        learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm, gradient_checkpointing=False, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", logging_steps=1, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
    )


def trl_environment() -> type:
    """The ``environment_factory`` class: GoToLocal capped at ``MAX_STEPS`` steps, tool ``act``, reward = return."""
    from echorl_envs.integrations.trl import make_trl_environment

    return make_trl_environment(ENV_ID, reward="return", max_episode_steps=MAX_STEPS)


def expert_conversations(n: int, seed: int = SFT_SEED) -> tuple[list[list[dict[str, Any]]], Any]:
    """``n`` expert episodes (seeds ``seed ..``) as TRL's multi-turn conversations: the prompt TRL builds, then per
    step an assistant ``act`` tool call with the expert's action and the tool's reply, then a closing assistant turn
    once the episode is over. Also returns the ``act`` tool to render them with."""
    env = trl_environment()()
    convs = []
    for i in range(n):
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": env.reset(seed=seed + i)}]
        while not env.done:
            action = env.info["expert_action"]
            call = {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}
            msgs += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "name": "act", "content": env.act(action)}]
        convs.append(msgs + [{"role": "assistant", "content": "The episode is over."}])
    return convs, env.act


def sft_tool_calls(model: Any, tokenizer: Any, episodes: int, epochs: int) -> tuple[Any, dict[str, float]]:
    """Teach ``model`` the tool-call format: LoRA (r=16, every layer) on the assistant tokens of expert conversations
    (TRL's training chat template marks them), merged back into the weights. SmolLM2-135M-Instruct as it ships
    emits no tool call, so without this TRL's rollouts never reach the env."""
    import torch
    from peft import LoraConfig, get_peft_model
    from trl.chat_template_utils import get_training_chat_template

    from echorl_agent.llm_rl.config import LORA_TARGETS

    t = time.perf_counter()
    convs, act = expert_conversations(episodes)
    template = get_training_chat_template(tokenizer)
    rows = [tokenizer.apply_chat_template(c, tools=[act], chat_template=template, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True) for c in convs]
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                                            task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=SFT_LR)
    peft.train()
    losses = []
    for _ in range(epochs):
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            labels = ids.masked_fill(torch.tensor([row["assistant_masks"]]) == 0, -100)
            loss = peft(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    model = peft.merge_and_unload()
    model.eval()
    model.requires_grad_(False)
    return model, {"episodes": episodes, "epochs": epochs, "tokens": sum(len(r["input_ids"]) for r in rows),
                   "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                   "s": time.perf_counter() - t}


def behaviour_clone_ours(ours: Any, episodes: int, epochs: int) -> dict[str, Any]:
    """Our warm start: behaviour cloning of the same expert episodes (:func:`expert_conversations`' seeds) at the
    warm-start lr, then the GiGPO lr again."""
    from echorl_agent.llm_rl.algorithms.bc.clone import behaviour_clone, collect_expert_states
    from echorl_agent.llm_rl.rollout import make_choice_env

    t = time.perf_counter()
    cfg = ours.cfg
    data = collect_expert_states(lambda: make_choice_env(ENV_ID, cfg.history, MAX_STEPS), episodes, seed=SFT_SEED)
    for g in ours.policy.optimizer.param_groups:
        g["lr"] = SFT_LR
    losses = behaviour_clone(ours.policy, data, epochs=epochs, seed=cfg.seed)
    for g in ours.policy.optimizer.param_groups:
        g["lr"] = cfg.learning_rate
    return {"losses": losses, "transitions": len(data.actions), "s": time.perf_counter() - t}


def cached_sft(model: Any, tokenizer: Any, episodes: int, epochs: int) -> tuple[Any, dict[str, Any]]:
    """:func:`sft_tool_calls`, its weights kept in echorl's cache (``<cache>/bench/``) so a re-run loads them."""
    from safetensors.torch import load_model, save_model

    from echorl_agent.llm.models.loading import cache_dir

    path = cache_dir() / "bench" / f"smollm2-135m-act-tool-sft-{episodes}x{epochs}-seed{SFT_SEED}-lr{SFT_LR:g}"
    if (path / "stats.json").exists():
        load_model(model, str(path / "model.safetensors"))
        return model, {**json.loads((path / "stats.json").read_text()), "cached": True}
    model, stats = sft_tool_calls(model, tokenizer, episodes, epochs)
    path.mkdir(parents=True, exist_ok=True)
    save_model(model, str(path / "model.safetensors"))
    (path / "stats.json").write_text(json.dumps(stats))
    return model, {**stats, "cached": False}


def trl_episode_counts(envs: list[Any]) -> dict[str, Any]:
    """What TRL's rollouts did in the env: steps, invalid actions, returns, wins (one entry per environment)."""
    return {"env_steps": sum(e.num_steps for e in envs), "invalid_actions": sum(e.num_invalid for e in envs),
            "no_step_episodes": sum(e.num_steps == 0 for e in envs), "returns": [e.get_reward() for e in envs],
            "won": sum(bool(e.won) for e in envs), "tasks": [e.info.get("task") for e in envs]}


# ---------------------------------------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    import echorl_envs  # noqa: F401  (registers the envs)
    from echorl_agent.llm import load_model
    from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer
    from echorl_envs.integrations.trl import make_trl_dataset, prepare_tokenizer

    ours = GiGPOTrainer(ours_config(args))
    cfg = ours.cfg
    base = load_model(cfg.lm.model)  # TRL's own float32 copy of the same weights
    tokenizer = prepare_tokenizer(base.tokenizer)
    trl_model, sft, bc = base.model, None, None
    if args.warm_start_episodes:
        bc = behaviour_clone_ours(ours, args.warm_start_episodes, args.warm_start_epochs)
        trl_model, sft = cached_sft(base.model, tokenizer, args.warm_start_episodes, args.warm_start_epochs)
        print(f"warm start on {args.warm_start_episodes} expert episodes x {args.warm_start_epochs}: ours BC loss "
              f"{bc['losses'][0]:.3f} -> {bc['losses'][-1]:.3f} ({bc['s']:.0f} s); TRL SFT ({sft['tokens']} tokens) "
              f"loss {sft['first_loss']:.3f} -> {sft['last_loss']:.3f} ({sft['s']:.0f} s"
              f"{', loaded from the cache' if sft['cached'] else ''})", flush=True)
    n_rounds = args.warmup + args.rounds
    dataset = make_trl_dataset(ENV_ID, GROUPS * n_rounds, seed=args.seed, system_prompt=SYSTEM)

    gen: dict[str, float] = {}

    class CountingTRL(TRLTrainer):
        def _generate_single_turn(self, prompt_ids, *a, **kw):  # every generate turn: tokens in, tokens out, time
            t = time.perf_counter()
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *a, **kw)
            gen["generate_s"] = gen.get("generate_s", 0.0) + time.perf_counter() - t
            gen["turns"] = gen.get("turns", 0) + 1
            gen["prefilled_tokens"] = gen.get("prefilled_tokens", 0) + sum(len(p) for p in prompt_ids)
            gen["padded_tokens"] = gen.get("padded_tokens", 0) + len(prompt_ids) * max(len(p) for p in prompt_ids)
            gen["generated_tokens"] = gen.get("generated_tokens", 0) + sum(len(c) for c in completion_ids)
            gen.setdefault("first_turn_text", self.processing_class.decode(completion_ids[0]))
            return completion_ids, logprobs

    rounds: list[dict[str, Any]] = []
    holder: dict[str, Any] = {}

    def ours_iteration(seeds: list[int]) -> dict[str, Any]:
        ours.next_seeds = lambda: list(seeds)  # the round's start seeds, as TRL's dataset rows
        st = ours.policy.lm.engine.stats
        computed0, cached0 = st.num_computed_tokens, st.num_cached_tokens
        t = time.perf_counter()
        it = ours.iteration()
        s = time.perf_counter() - t
        st = ours.policy.lm.engine.stats
        steps = round(it["episode_length"] * GROUPS * K)
        return {"s": s, "env_steps": steps, "env_steps_per_s": steps / s, "rollout_s": it["rollout_s"],
                "learner_s": it["learner_s"], "prefilled_tokens": st.num_computed_tokens - computed0,
                "cached_tokens": st.num_cached_tokens - cached0, "return_mean": it["return_mean"],
                "success_rate": it["success_rate"], "frac_zero_std": it["frac_zero_std"],
                "updated_samples": int(it["num_samples"])}

    class Alternate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            seeds = round_seeds(args, len(rounds))
            rounds.append({"seeds": seeds, "ours": ours_iteration(seeds)})
            gen.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            row = rounds[-1]
            s = time.perf_counter() - self.t0
            env = trl_episode_counts(holder["trl"].environments)
            expected = [t for seed in row["seeds"] for t in [_task(seed)] * K]
            if env["tasks"] != expected:
                raise AssertionError(f"TRL's rollouts played {env['tasks']}, not the round's seeds {row['seeds']}")
            row["trl"] = {"s": s, **dict(gen), "rest_s": s - gen.get("generate_s", 0.0), **env,
                          "env_steps_per_s": env["env_steps"] / s}

        def on_log(self, a, state, control, logs=None, **kw):
            if not logs or "tools/call_frequency" not in logs:
                return
            row = rounds[-1]
            calls = logs["tools/call_frequency"] * GROUPS * K
            row["trl"].update(tool_calls=round(calls), tool_failures=round(logs["tools/failure_frequency"] * calls),
                              reward_mean=logs.get("reward"), grad_norm=logs.get("grad_norm"), loss=logs.get("loss"),
                              completion_mean_length=logs.get("completions/mean_length"))
            o, t = row["ours"], row["trl"]
            name = "warm-up" if len(rounds) <= args.warmup else f"round {len(rounds) - args.warmup}"
            print(f"{name} seeds {row['seeds']}: ours {o['s']:.1f} s, {o['env_steps']} steps "
                  f"({o['env_steps_per_s']:.2f}/s); TRL {t['s']:.1f} s, {t['env_steps']} env steps "
                  f"({t['env_steps_per_s']:.2f}/s), {t['tool_calls']} tool calls, {t['invalid_actions']} invalid "
                  f"actions, {t.get('turns', 0)} generate turns", flush=True)

    task_env = echorl_envs.make(ENV_ID)

    def _task(seed: int) -> str:
        return task_env.reset(seed=seed)[1]["task"]

    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl = CountingTRL(model=trl_model, processing_class=tokenizer, args=TRLConfig(**trl_config_kwargs(args, cfg, tmp)),
                          train_dataset=dataset, environment_factory=trl_environment(),
                          peft_config=lora_config(cfg.lm, ours.policy.lm.layer_ids), callbacks=[Alternate()])
        holder["trl"] = trl
        trl.remove_callback(PrinterCallback)
        trl.train()
    if len(rounds) != n_rounds or any("trl" not in r or "tool_calls" not in r["trl"] for r in rounds):
        raise AssertionError(f"expected {n_rounds} complete rounds, got {rounds}")
    return {"rounds": rounds, "sft": sft, "bc": bc}


# ---------------------------------------------------------------------------------------------- the report
HEADERS = ["side", "s / iteration", "env steps", "env steps/s", "prefilled tok", "generated tok", "TRL ÷ ours (s)",
           "TRL ÷ ours (steps/s)", "s per round"]


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medians over the timed rounds per side; ``trl_over_s`` = median TRL s ÷ median ours s and ``ours_over_rate``
    = median ours env steps/s ÷ median TRL env steps/s (ratios of medians)."""
    out = {}
    for side in ("ours", "trl"):
        vals = [r[side] for r in rows]
        out[side] = {k: statistics.median([v.get(k, 0) for v in vals])
                     for k in ("s", "env_steps", "env_steps_per_s", "prefilled_tokens", "generated_tokens")}
        out[side]["per_round"] = [v["s"] for v in vals]
    out["trl"]["trl_over_s"] = out["trl"]["s"] / out["ours"]["s"]
    rate = out["trl"]["env_steps_per_s"]
    out["trl"]["ours_over_rate"] = out["ours"]["env_steps_per_s"] / rate if rate else float("inf")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    res, common = measured(run, args)
    from tabulate import tabulate

    rows = res["rounds"]
    timed = rows[args.warmup:]
    med = summarize(timed)
    o, tr = med["ours"], med["trl"]
    table = [["ours GiGPO", f"{o['s']:.1f}", f"{o['env_steps']:.0f}", f"{o['env_steps_per_s']:.2f}",
              f"{o['prefilled_tokens']:.0f}", "0", "1", "1", ", ".join(f"{v:.1f}" for v in o["per_round"])],
             ["TRL GRPOTrainer + environment_factory", f"{tr['s']:.1f}", f"{tr['env_steps']:.0f}",
              f"{tr['env_steps_per_s']:.2f}", f"{tr['prefilled_tokens']:.0f}", f"{tr['generated_tokens']:.0f}",
              f"{tr['trl_over_s']:.2f}", f"1 / {tr['ours_over_rate']:.2f}", ", ".join(f"{v:.1f}" for v in tr["per_round"])]]
    calls = sum(r["trl"]["tool_calls"] for r in timed)
    steps = sum(r["trl"]["env_steps"] for r in timed)
    invalid = sum(r["trl"]["invalid_actions"] for r in timed)
    print(f"One iteration = {GROUPS} seeds x {K} episodes of <= {MAX_STEPS} steps on {ENV_ID} + one update, "
          f"{args.threads} thread(s), load average {common['load_before'][0]:.2f} -> {common['load_after'][0]:.2f} "
          f"(medians of {args.rounds} rounds)")
    print(tabulate(table, headers=HEADERS, tablefmt="github"))
    print(f"TRL over the timed rounds: {calls} tool calls, {steps} reached the env, {steps - invalid} of them "
          f"admissible actions; returns ours {[round(r['ours']['return_mean'], 3) for r in timed]}, TRL "
          f"{[round(statistics.mean(r['trl']['returns']), 3) for r in timed]}")
    append_record(args.out, {**common, "warmup": args.warmup, "max_completion_tokens": args.max_completion_tokens,
                             "max_turn_tokens": args.max_turn_tokens, "warm_start_episodes": args.warm_start_episodes,
                             "warm_start_epochs": args.warm_start_epochs, "sft": res["sft"], "bc": res["bc"],
                             "median": med, "warmup_rounds": rows[:args.warmup], "per_round": timed})


if __name__ == "__main__":
    main()
