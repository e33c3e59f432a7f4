"""The ``echorl`` command line tells the truth: help generated from the registries, defaults shown, one docstring
that names every subcommand, distinct default ports."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import time

import pytest

from echorl_agent import cli


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_bench_help_lists_every_registered_agent_with_its_description(capsys):
    from echorl_agent.eval.agents import AGENTS

    text = help_text(capsys, "bench")
    agents_section = text[text.index("\nagents:\n"):]
    for name, spec in AGENTS.items():
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(spec.description)}$", agents_section, re.M), name
    flat = " ".join(text.split())
    assert "agent names: " + ", ".join(AGENTS) in flat.replace("- ", "-")  # argparse may wrap at a hyphen
    # --seeds/--episodes explain themselves and show their defaults
    assert re.search(r"--seeds SEEDS\s+training/evaluation seeds.*\(default: 2\)", flat)
    assert re.search(r"--episodes EPISODES\s+evaluation episodes per seed \(default: 5\)", flat)


def test_record_help_lists_the_agents_too(capsys):
    from echorl_agent.eval.agents import AGENTS

    text = help_text(capsys, "record")
    assert all(re.search(rf"^  {re.escape(n)}\s", text, re.M) for n in AGENTS)


def test_every_option_has_help_and_defaults_are_shown(capsys):
    for name, sub in subparsers().items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"echorl {name} {action.option_strings or action.dest} has no help"
        text = " ".join(help_text(capsys, name, *(["x"] if name == "play" else [])).split())
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                assert f"(default: {action.default})" in text or "default" in action.help, (name, action.dest)


def test_train_llm_methods_and_list_families_come_from_the_registries(capsys):
    import echorl_envs
    from echorl_agent.llm_rl.algorithms.registry import METHODS

    subs = subparsers()
    method = next(a for a in subs["train-llm"]._actions if a.dest == "method")
    assert tuple(method.choices) == tuple(METHODS)
    assert all(m in " ".join(help_text(capsys, "train-llm").split()) for m in METHODS)
    family = next(a for a in subs["list"]._actions if a.dest == "family")
    assert set(family.choices) == {e.family for e in echorl_envs.ENVS}


def test_train_llm_method_flags_come_from_the_configs_and_reach_their_learner():
    from echorl_agent.llm_rl.algorithms.options import given_options, method_options

    parser = cli.build_parser()

    def options(*argv):
        args = parser.parse_args(["train-llm", "--task", "EchoRL/MiniGrid-Empty-5x5-v0", *argv])
        return method_options(given_options(args), argparse.Namespace(method=args.method,
                                                                        echorl_learner=args.echorl_learner or "gigpo"))

    got = options("--method", "gigpo", "--epochs", "4", "--minibatch-size", "none", "--center-advantages",
                  "signal", "--positive-advantages", "true")
    assert got == {"gigpo_kwargs": {"epochs": 4, "minibatch_size": None, "center_advantages": "signal",
                                    "positive_advantages": True}}  # "none" is a value, not "unset"
    assert options("--method", "gigpo") == {}
    assert options("--method", "echorl", "--echorl-learner", "ppo", "--target-kl", "0.02") == {
        "ppo_kwargs": {"target_kl": 0.02}}
    assert options("--method", "grpo", "--max-tokens", "8", "--sampler", "inverse_cdf") == {
        "grpo_kwargs": {"max_tokens": 8, "sampler": "inverse_cdf"}}
    with pytest.raises(ValueError, match="--gae-lambda is an option of ppo, bc\\+ppo, echoppo, echorl, not of "
                                         "--method gigpo"):
        options("--method", "gigpo", "--gae-lambda", "0.9")
    with pytest.raises(ValueError, match="--epochs is an option of .*not of --method echorl with its ppo learner"):
        options("--method", "echorl", "--echorl-learner", "ppo", "--epochs", "2")
    with pytest.raises(SystemExit):  # argparse names the type it expected
        parser.parse_args(["train-llm", "--task", "x", "--epochs", "many"])
    help_flat = " ".join(help_text_of(parser, "train-llm").split())
    assert "--minibatch-size INT|NONE Samples per optimizer step" in help_flat
    assert "default 0.5 (PPO), 1.0 (GiGPO), 1.0 (GRPO)" in help_flat  # --max-grad-norm differs per learner


def help_text_of(parser, name):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return sub.format_help()


def test_docstring_names_every_subcommand_and_play_its_commands(capsys):
    names = list(subparsers())
    assert names == ["list", "play", "bench", "record", "serve", "train-llm", "eval-llm", "recipes", "serve-env"]
    first_line = cli.__doc__.splitlines()[0]
    for name in names:
        assert re.search(rf"^    echorl {re.escape(name)} ", cli.__doc__, re.M), name
        assert name in first_line
    text = help_text(capsys, "play", "x")
    assert "'history'" in text and "'quit'" in text


def test_play_tells_the_player_about_history_and_quit(monkeypatch, capsys):
    lines = iter(["history", "quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert cli.main(["play", "EchoRL/MiniGrid-Empty-5x5-v0"]) == 0
    out = capsys.readouterr().out
    assert "'history' lists your moves, 'quit' stops" in out and "(empty)" in out


def test_serve_and_serve_env_default_to_different_ports():
    subs = subparsers()
    serve_port = subs["serve"].parse_args([]).port
    env_port = subs["serve-env"].parse_args(["--task", "EchoRL/Game24-v0"]).port
    assert (serve_port, env_port) == (cli.SERVE_PORT, cli.SERVE_ENV_PORT) and serve_port != env_port
    serve_mod = pytest.importorskip("echorl_envs.service.server")
    assert inspect.signature(serve_mod.serve).parameters["port"].default == cli.SERVE_ENV_PORT


def test_bench_names_every_file_it_wrote_and_records_the_reference_it_used(tmp_path, capsys):
    args = ["bench", "--tasks", "EchoRL/Game24-v0", "--seeds", "1", "--episodes", "2", "--workers", "1", "--quiet"]
    assert cli.main([*args, "--agents", "random", "expert", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    wrote = out.strip().splitlines()[-1]
    assert wrote.startswith("wrote ")
    listed = {p.strip() for p in wrote[len("wrote "):].split(", ")}
    on_disk = {str(p) for p in (tmp_path / "a").iterdir()}
    assert listed == on_disk  # everything written, nothing more
    assert json.loads((tmp_path / "a" / "run.json").read_text())["reference"] == "random"
    assert "Δ vs random" in out
    # no random agent and no --reference: no paired columns, and run.json says so
    assert cli.main([*args, "--agents", "expert", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "Δ vs" not in out and "McNemar" not in out
    assert "Δ vs" not in (tmp_path / "b" / "summary.md").read_text()
    assert json.loads((tmp_path / "b" / "run.json").read_text())["reference"] is None


def test_written_since_lists_new_files_and_folders_with_new_content(tmp_path):
    old_file, old_dir = tmp_path / "old.txt", tmp_path / "old"
    old_file.write_text("x")
    old_dir.mkdir()
    (old_dir / "a").write_text("x")
    for p in (old_file, old_dir, old_dir / "a"):
        os.utime(p, (1_000_000, 1_000_000))
    since = time.time()
    (tmp_path / "bc.json").write_text("{}")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "w.bin").write_bytes(b"0")
    assert cli.written_since(tmp_path, since) == ["adapter/", "bc.json"]
    (old_dir / "a").write_text("y")  # rewritten inside an old folder: the folder was written
    assert cli.written_since(tmp_path, since) == ["adapter/", "bc.json", "old/"]


def test_the_peft_deprecation_warning_is_filtered_narrowly(monkeypatch):
    import subprocess
    import sys
    import warnings

    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    def peft_warnings() -> list[str]:
        torch.manual_seed(0)
        tiny = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=2))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")  # in front of any filter installed before
            if quiet:
                cli.quiet_third_party_warnings()
            peft.get_peft_model(tiny, peft.LoraConfig(r=2, target_modules=["q_proj"]))
        return [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]

    monkeypatch.setenv("PYTHONWARNINGS", "")
    quiet = False
    assert any("is_gradient_checkpointing" in m for m in peft_warnings())  # peft really triggers it
    quiet = True
    assert not any("is_gradient_checkpointing" in m for m in peft_warnings())
    # spawned workers inherit the filter; other FutureWarnings still show
    code = ("import warnings; warnings.warn('`is_gradient_checkpointing` is deprecated and will be removed', "
            "FutureWarning); warnings.warn('something else is deprecated', FutureWarning)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    assert "is_gradient_checkpointing" not in err and "something else is deprecated" in err


def _json_flags() -> list[tuple[str, str]]:
    """(subcommand, flag) of every option whose help says it takes JSON."""
    return [(name, action.option_strings[-1]) for name, sub in subparsers().items() for action in sub._actions
            if action.option_strings and "JSON" in (action.help or "")]


def test_every_json_flag_parses_json_and_its_errors_name_the_flag_the_value_and_an_example(capsys):
    flags = _json_flags()
    assert ("train-llm", "--gigpo-kwargs") in flags and ("serve-env", "--env-kwargs") in flags and len(flags) >= 8
    for name, flag in flags:
        required = {"train-llm": ["--task", "T"], "record": ["--task", "T"], "serve-env": ["--task", "T"],
                    "eval-llm": ["RUN_DIR"]}
        base = [name, *required.get(name, [])]
        args = cli.build_parser().parse_args([*base, flag, '{"a": [1, 2]}'])
        assert getattr(args, flag[2:].replace("-", "_")) == {"a": [1, 2]}, (name, flag)
        for bad, why in [("{epochs: 4}", "object keys take double quotes"),
                         ("{'epochs': 4}", "not single ones"), ('{"epochs": 4', "check the brackets"),
                         ("[1, 2]", "(a JSON array)"), ("epochs=4", "give a JSON object")]:
            with pytest.raises(SystemExit) as e:
                cli.build_parser().parse_args([*base, flag, bad])
            assert e.value.code == 2
            err = " ".join(capsys.readouterr().err.split())
            assert f"echorl {name}: error: argument {flag}: " in err and repr(bad) in err and why in err, err
            example = re.search(r"e\.g\. '(\{.*\})'$", err).group(1)
            assert isinstance(json.loads(example), dict)  # the example shown is valid JSON


def test_json_flag_values_reach_the_training_config_as_dicts(monkeypatch, tmp_path, capsys):
    seen = {}
    monkeypatch.setattr("echorl_agent.llm_rl.train.train_llm", lambda cfg, resume: seen.update(cfg=cfg))
    cli.main(["train-llm", "--task", "EchoRL/MiniGrid-Empty-5x5-v0", "--method", "gigpo", "--out", str(tmp_path),
              "--gigpo-kwargs", '{"epochs": 4}', "--policy-kwargs", '{"lora_rank": 4}', "--quiet"])
    cfg = seen["cfg"]  # the flags' objects, merged key by key into the method's defaults
    assert cfg.gigpo_kwargs["epochs"] == 4 and cfg.policy_kwargs["lora_rank"] == 4
