"""Recipes (``echorl_agent/llm_rl/recipes/*.yaml``): every recipe trains what its study's registered command trained
(the command is parsed by the study script's own argparse and config builder and the resulting configs compared), the
listing, overrides, unknown names and fields, ``--config FILE``, and (slow) one recipe reproducing its study's seed."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from echorl_agent.llm_rl import recipes
from echorl_agent.llm_rl.recipes import load_recipe, recipe_names, resolve_config, train_config

ROOT = Path(__file__).resolve().parents[1]
#: Fields that say where and how verbosely a run writes, or where it is evaluated, not what it trains.
RUN_FIELDS = ("out", "progress", "eval_episodes", "eval_every", "eval_env_kwargs")


def script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def registered(recipe) -> tuple[str, list[str]]:
    """(script name, its arguments) of the recipe's registered command."""
    argv = shlex.split(recipe.command)
    assert argv[0] == "python" and argv[1].startswith("benchmarks/"), recipe.command
    return Path(argv[1]).stem, argv[2:]


def trains(cfg) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in RUN_FIELDS}


def test_the_shipped_recipes_include_every_published_result():
    assert {"gotolocal-rl", "gotolocal-sft-rl", "gotolocal-ppo", "alfworld4-sft-rl", "arithmetic-grpo",
            "minigrid-bc"} <= set(recipe_names())


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_trains_what_its_registered_command_trained(name):
    r = load_recipe(name)
    which, argv = registered(r)
    mod = script(which)
    assert r.seeds and r.expected and r.time and r.study
    if which == "gigpo_signal":
        args = mod.parse_args(argv)
        assert args.seeds == r.seeds
        assert args.eval_episodes == r.config["eval_episodes"]
        # the script also stops after --iterations; the registered commands never let that bind first
        assert args.iterations * args.groups * args.group_size >= args.train_steps
        for seed in r.seeds:
            mine, theirs = train_config(r, {"seed": seed}), mod.train_config(args, seed)
            assert trains(mine) == trains(theirs)
            assert mod.gigpo_config(mine)[0] == mod.gigpo_config(theirs)[0]
    elif which == "llm_rl_learning":
        args = mod.parse_args(argv)
        assert args.seeds == r.seeds and r.config["method"] in args.methods
        assert args.eval_episodes == r.config["eval_episodes"]
        assert json.loads(args.eval_env_kwargs or "{}") == r.config.get("eval_env_kwargs", {})  # the held-out env
        for seed in r.seeds:
            mine, theirs = train_config(r, {"seed": seed}), mod.train_config(r.config["method"], seed, args)
            assert trains(mine) == trains(theirs)
    elif which == "llm_rl_grpo":
        from echorl_agent.llm_rl.algorithms.grpo.config import grpo_config

        args = mod.parse_args(argv)
        assert args.seeds == r.seeds and args.eval == r.config["eval_episodes"]
        assert r.config["train_steps"] == args.steps * args.prompts * args.group
        assert (r.config.get("bc_episodes", 8) == 0) == (args.warm == 0)
        for seed in r.seeds:
            assert grpo_config(train_config(r, {"seed": seed})) == mod.grpo_config(args, seed)
    else:
        pytest.fail(f"recipe {name}: no comparison for benchmarks/{which}.py")


def test_a_registered_command_that_differs_is_caught():
    """The comparison is real: one flag changed in gotolocal-rl's command gives a different config."""
    r = load_recipe("gotolocal-rl")
    _, argv = registered(r)
    mod = script("gigpo_signal")
    changed = mod.parse_args([*argv, "--epochs", "2"])
    assert trains(train_config(r, {"seed": 1200})) != trains(mod.train_config(changed, 1200))


def test_recipe_listing_names_task_method_budget_expected_and_time(capsys):
    from echorl_agent import cli

    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in recipe_names():
        r = load_recipe(name)
        line = next(ln for ln in out.splitlines() if ln.startswith(f"| {name} "))
        for cell in (r.config["env_id"].removeprefix("EchoRL/"), r.config["method"], r.budget, r.expected, r.time):
            assert cell in line, (name, cell)
    assert "12,288 env steps" in load_recipe("gotolocal-rl").budget
    assert load_recipe("gotolocal-sft-rl").budget == "BC 2 expert episodes + 12,288 env steps"


def test_flags_override_recipe_fields_and_dicts_merge():
    cfg, how = resolve_config({"seed": 1201, "train_steps": 64, "policy_kwargs": {"engine_prefill_dtype": "float32"}},
                              recipe="gotolocal-rl")
    assert (cfg.seed, cfg.train_steps, cfg.method, cfg.step_advantage_weight) == (1201, 64, "gigpo", 0.0)
    assert cfg.policy_kwargs["engine_prefill_dtype"] == "float32" and cfg.policy_kwargs["lora_rank"] == 8
    assert how == "recipe gotolocal-rl; flags: policy_kwargs, seed, train_steps"


