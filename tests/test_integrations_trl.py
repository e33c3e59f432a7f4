"""The TRL adapter: reset/act/reward behaviour, the tool schema TRL renders, and a real GRPOTrainer run."""

from __future__ import annotations

import json
import os
import tempfile
import warnings

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import gymnasium as gym  # noqa: E402

from echorl_envs.integrations.trl import (  # noqa: E402
    TRLTextEnvironment,
    make_trl_dataset,
    make_trl_environment,
    prepare_tokenizer,
)


def test_reset_matches_the_gym_env_for_the_same_seed():
    env = make_trl_environment("EchoRL/MiniGrid-Empty-5x5-v0")()
    text = env.reset(seed=3, prompt=[{"role": "user", "content": ""}])
    ref = gym.make("EchoRL/MiniGrid-Empty-5x5-v0")
    obs, info = ref.reset(seed=3)
    assert text.startswith(obs)
    assert "Admissible actions: " + ", ".join(info["admissible_actions"]) in text
    assert env.info["expert_action"] == info["expert_action"]


def test_expert_episode_reward_success_and_done():
    env = make_trl_environment("EchoRL/MiniGrid-Empty-5x5-v0")()
    env.reset(seed=0)
    while not env.done:
        feedback = env.act(env.info["expert_action"])
    assert env.won and env.get_reward() == pytest.approx(env.total_reward) and env.total_reward > 0.9
    assert "The episode is over." in feedback
    steps = env.num_steps
    assert env.act("go forward") == "The episode is over; no further actions are taken."
    assert env.num_steps == steps


def test_invalid_action_is_feedback_and_success_reward_mode():
    env = make_trl_environment("EchoRL/Arithmetic-v0", reward="success", max_attempts=2)()
    env.reset(seed=1)
    out = env.act("not a number")
    assert env.num_steps == 1 and env.num_invalid == 1 and not env.done and env.get_reward() == 0.0
    assert env.info["invalid_action"] is True and out
    out = env.act(env.info["expert_action"])
    assert out.startswith("Correct!") and env.get_reward() == 1.0


def test_index_row_selects_dataset_item_and_missing_seed_warns():
    Env = make_trl_environment("EchoRL/ARC-v0")
    a, b = Env(), Env()
    assert a.reset(index=5) == b.reset(index=5, seed=9)
    assert a.info["task_id"] == b.info["task_id"]
    c = Env()
    with pytest.warns(UserWarning, match="make_trl_dataset"):
        c.reset(prompt="x")


def test_tool_schema_and_only_act_is_a_tool():
    import inspect

    from transformers.utils import get_json_schema

    env = make_trl_environment("EchoRL/Arithmetic-v0")()
    public = [n for n, _ in inspect.getmembers(type(env), inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["act", "get_reward", "reset"]
    schema = get_json_schema(env.act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["action"]
    assert "EchoRL/Arithmetic-v0" in schema["description"] and "free text" in schema["description"]


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="did you mean"):
        make_trl_environment("EchoRL/Arithmetc-v0")
    with pytest.raises(ValueError, match="reward must be"):
        make_trl_environment("EchoRL/Arithmetic-v0", reward="best")
    with pytest.raises(ValueError, match="num_tasks"):
        make_trl_dataset("EchoRL/Arithmetic-v0", 0)
    with pytest.raises(TypeError, match="make_trl_environment"):
        TRLTextEnvironment()


def test_dataset_rows_carry_distinct_seeds():
    ds = make_trl_dataset("EchoRL/Arithmetic-v0", 3, seed=10, system_prompt="be brief")
    assert ds["seed"] == [10, 11, 12]
    assert ds[0]["prompt"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": ""}]


@pytest.fixture(scope="module")
def smollm2():
    from echorl_agent.llm import load_model

    try:
        return load_model("smollm2-135m")
    except (FileNotFoundError, ImportError) as e:  # pragma: no cover - the embedded model is installed by make
        pytest.skip(f"SmolLM2 not available: {e}")


def test_smollm2_tool_call_parses_and_reaches_the_env():
    """TRL's parser (set by add_response_schema on our template) turns a tool call into an ``act`` call."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from echorl_agent.llm.models.loading import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the SmolLM2 safetensors cache is not built yet (load_model('smollm2-135m') builds it)")
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert not supports_tool_calling(tok)  # SmolLM2's own ChatML template drops tool calls
    tok = prepare_tokenizer(tok)
    assert supports_tool_calling(tok)
    add_response_schema(tok)
    env = make_trl_environment("EchoRL/Arithmetic-v0")()
    env.reset(seed=2)
    answer = env.info["expert_action"]
    call_json = json.dumps({"name": "act", "arguments": {"action": answer}})
    text = f"<tool_call>\n{call_json}\n</tool_call><|im_end|>"
    msg = tok.parse_response(text, prefix="")
    call = msg["tool_calls"][0]["function"]
    out = getattr(env, call["name"])(**call["arguments"])
    assert out.startswith("Correct!") and env.get_reward() == 1.0


@pytest.mark.slow
def test_grpo_trainer_runs_on_echorl_env_with_smollm2(smollm2):
    """One real GRPOTrainer step (SmolLM2-135M, CPU): TRL resets our envs per rollout and logs their reward."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model, tok = smollm2.model, prepare_tokenizer(smollm2.tokenizer)
    model.requires_grad_(True)
    Env = make_trl_environment("EchoRL/Arithmetic-v0", max_attempts=1)
    ds = make_trl_dataset("EchoRL/Arithmetic-v0", 2, system_prompt="Answer by calling the act tool.")
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=24, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                      logging_steps=1, max_tool_calling_iterations=1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=ds, environment_factory=Env)
        trainer.train()
    model.requires_grad_(False)
    envs = trainer.environments
    assert len(envs) == 2 and all(isinstance(e, Env) for e in envs)
    # the group of one prompt played one task (same seed), drawn from the dataset
    assert envs[0].info["task"] == envs[1].info["task"]
    log = trainer.state.log_history[0]
    rewards = [e.get_reward() for e in envs]
    assert log["rewards/ArithmeticV0TRLEnv/mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert log["tools/call_frequency"] == pytest.approx(sum(e.num_steps for e in envs) / len(envs))
    assert torch.isfinite(torch.tensor(log["loss"]))
