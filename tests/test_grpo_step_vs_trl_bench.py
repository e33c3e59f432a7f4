"""benchmarks/grpo_step_vs_trl.py builds the same batch for both sides (without running either trainer)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "grpo_step_vs_trl", Path(__file__).resolve().parents[1] / "benchmarks" / "grpo_step_vs_trl.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_defaults_and_bad_arguments():
    args = bench.parse_args([])
    assert (args.rounds, args.threads, args.max_tokens, args.group) == (3, 1, 32, 8)
    assert args.variants == [("float32", "multinomial")]  # the exact mode, as before the option existed
    args = bench.parse_args(["--ours", "float32", "int8:inverse_cdf", "int4"])
    assert args.variants == [("float32", "multinomial"), ("int8", "inverse_cdf"), ("int4", "multinomial")]
    assert [bench.variant_name(v) for v in args.variants] == ["float32", "int8:inverse_cdf", "int4"]
    cfg = bench.ours_config(args, args.variants[1])
    assert cfg.lm.engine_weight_dtype == "int8" and cfg.sampler == "inverse_cdf"
    for bad in (["--rounds", "0"], ["--group", "1"], ["--max-tokens", "0"], ["--ours", "int9"],
                ["--ours", "int8:gumbel"], ["--ours", "int8", "int8"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_trl_config_consumes_one_group_per_optimizer_step(tmp_path):
    """TRL's own config arithmetic: one generation batch of `group` completions of one prompt per optimizer step,
    exactly `max_tokens` tokens each (min = max new tokens), no reference model, our clip / lr / grad clip."""
    pytest.importorskip("trl")
    from trl import GRPOConfig as TRLConfig

    args = bench.parse_args(["--group", "4", "--max-tokens", "12", "--rounds", "2"])
    ours = bench.ours_config(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl = TRLConfig(**bench.trl_config_kwargs(args, ours, str(tmp_path)))
    assert trl.generation_batch_size == trl.num_generations == ours.group_size == 4
    assert trl.steps_per_generation == 1 and trl.num_iterations == ours.epochs == 1
    assert trl.max_completion_length == trl.generation_kwargs["min_new_tokens"] == ours.max_tokens == 12
    assert trl.beta == 0.0 and trl.epsilon == ours.clip_range and trl.learning_rate == ours.lr
    assert trl.max_grad_norm == ours.max_grad_norm and trl.max_steps == 3  # warm-up + 2 rounds
    lora = bench.lora_config(ours.lm, [28, 29])
    assert lora.r == ours.lm.lora_rank == 8 and set(lora.target_modules) == set(ours.lm.lora_targets)
    assert lora.layers_to_transform == [28, 29] and lora.lora_alpha == ours.lm.lora_alpha


def test_prompt_ids_equal_on_both_sides_and_reward_has_variance():
    import gymnasium as gym

    import echorl_envs  # noqa: F401
    from echorl_agent.llm.models.loading import cache_dir
    from echorl_agent.llm_rl.algorithms.grpo.config import ANSWER_SYSTEM

    folder = cache_dir() / "models" / "smollm2-135m"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the SmolLM2 safetensors cache is not built yet (load_model('smollm2-135m') builds it)")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    env = gym.make(bench.ENV_ID)
    msgs = bench.task_messages(env, 3, ANSWER_SYSTEM)
    ours, trl = bench.prompt_ids_both(tok, msgs)
    assert ours == trl and len(ours) > 20
    assert tok.decode(ours).endswith("<|im_start|>assistant\n") and msgs[1]["content"] in tok.decode(ours)
    # the env's judgement plus a length term: equal judgements of different lengths still differ
    _, info = env.reset(seed=3)
    right = bench.reward(env, 3, str(info["expert_action"]))
    assert bench.reward(env, 3, "no idea") != bench.reward(env, 3, "no idea at all")
    assert right > bench.reward(env, 3, "no idea")


def test_summary_is_the_median_of_each_column_and_the_ratio_of_medians():
    rows = [{"trl_s": 9.0, "trl_generate_s": 5.0, "trl_rest_s": 4.0,
             "ours": {"float32": {"s": 2.0, "sample_s": 1.5, "update_s": 0.5},
                      "int8": {"s": 1.0, "sample_s": 0.5, "update_s": 0.5}}},
            {"trl_s": 8.0, "trl_generate_s": None, "trl_rest_s": None,
             "ours": {"float32": {"s": 4.0, "sample_s": 3.0, "update_s": 1.0},
                      "int8": {"s": 3.0, "sample_s": 2.0, "update_s": 1.0}}},
            {"trl_s": 10.0, "trl_generate_s": 7.0, "trl_rest_s": 3.0,
             "ours": {"float32": {"s": 3.0, "sample_s": 2.0, "update_s": 1.0},
                      "int8": {"s": 1.5, "sample_s": 1.0, "update_s": 0.5}}}]
    med = bench.summarize(rows)
    assert list(med) == ["TRL", "ours float32", "ours int8"]
    assert (med["ours float32"]["s"], med["ours float32"]["first_s"], med["TRL"]["s"]) == (3.0, 2.0, 9.0)
    assert med["TRL"]["first_s"] == 6.0 and med["TRL"]["second_s"] == 3.5  # rounds without a reading are left out
    assert med["ours float32"]["trl_over"] == 3.0  # median TRL ÷ median ours, not the median of the per-round ratios
    assert med["ours int8"]["trl_over"] == 6.0 and med["ours int8"]["per_round"] == [1.0, 3.0, 1.5]


def test_measured_run_records_its_setting_and_appends_one_line(tmp_path, monkeypatch):
    import json

    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    args = bench.parse_args(["--rounds", "2", "--seed", "7", "--out", str(tmp_path / "r" / "x.jsonl")])
    seen = {}

    def fake_run(a):
        seen["silenced"] = bench.os.environ.get("TRL_EXPERIMENTAL_SILENCE")
        return {"value": a.seed}

    res, common = bench.measured(fake_run, args)
    assert res == {"value": 7} and seen["silenced"] == "1"  # the run sees the comparison's environment
    assert (common["threads"], common["rounds"], common["seed"]) == (1, 2, 7)
    assert common["wall_s"] >= 0 and len(common["load_before"]) == len(common["load_after"]) == 3
    bench.append_record(args.out, {**common, "k": 1})
    bench.append_record(args.out, {"k": 2})
    lines = [json.loads(x) for x in args.out.read_text().splitlines()]
    assert [x["k"] for x in lines] == [1, 2] and lines[0]["seed"] == 7