def test_only_flags_given_on_the_command_line_override(capsys):
    from echorl_agent import cli

    args = cli.build_parser().parse_args(["train-llm", "--recipe", "gotolocal-ppo", "--n-epochs", "2",
                                          "--gigpo-kwargs", '{"epochs": 4}'])
    assert cli.train_overrides(args) == {"n_epochs": 2, "gigpo_kwargs": {"epochs": 4}}  # no other flag overrides
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train-llm", "--recipe", "x", "--gigpo-kwargs", "{epochs: 4}"])
    assert "argument --gigpo-kwargs: not valid JSON" in capsys.readouterr().err


def test_the_task_picks_its_recipe_and_a_method_its_best_recipes_learner_settings():
    cfg, how = resolve_config({"env_id": "EchoRL/MiniGrid-Empty-Random-5x5-v0"})
    assert how.startswith("recipe minigrid-bc (the shipped recipe for this task)")
    assert trains(cfg) == trains(train_config(load_recipe("minigrid-bc")))
    cfg, how = resolve_config({"env_id": "EchoRL/MiniGrid-Empty-5x5-v0", "method": "gigpo"})
    assert how.startswith("gigpo's defaults from recipe gotolocal-rl")
    assert (cfg.n_envs, cfg.step_advantage_weight, cfg.learning_rate, cfg.gigpo_kwargs["epochs"]) == (32, 0.0, 1e-3, 4)
    assert (cfg.env_id, cfg.env_kwargs, cfg.train_steps, cfg.eval_episodes) == (
        "EchoRL/MiniGrid-Empty-5x5-v0", {}, 512, recipes.CLI_EVAL_EPISODES)  # the task's fields are not the recipe's


@pytest.mark.parametrize("name", ["alfworld-sft-rl", "webshop-sft-rl"])
def test_unregistered_recipes_say_so_and_hold_out_another_split(name):
    """Issue 89's recipes: no study stands behind them yet (study, expected and time say so), they validate, and
    their held-out env is another split of the task than the one they train on."""
    r = load_recipe(name)
    assert not r.registered and r.expected.startswith(recipes.UNREGISTERED) and r.time.startswith("ESTIMATE")
    assert len(r.seeds) >= 5
    cfg = train_config(r)
    train_split = cfg.env_kwargs.get("split", "train")
    assert cfg.eval_env_kwargs["split"] != train_split and cfg.eval_episodes >= 40
    assert cfg.method.startswith("bc+") and cfg.bc_episodes >= 32
    if name == "alfworld-sft-rl":
        assert cfg.env_kwargs["num_games"] >= 1000 and cfg.eval_env_kwargs["split"] == "valid_unseen"
    else:
        assert cfg.env_kwargs["instruction_search"] and cfg.eval_env_kwargs == {"split": "test"}
    # an unregistered recipe never becomes a task's default: --task on ALFWorld still takes the published one
    cfg, how = resolve_config({"env_id": cfg.env_id})
    assert ("alfworld4-sft-gigpo" in how) if name == "alfworld-sft-rl" else ("recipe webshop-sft-rl" in how)


def test_unknown_recipe_names_close_matches(capsys):
    from echorl_agent import cli

    with pytest.raises(ValueError, match=r"unknown recipe 'gotolocal-r'; did you mean 'gotolocal-rl'"):
        load_recipe("gotolocal-r")
    with pytest.raises(SystemExit, match="echorl train-llm: unknown recipe 'minigrid-bcc'; did you mean 'minigrid-bc'"):
        cli.main(["train-llm", "--recipe", "minigrid-bcc", "--quiet"])


