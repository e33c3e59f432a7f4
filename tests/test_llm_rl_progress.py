"""train-llm's live progress: what the first line says (budget rule, iteration size, evaluations), bars that count
the policy's env steps and learner rows, and the redraws that keep a bar live inside one long call."""

from __future__ import annotations

import io
import time

from echorl_agent.llm_rl.progress import RunProgress, describe
from echorl_agent.llm_rl.recipes import load_recipe, train_config


class FakePolicy:
    """The two calls a run's work goes through (scoring states, learner rows)."""

    def record_many(self, rows):
        return [None] * len(rows)

    def learner_scores_many(self, recs):
        time.sleep(0.3)  # one long learner call
        return [], None, None


def test_first_line_states_the_budget_rule_and_iteration_size():
    ppo = train_config(load_recipe("gotolocal-ppo"), {"train_steps": 1000})
    assert "bc+ppo RL for 1,024 env steps (2 rollouts of 64 steps x 8 envs; train_steps=1,000 rounded UP" in describe(ppo)
    assert describe(ppo).startswith("BC on 2 expert episodes x 20 epochs; ")
    assert describe(ppo).endswith("held-out 40 episodes x 2 modes before, after BC, after")
    rl = describe(train_config(load_recipe("gotolocal-rl")))
    assert "gigpo RL for >= 12,288 env steps (train_steps rounded UP to whole iterations" in rl
    assert "an iteration is 8 groups x 4 episodes, <= 24 steps each" in rl and "BC" not in rl
    grpo = describe(train_config(load_recipe("arithmetic-grpo"), {"train_steps": 2000}))
    assert "GRPO for 31 steps of 8 prompts x 8 completions = 1,984 completions (train_steps=2,000 rounded DOWN" in grpo
    assert describe(train_config(load_recipe("minigrid-bc"))) == (
        "BC on 12 expert episodes x 20 epochs; held-out 4 episodes x 2 modes before, after")
    unseen = describe(train_config(load_recipe("alfworld-sft-rl")))  # the held-out env is named when it differs
    assert unseen.endswith('held-out 40 episodes x 2 modes in the env with {"num_games": 200, "split": "valid_unseen"} '
                           "before, after BC, after")


def test_bars_count_env_steps_and_learner_rows_and_redraw_inside_a_long_call(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    prog, policy = RunProgress(True, heartbeat_s=0.05), FakePolicy()
    prog.attach(policy)
    prog.stage("gigpo RL", total=10, unit="env step", counting="env_steps")
    policy.record_many([1, 2, 3])
    assert (prog.bar.n, prog.phase) == (3, "rollout")
    before = err.getvalue().count("\r")
    policy.learner_scores_many([1, 2])
    assert prog.phase == "update" and prog.post["learner_rows"] == "2"
    assert err.getvalue().count("\r") >= before + 3  # redrawn while the learner call ran
    prog.stage("BC", total=4, unit="state", counting="learner_rows")
    policy.learner_scores_many([1, 2])
    assert prog.bar.n == 2 and prog.phase == "learning"
    prog.close()
    quiet = RunProgress(False)
    quiet.attach(policy)
    quiet.stage("x", total=3)
    assert quiet.bar is None and policy.record_many([1]) == [None]
