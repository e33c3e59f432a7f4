"""README.md and the results pages quote the code truthfully, and the README keeps its shape.

What is quoted is checked against the code: the columns and an excerpt of `echorl list`, every registered id in
the family table (docs/results/envs.md), the ARC counts, the recipes the README names. The demo table is checked
against the committed demo run by tests/test_eval.py. The README's shape (≤ 150 lines, its sections in order, a
quick tour of ≤ 25 lines of code, one headline figure, one headline table of ≤ 12 rows linking to the results
pages) is what issue 87 asks of it.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import gymnasium as gym
import pytest

import echorl_envs
from echorl_agent import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
ENVS_PAGE = (ROOT / "docs" / "results" / "envs.md").read_text(encoding="utf-8")
RECIPES_DIR = ROOT / "echorl_agent" / "llm_rl" / "recipes"
#: The recipes README and docs/results/learning.md name, one per result that holds (issue 88 item 2).
RECIPES = ("gotolocal-rl", "gotolocal-sft-rl", "gotolocal-ppo", "alfworld4-sft-rl", "arithmetic-grpo", "minigrid-bc")


def sections(text: str) -> list[str]:
    """The ``## `` headings of a Markdown text, in order (headings inside code blocks excluded)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            out.append(line[3:].strip())
    return out


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of ``text``, up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Every fenced code block of ``text`` as (language, lines)."""
    return [(m.group(1), m.group(2).splitlines()) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)]


def family_table() -> dict[str, str]:
    """The envs page's ``| family | ids | source |`` table: family -> the rest of its row."""
    start = ENVS_PAGE.index("| family | ids | source |")
    rows = itertools.takewhile(lambda line: line.startswith("|"), ENVS_PAGE[start:].splitlines()[2:])
    return {row.split("|")[1].strip(): "|".join(row.split("|")[2:]) for row in rows}


