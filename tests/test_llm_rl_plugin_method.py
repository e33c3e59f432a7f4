"""A new LLM-RL method is one folder + one registry line (issue 87): a toy REINFORCE on the embedded LM, registered
here, runs through ``echorl train-llm`` (its options as generated flags), resumes from its checkpoint, and plays
``echorl bench`` as ``llm-reinforce`` -- no library file edited.

The method (what a plugin writes; docs/plug-llm-rl.md shows the same):

* ``ReinforceConfig`` -- its options, one documented field each;
* ``ReinforceTrainer`` -- GiGPO's loop (rollout, learner, weight sync, exact resumes) with REINFORCE's advantage:
  every step's discounted return-to-go, no baseline, no group;
* ``ReinforceRun`` -- the :class:`~echorl_agent.llm_rl.algorithms.base.MethodTrainer` that builds it from the run.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from echorl_agent.llm_rl.algorithms.gigpo.run import GiGPORun
from echorl_agent.llm_rl.algorithms.gigpo.trainer import GiGPOTrainer
from echorl_agent.llm_rl.algorithms.registry import Learner, Method, register, unregister

ENV = "EchoRL/MiniGrid-Empty-Random-5x5-v0"


# ------------------------------------------------------------------ the plugin: one folder's worth of code
@dataclass
class ReinforceConfig:
    """REINFORCE's options."""

    discount: float = 1.0
    """Discount of the returns-to-go."""
    scale: float = 1.0
    """Multiplies every advantage (a step size on top of the learning rate)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"discount must be in [0, 1], got discount={self.discount!r}")


class ReinforceTrainer(GiGPOTrainer):
    """REINFORCE (Williams 1992): the advantage of a step is its discounted return-to-go."""

    reinforce = ReinforceConfig()

    def advantages(self, episodes):
        out = []
        for e in episodes:
            g, rets = 0.0, []
            for s in reversed(e.steps):
                g = s.reward + self.reinforce.discount * g
                rets.append(self.reinforce.scale * g)
            out.append(np.array(rets[::-1]))
        return out


class ReinforceRun(GiGPORun):
    """The method's trainer: GiGPO's run (logs, checkpoints, outputs) building a :class:`ReinforceTrainer`."""

    trainer_class = ReinforceTrainer
    rows_file = "reinforce.csv"

    @classmethod
    def make_trainer(cls, config, policy, run):
        trainer = ReinforceTrainer(config, policy)
        trainer.reinforce = ReinforceConfig(**run.method_kwargs)
        return trainer


REINFORCE = Method("reinforce", Learner("reinforce", ReinforceRun, ReinforceConfig),
                   "REINFORCE on the LM (returns-to-go, no baseline)", agent="llm-reinforce",
                   agent_description="SmolLM2 trained by REINFORCE (a plugin method)")


@pytest.fixture
def registered():
    from echorl_agent.eval import agents

    register(REINFORCE)
    yield REINFORCE
    unregister("reinforce")
    agents.AGENTS.pop("llm-reinforce", None)


# ------------------------------------------------------------------ no model
def test_reinforce_advantages_are_the_discounted_returns_to_go():
    from echorl_agent.llm_rl.rollout import Episode, Step

    trainer = object.__new__(ReinforceTrainer)
    trainer.reinforce = ReinforceConfig(discount=0.5, scale=2.0)
    ep = Episode(0, 0, [Step(None, 0, 0.0, "a"), Step(None, 1, 0.0, "b"), Step(None, 0, 1.0, "c")])
    (adv,) = trainer.advantages([ep])
    assert adv.tolist() == [2 * 0.25, 2 * 0.5, 2 * 1.0]


def test_registering_a_method_generates_its_flag_choice_kind_and_agent(registered, capsys):
    from echorl_agent import cli
    from echorl_agent.eval.agents import AGENTS, agent_names, incompatibility
    from echorl_agent.llm_rl.algorithms.registry import get_method, kind_of
    from echorl_agent.llm_rl.train import LLMTrainConfig

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices["train-llm"]
    method = next(a for a in sub._actions if a.dest == "method")
    assert "reinforce" in method.choices
    flag = next(a for a in sub._actions if "--discount" in a.option_strings)
    assert "Discount of the returns-to-go" in flag.help and "reinforce" in flag.help
    assert kind_of("reinforce") == "reinforce" and get_method("reinforce") is registered
    assert "llm-reinforce" in agent_names() and AGENTS["llm-reinforce"].learned
    assert incompatibility("llm-reinforce", "EchoRL/Game24-v0") is not None
    # its options are checked like the built-in methods' (unknown names, methods that do not take them)
    with pytest.raises(ValueError, match=r"method_kwargs takes \('discount', 'scale'\).*unknown: \['discont'\]"):
        LLMTrainConfig(env_id=ENV, method="reinforce", method_kwargs={"discont": 0.5})
    with pytest.raises(ValueError, match="method_kwargs applies to the reinforce methods.*method='gigpo'"):
        LLMTrainConfig(env_id=ENV, method="gigpo", method_kwargs={"discount": 0.5})
    with pytest.raises(SystemExit, match="--discount is an option of reinforce, not of --method gigpo"):
        cli.main(["train-llm", "--task", ENV, "--method", "gigpo", "--discount", "0.5", "--out", "unused"])
    with pytest.raises(ValueError, match="method 'reinforce' is already registered"):
        register(REINFORCE)


# ------------------------------------------------------------------ the real model: train-llm, resume, bench
def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_registered_method_trains_resumes_and_benches(registered, tmp_path, capsys):
    pytest.importorskip("peft")
    from echorl_agent import cli

    torch.set_num_threads(1)
    out = tmp_path / "run"
    base = ["train-llm", "--task", ENV, "--method", "reinforce", "--discount", "0.9", "--n-envs", "2",
            "--group-size", "2", "--history", "1", "--max-steps", "4", "--learning-rate", "1e-2", "--seed", "21",
            "--policy-kwargs", '{"lora_rank": 4, "max_kv_tokens": 8192}', "--checkpoint-every", "0", "--quiet",
            "--eval-episodes", "0",
            "--out", str(out)]
    assert cli.main([*base, "--train-steps", "8"]) == 0
    manifest = json.loads((out / "checkpoint" / "checkpoint.json").read_text())
    assert (manifest["kind"], manifest["timesteps"], manifest["iteration"]) == ("reinforce", 8, 1)
    assert manifest["config"]["method_kwargs"] == {"discount": 0.9}
    assert len(_rows(out / "reinforce.csv")) == 1 and len(_rows(out / "curve.csv")) == 2
    # seed 21's second iteration reaches the goal once (the pinned GiGPO run's rollouts): REINFORCE learns from it
    assert cli.main([*base, "--train-steps", "16", "--resume"]) == 0
    rows = _rows(out / "reinforce.csv")
    assert [int(float(r["timesteps"])) for r in rows] == [8, 16] and len(_rows(out / "curve.csv")) == 4
    assert float(rows[0]["num_samples"]) == 0 and float(rows[1]["num_samples"]) > 0 and float(rows[1]["loss"]) != 0
    assert json.loads((out / "checkpoint" / "checkpoint.json").read_text())["iteration"] == 2
    with pytest.raises(SystemExit, match="'reinforce' checkpoint; method 'gigpo' resumes 'gigpo'"):
        cli.main([*[a if a != "reinforce" else "gigpo" for a in base if a not in ("--discount", "0.9")],
                  "--train-steps", "24", "--resume"])
    # the bench plays it as llm-reinforce, trained by the same method
    bench = tmp_path / "bench"
    opts = {"llm-reinforce": {"n_envs": 2, "group_size": 2, "history": 1, "max_episode_steps": 2,
                              "method_kwargs": {"discount": 0.5}, "policy_kwargs": {"lora_rank": 4}}}
    assert cli.main(["bench", "--tasks", ENV, "--agents", "llm-reinforce", "--seeds", "1", "--episodes", "1",
                     "--train-steps", "4", "--max-steps", "3", "--workers", "1", "--eval-mode", "deterministic",
                     "--agent-options", json.dumps(opts), "--out", str(bench), "--quiet"]) == 0
    trained = json.loads(next(bench.rglob("config.json")).read_text())
    assert (trained["method"], trained["method_kwargs"], trained["train_steps"]) == ("reinforce", {"discount": 0.5}, 4)
    assert any("llm-reinforce" in p.name or "llm-reinforce" in p.read_text() for p in bench.glob("*.csv"))
    assert dataclasses.is_dataclass(ReinforceConfig)
