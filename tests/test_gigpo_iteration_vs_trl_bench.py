"""benchmarks/gigpo_iteration_vs_trl.py: TRL's env plays the same GoToLocal episodes as ours, with the same budget
(real env, no model)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "gigpo_iteration_vs_trl", Path(__file__).resolve().parents[1] / "benchmarks" / "gigpo_iteration_vs_trl.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_tool_call_steps_the_same_env_and_the_reward_is_its_return():
    import echorl_envs

    env = bench.trl_environment()()
    ref = echorl_envs.make(bench.ENV_ID, max_episode_steps=bench.MAX_STEPS)
    text = env.reset(seed=5, prompt=[{"role": "user", "content": ""}])
    obs, info = ref.reset(seed=5)
    assert text.startswith(obs) and "turn left" in text  # the model is told the actions it may spell
    assert env.act("jump") == ref.step("jump")[0] + "\n[reward 0]\nAdmissible actions: " + ", ".join(
        info["admissible_actions"])
    assert (env.num_steps, env.num_invalid) == (1, 1)
    ret = 0.0
    while not env.done:  # the expert's actions, mirrored in the reference env
        action = env.info["expert_action"]
        env.act(action)
        _, r, term, trunc, _ = ref.step(action)
        ret += r
    assert env.won and term and not trunc
    assert env.get_reward() == pytest.approx(ret) and 0.5 < ret <= 1.0
    assert env.num_invalid == 1


def test_episode_is_capped_at_the_step_budget():
    env = bench.trl_environment()()
    env.reset(seed=1)
    for _ in range(bench.MAX_STEPS):
        env.act("turn left")  # never reaches the goal
    assert env.done and env.num_steps == bench.MAX_STEPS and env.num_invalid == 0 and env.get_reward() == 0.0
    assert env.act("turn left").startswith("The episode is over") and env.num_steps == bench.MAX_STEPS


def test_trl_config_is_one_update_on_two_seeds_times_four_episodes(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig as TRLConfig

    from echorl_envs.integrations.trl import make_trl_dataset

    args = bench.parse_args(["--rounds", "2", "--warmup", "1", "--max-completion-tokens", "2048"])
    ours = bench.ours_config(args)
    assert (ours.groups, ours.group_size, ours.history, ours.max_episode_steps) == (2, 4, 0, 24)
    assert ours.lm.show_admissible is False and ours.lm.lora_rank == 8 and ours.lm.train_layers == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl = TRLConfig(**bench.trl_config_kwargs(args, ours, str(tmp_path)))
    assert trl.generation_batch_size == ours.groups * ours.group_size == 8 and trl.num_generations == 4
    assert trl.steps_per_generation == 1 and trl.num_iterations == ours.epochs == 1 and trl.max_steps == 3
    assert trl.max_tool_calling_iterations == 24 and trl.max_completion_length == 2048
    assert trl.learning_rate == ours.learning_rate and trl.epsilon == ours.clip_range and trl.beta == 0.0
    assert not trl.shuffle_dataset  # the rows are used in order: round r plays round_seeds(r)
    ds = make_trl_dataset(bench.ENV_ID, bench.GROUPS * 3, seed=args.seed)
    assert [ds["seed"][2 * r: 2 * r + 2] for r in range(3)] == [bench.round_seeds(args, r) for r in range(3)]
    for bad in (["--rounds", "0"], ["--warmup", "-1"], ["--max-turn-tokens", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_summary_medians_and_ratios():
    rows = [{"ours": {"s": 40.0, "env_steps": 160, "env_steps_per_s": 4.0, "prefilled_tokens": 9000},
             "trl": {"s": 400.0, "env_steps": 40, "env_steps_per_s": 0.1, "prefilled_tokens": 90000,
                     "generated_tokens": 900}},
             {"ours": {"s": 60.0, "env_steps": 120, "env_steps_per_s": 2.0, "prefilled_tokens": 7000},
              "trl": {"s": 200.0, "env_steps": 20, "env_steps_per_s": 0.1, "prefilled_tokens": 50000,
                      "generated_tokens": 500}}]
    med = bench.summarize(rows)
    assert med["ours"]["s"] == 50.0 and med["trl"]["s"] == 300.0 and med["trl"]["trl_over_s"] == 6.0
    assert med["ours"]["env_steps_per_s"] == 3.0 and med["trl"]["ours_over_rate"] == pytest.approx(30.0)
    assert med["ours"]["generated_tokens"] == 0 and med["trl"]["per_round"] == [400.0, 200.0]


def test_warm_start_conversations_are_expert_episodes_and_only_tool_calls_are_trained():
    import json

    convs, act = bench.expert_conversations(2)
    env = bench.trl_environment()()
    for i, msgs in enumerate(convs):  # replaying the calls in a fresh env gives the same replies and a won episode
        assert msgs[0] == {"role": "system", "content": bench.SYSTEM}
        assert msgs[1]["content"] == env.reset(seed=bench.SFT_SEED + i)
        calls = [m for m in msgs if m.get("tool_calls")]
        replies = [m["content"] for m in msgs if m["role"] == "tool"]
        assert [env.act(c["tool_calls"][0]["function"]["arguments"]["action"]) for c in calls] == replies
        assert env.won and env.num_invalid == 0 and "The episode is over." in replies[-1]
        assert msgs[-1] == {"role": "assistant", "content": "The episode is over."}

    from echorl_agent.llm.models.loading import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the SmolLM2 safetensors cache is not built yet (load_model('smollm2-135m') builds it)")
    pytest.importorskip("trl")
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template

    from echorl_envs.integrations.trl import prepare_tokenizer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(str(folder)))
    row = tok.apply_chat_template(convs[0], tools=[act], chat_template=get_training_chat_template(tok),
                                  tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = tok.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m])
    calls = [m["tool_calls"][0]["function"] for m in convs[0] if m.get("tool_calls")]
    assert trained.count("<tool_call>") == len(calls) and "Mission" not in trained and "[reward" not in trained
    assert all(json.dumps({"name": "act", "arguments": c["arguments"]}) in trained for c in calls)
