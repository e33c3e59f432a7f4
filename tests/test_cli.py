"""The ``echorl`` command line tells the truth: help generated from the registries, defaults shown, one docstring
that names every subcommand, distinct default ports."""

from __future__ import annotations

import argparse
import inspect
import re

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
    from echorl_agent.llm_rl.train import METHODS

    subs = subparsers()
    method = next(a for a in subs["train-llm"]._actions if a.dest == "method")
    assert tuple(method.choices) == tuple(METHODS)
    assert all(m in " ".join(help_text(capsys, "train-llm").split()) for m in METHODS)
    family = next(a for a in subs["list"]._actions if a.dest == "family")
    assert set(family.choices) == {e.family for e in echorl_envs.ENVS}


def test_docstring_names_every_subcommand_and_play_its_commands(capsys):
    names = list(subparsers())
    assert names == ["list", "play", "bench", "record", "serve", "train-llm", "serve-env"]
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