def test_unknown_fields_in_a_config_file_are_named(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("env_id: EchoRL/MiniGrid-Empty-5x5-v0\nlearning_rat: 0.001\n")
    with pytest.raises(ValueError, match=r"unknown field 'learning_rat'; did you mean 'learning_rate'"):
        resolve_config({}, config_file=str(bad))
    bad.write_text("descripton: x\nconfig: {env_id: EchoRL/MiniGrid-Empty-5x5-v0}\n")
    with pytest.raises(ValueError, match=r"unknown recipe key 'descripton'; did you mean 'description'"):
        resolve_config({}, config_file=str(bad))
    with pytest.raises(ValueError, match="unknown field 'lr'"):
        resolve_config({"lr": 1e-3}, recipe="minigrid-bc")


def test_a_users_toml_or_yaml_config_runs_with_flags_on_top(tmp_path):
    toml = tmp_path / "mine.toml"
    toml.write_text('env_id = "EchoRL/MiniGrid-Empty-5x5-v0"\nmethod = "bc"\nbc_epochs = 5\n'
                    '[policy_kwargs]\nlora_rank = 4\n')
    cfg, how = resolve_config({"bc_epochs": 7}, config_file=str(toml))
    assert (cfg.env_id, cfg.method, cfg.bc_epochs, cfg.policy_kwargs) == (
        "EchoRL/MiniGrid-Empty-5x5-v0", "bc", 7, {"lora_rank": 4})
    assert how == f"config file {toml}; flags: bc_epochs"
    yaml_file = tmp_path / "mine.yaml"
    yaml_file.write_text(json.dumps({"config": {"env_id": "EchoRL/MiniGrid-Empty-5x5-v0", "method": "bc"}}))
    assert resolve_config({}, config_file=str(yaml_file))[0].method == "bc"
    with pytest.raises(FileNotFoundError, match="no/such.yaml"):
        resolve_config({}, config_file="no/such.yaml")


def test_recipes_ship_as_package_data():
    text = (ROOT / "setup.cfg").read_text()
    assert "llm_rl/recipes/*.yaml" in text and "pyyaml" in text


STUDY_S900 = ROOT / "benchmarks" / "results" / "llm_rl_learning_s900"  # its per-episode rows: the study's summary


@pytest.mark.slow
def test_minigrid_bc_recipe_reproduces_its_registered_seed(tmp_path):
    """``echorl train-llm --recipe minigrid-bc --seed 905`` (§4's registered seed 905, ~3-6 min on 2 cores) reproduces
    the study's outcome on that seed: the held-out wins of the pretrained LM (the study's ``frozen`` run) before and of
    BC after, episode by episode in both modes (the study's per-episode rows when they are in the checkout, else its
    published outcome: BC wins every held-out episode on every seed)."""
    from echorl_agent.eval.verdict import finish
    from echorl_agent.llm_rl.train import train_llm

    seed = 905
    cfg = train_config(load_recipe("minigrid-bc"), {"seed": seed, "out": str(tmp_path)})
    train_llm(cfg)
    res, line = finish(tmp_path)
    sys.path.insert(0, str(ROOT))
    from benchmarks.summarize_study import load_rows

    rows = load_rows(STUDY_S900)  # episodes.jsonl when a run wrote it here, else benchmarks/results/<study>.jsonl
    for phase, method in (("before", "frozen"), ("after", "bc")):
        for mode, study_mode in (("sampled", "stochastic"), ("greedy", "deterministic")):
            mine = [(e["episode_seed"], e["won"]) for e in
                    (dict(r, won=r["won"] == "1", episode_seed=int(r["episode_seed"]))
                     for r in csv_rows(tmp_path / "eval_episodes.csv")) if e["phase"] == phase and e["mode"] == mode]
            theirs = [(r["episode_seed"], r["won"]) for r in rows
                      if r["method"] == method and r["seed"] == seed and r["mode"] == study_mode]
            if theirs:
                assert mine == theirs, (phase, mode)
            elif phase == "after":
                assert all(won for _, won in mine), (phase, mode)
    assert res["after"]["greedy"]["success"] == res["after"]["sampled"]["success"] == 1.0, line


def csv_rows(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def study_commands(page: Path) -> list[str]:
    """The study commands of a docs/studies page's ``## Command`` block (continuation lines joined, one space
    between words; comments and ``--summary`` commands left out)."""
    block = page.read_text(encoding="utf-8").split("## Command", 1)[1].split("```")[1]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [" ".join(ln.split()) for ln in joined.splitlines()
            if ln.strip().startswith("python ") and "--summary" not in ln]


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_quotes_its_study_pages_registered_command(name):
    r = load_recipe(name)
    if not r.registered:
        pytest.skip(f"recipe {name}: {r.study}")
    page = ROOT / r.study.split()[0]
    if not page.is_file():
        pytest.skip(f"{page.relative_to(ROOT)} is not in this checkout")
    mine = " ".join(r.command.split())
    commands = study_commands(page)
    if name == "alfworld4-sft-gigpo":  # the page states GiGPO's command as flags replacing --methods bc bc+ppo
        text = " ".join(page.read_text(encoding="utf-8").split())
        assert "--methods bc+gigpo --n-envs 16 --group-size 8 --omega 1" in text
        assert mine.replace("--methods bc+gigpo", "--methods bc bc+ppo").replace(
            " --n-envs 16 --group-size 8 --omega 1 --gigpo-kwargs '{\"epochs\": 4, \"minibatch_size\": 32}'", "") in commands
    else:
        assert mine in commands, (mine, commands)
