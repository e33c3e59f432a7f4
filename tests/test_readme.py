"""README.md quotes the code's output truthfully: the columns of `echorl list`, every registered id in the family
table, and the counts it states."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import gymnasium as gym

import echorl_envs
from echorl_agent import cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def family_table() -> dict[str, str]:
    """The README's ``| family | ids | source |`` table: family -> the rest of its row."""
    start = README.index("| family | ids | source |")
    rows = itertools.takewhile(lambda line: line.startswith("|"), README[start:].splitlines()[2:])
    return {row.split("|")[1].strip(): "|".join(row.split("|")[2:]) for row in rows}


def expand(pattern: str) -> list[str]:
    """``EchoRL/MiniGrid-{Empty-5x5,DoorKey-5x5}-v0`` -> both ids."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand(pattern[:m.start()] + alt + pattern[m.end():])]


def test_readme_quotes_the_columns_of_echorl_list(capsys):
    assert cli.main(["list", "--family", "arc"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    columns = [c.strip() for c in header.strip("|").split("|")]
    quoted = re.search(r"`echorl list` prints one row per id with the columns ((?:`[^`]+`,?\s*)+)", README)
    assert quoted, "README no longer says which columns `echorl list` prints"
    assert re.findall(r"`([^`]+)`", quoted.group(1)) == columns


def test_readme_family_table_names_every_registered_id_once():
    named: list[str] = []
    for row in family_table().values():
        ids_cell = row.split("|")[0]
        named += [i for p in re.findall(r"`(EchoRL/[^`]+)`", ids_cell) if "<task>" not in p for i in expand(p)]
        m = re.search(r"`EchoRL/MiniWoB-<task>-v0` for (\d+) tasks", ids_cell)
        if m:
            miniwob = echorl_envs.env_ids("miniwob")
            assert int(m.group(1)) == len(miniwob)
            named += miniwob
    assert sorted(named) == sorted(echorl_envs.env_ids())


def test_readme_arc_counts_are_the_envs_num_tasks():
    arc = family_table()["ARC"]
    counts = re.search(r"`num_tasks` is (\d+) and (\d+)", arc)
    assert counts, arc
    for env_id, stated in zip(("EchoRL/ARC-v0", "EchoRL/ARC-Eval-v0"), counts.groups(), strict=True):
        env = gym.make(env_id)
        assert env.unwrapped.num_tasks == int(stated), env_id
        env.close()
    assert "400 training and 400 evaluation tasks" in arc