def expand(pattern: str) -> list[str]:
    """``EchoRL/MiniGrid-{Empty-5x5,DoorKey-5x5}-v0`` -> both ids."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in expand(pattern[:m.start()] + alt + pattern[m.end():])]


# --- quoted output -------------------------------------------------------------------------------------------------

def test_readme_quotes_the_columns_of_echorl_list(capsys):
    assert cli.main(["list", "--family", "arc"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    columns = [c.strip() for c in header.strip("|").split("|")]
    quoted = re.search(r"`echorl list` prints one row per id with the columns ((?:`[^`]+`,?\s*)+)", README)
    assert quoted, "README no longer says which columns `echorl list` prints"
    assert re.findall(r"`([^`]+)`", quoted.group(1)) == columns


def test_readme_list_excerpt_is_what_echorl_list_prints(capsys):
    m = re.search(r"`echorl list --family (\w+)`:\n\n```text\n(.*?)\n```", README, re.S)
    assert m, "README no longer quotes `echorl list --family ...`"
    assert cli.main(["list", "--family", m.group(1)]) == 0
    assert m.group(2).splitlines() == capsys.readouterr().out.rstrip("\n").splitlines()


def test_family_table_names_every_registered_id_once():
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
    assert len(family_table()) == len({e.family for e in echorl_envs.ENVS})


def test_family_table_arc_counts_are_the_envs_num_tasks():
    arc = family_table()["ARC"]
    counts = re.search(r"`num_tasks` is (\d+) and (\d+)", arc)
    assert counts, arc
    for env_id, stated in zip(("EchoRL/ARC-v0", "EchoRL/ARC-Eval-v0"), counts.groups(), strict=True):
        env = gym.make(env_id)
        assert env.unwrapped.num_tasks == int(stated), env_id
        env.close()
    assert "400 training and 400 evaluation tasks" in arc


def test_readme_family_count_is_the_registry_s():
    families = {e.family for e in echorl_envs.ENVS}
    m = re.search(r"\| (\w+) families, one text protocol", README)
    assert m and m.group(1) == str(len(families)), (m and m.group(0), sorted(families))


def _recipe_file(name: str) -> Path | None:
    return next((f for ext in (".yaml", ".yml", ".toml") if (f := RECIPES_DIR / f"{name}{ext}").is_file()), None)


def test_quoted_recipes_are_shipped_files():
    learning = (ROOT / "docs" / "results" / "learning.md").read_text(encoding="utf-8")
    for page in (README, learning):
        assert all(f"`{name}`" in page for name in RECIPES)
    # and every recipe the learning page's tables name in their first column
    named = set(RECIPES) | set(re.findall(r"^\| `([a-z0-9-]+)` \|", learning, re.M))
    if not RECIPES_DIR.is_dir():
        pytest.skip(f"{RECIPES_DIR.relative_to(ROOT)} does not exist yet (recipes land with `echorl recipes`)")
    missing = sorted(n for n in named if _recipe_file(n) is None)
    assert not missing, f"docs name recipes with no file in {RECIPES_DIR.relative_to(ROOT)}: {missing}"


VERDICT = next(x for x in README.splitlines() if x.startswith("held-out success ("))
_MODE = r"(\d\.\d\d) → (\d\.\d\d) \(([+−-]\d\.\d\d) \[([+−-]\d\.\d\d), ([+−-]\d\.\d\d)\]\)"
_VERDICT_RE = rf"held-out success \((\d+) episodes\): sampled {_MODE}, greedy {_MODE}"


def test_readme_verdict_line_has_the_training_command_s_form():
    assert re.fullmatch(_VERDICT_RE, VERDICT), VERDICT


def test_readme_verdict_line_is_what_the_code_prints_for_those_figures():
    verdict = pytest.importorskip("echorl_agent.eval.verdict", reason="the held-out verdict lands with train-llm's")
    n, *v = re.fullmatch(_VERDICT_RE, VERDICT).groups()
    f = [float(x.replace("−", "-")) for x in v]
    result = {"episodes": int(n), "before": {}, "after": {}, "paired": {}}
    for mode, (before, after, diff, lo, hi) in zip(("sampled", "greedy"), (f[:5], f[5:]), strict=True):
        result["before"][mode], result["after"][mode] = {"success": before}, {"success": after}
        result["paired"][mode] = {"diff": diff, "ci": [lo, hi]}
    assert verdict.verdict_line(result) == VERDICT


def test_readme_verdict_figures_are_the_registered_study_s():
    study = ROOT / "docs" / "studies" / "gotolocal-grpo-from-pretrained.md"
    if not study.is_file():
        pytest.skip(f"{study.relative_to(ROOT)} does not exist yet")
    text = study.read_text(encoding="utf-8")
    n, *v = re.fullmatch(_VERDICT_RE, VERDICT).groups()
    for mode, figures in (("stochastic", v[:5]), ("deterministic", v[5:])):
        row = re.search(rf"^\| held-out success, {mode} \| ([\d.]+) \| ([\d.]+) \| \*\*([^*]+)\*\* \|", text, re.M)
        assert row, f"{study.name} has no {mode} held-out success row"
        before, after, ci = row.groups()
        assert [before, after] == figures[:2], (mode, row.group(0))
        assert ci == f"{figures[2]} [{figures[3]}, {figures[4]}]", (mode, row.group(0))
    recipe = _recipe_file("gotolocal-rl") if RECIPES_DIR.is_dir() else None
    if recipe is not None and recipe.suffix in (".yaml", ".yml"):
        import yaml

        assert yaml.safe_load(recipe.read_text())["config"]["eval_episodes"] == int(n), "README's episode count"


# --- shape ----------------------------------------------------------------------------------------------------------

def test_readme_sections_come_in_the_issue_s_order():
    assert sections(README)[:5] == ["Install and the two commands", "Quick tour", "Headline figure", "Headline table",
                                    "`make demo`"]
    intro = README.split("\n## ", 1)[0].splitlines()[1:]
    assert 1 <= len([x for x in intro if x.strip()]) <= 5, "what echorl is: at most 5 lines"
    install = section(README, "Install and the two commands")
    assert "make demo" in install and "make test" in install


def test_readme_quick_tour_is_at_most_25_lines_of_code():
    blocks = code_blocks(section(README, "Quick tour"))
    code = [ln for lang, lines in blocks if lang in ("python", "bash") for ln in lines if ln.strip()]
    assert 0 < len(code) <= 25, len(code)
    tour = "\n".join(code)
    for needle in ("gym.make(", "PPO(", "echorl recipes", "echorl train-llm --recipe gotolocal-rl"):
        assert needle in tour, needle


def test_readme_has_one_figure_and_one_headline_table_linking_each_row_to_its_results_page():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert images == ["docs/figures/headline.png"]
    caption = section(README, "Headline figure").strip().splitlines()[2:]
    assert len([x for x in caption if x.strip()]) <= 3
    table = [ln for ln in section(README, "Headline table").splitlines() if ln.startswith("|")]
    rows = table[2:]
    assert 1 <= len(rows) <= 12, len(rows)
    for row in rows:
        links = re.findall(r"\]\((docs/results/[\w-]+\.md)(?:#[\w-]+)?\)", row)
        assert links, f"headline row links to no docs/results page: {row}"
        assert all((ROOT / link).is_file() for link in links), row
    prose = re.sub(r"^```.*?^```$", "", README, flags=re.M | re.S)
    tables = [g for is_row, g in itertools.groupby(prose.splitlines(), key=lambda ln: ln.startswith("|")) if is_row]
    assert len(tables) == 2, "README holds one headline table and the demo table, nothing else"


@pytest.mark.slow
def test_readme_quick_tour_python_prints_what_it_says(tmp_path):
    """The quick tour's Python block runs as printed and prints the return its last comment quotes."""
    import os
    import subprocess
    import sys

    [(_, lines)] = [b for b in code_blocks(section(README, "Quick tour")) if b[0] == "python"]
    quoted = re.search(r"# \(([\d.]+), ([\d.]+)\): mean and std", lines[-1])
    assert quoted, lines[-1]
    script = tmp_path / "quick_tour.py"
    script.write_text("\n".join(lines) + "\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env,
                         cwd=tmp_path, check=True).stdout.splitlines()
    mean, std = (float(x) for x in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", out[-1].replace("np.float64(", "(")))
    assert (round(mean, 3), round(std, 3)) == (float(quoted.group(1)), float(quoted.group(2))), out[-1]
    # the ALFWorld line: the task, three admissible actions, the expert's next action
    assert re.fullmatch(r".+ \[('[^']+', ){2}'[^']+'\] .+", out[0]), out[0]
