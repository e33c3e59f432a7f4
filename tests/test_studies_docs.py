"""The study pages under docs/studies/: each one complete, short, and listed in the index.

Every registered study has one page holding its registration (date and seeds), the command that runs it, an
outcome table and a verdict; the index (docs/studies/README.md) links every page, and only the index's mapping
column names the old registration file's section numbers.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "docs" / "studies"
INDEX = STUDIES / "README.md"
PROTOCOL = STUDIES / "protocol.md"
RECIPES = ROOT / "echorl_agent" / "llm_rl" / "recipes"
PAGES = sorted(p for p in STUDIES.glob("*.md") if p not in (INDEX, PROTOCOL))
MAX_LINES = 400

# The recipes `echorl train-llm --recipe NAME` reproduces, and the study each one comes from.
RECIPE_STUDY = {
    "gotolocal-rl": "gotolocal-grpo-from-pretrained",
    "gotolocal-sft-rl": "gotolocal-sft-episode-grpo-20-seeds",
    "gotolocal-ppo": "gotolocal-bc-ppo",
    "alfworld4-sft-rl": "alfworld-four-games-bc-ppo-gigpo",
    "arithmetic-grpo": "arithmetic-grpo-from-pretrained",
    "minigrid-bc": "minigrid-frozen-vs-bc",
}

# Work-log ordinals ("the fifty-ninth session") and the deleted log files have no place on a study page.
ORDINAL_SESSION = re.compile(r"\b[a-z-]*(first|second|third|[a-z]th)\s+sessions?\b", re.IGNORECASE)


def sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections by title (the text up to the next ``## `` heading)."""
    parts = re.split(r"^## +(.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def running(page: Path) -> bool:
    """A registered study whose seeds are not all in: its outcome section says "Running" and it has no verdict yet."""
    return sections(page.read_text(encoding="utf-8")).get("Outcome", "").strip().startswith("Running")


def test_there_is_one_page_per_registered_study():
    # 26 registered studies plus the two SB3 step-count studies whose seeds were fixed in a commit, finished; the
    # studies registered since then, finished or running.
    assert len([p for p in PAGES if not running(p)]) >= 28, [p.name for p in PAGES]
    assert PROTOCOL.is_file() and INDEX.is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_study_page_has_registration_command_outcome_and_verdict(page):
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# "), f"{page.name}: no title"
    found = sections(text)
    for name in ("Registration", "Command", "Outcome", "Verdict"):
        assert name in found, f"{page.name}: no '## {name}' section (has {sorted(found)})"
    registration = found["Registration"]
    assert re.search(r"\b2026-\d\d-\d\d\b", registration), f"{page.name}: registration names no date"
    assert re.search(r"\*\*(tuning )?seeds \d+–\d+\*\*|\*\*Seeds\*\*:", registration, re.IGNORECASE), \
        f"{page.name}: registration names no seeds"
    command = found["Command"]
    block = re.search(r"```\n(.+?)```", command, re.DOTALL)
    assert block, f"{page.name}: the command is not in a code block"
    scripts = re.findall(r"benchmarks/(\w+\.py)", block.group(1))
    assert scripts or "echorl_agent.cli" in block.group(1), f"{page.name}: the command runs no script"
    for script in scripts:
        assert (ROOT / "benchmarks" / script).is_file(), f"{page.name}: benchmarks/{script} does not exist"
    if running(page):  # registered, seeds not all in: no table, no conclusion
        assert re.search(r"\bpending\b", found["Verdict"], re.IGNORECASE), f"{page.name}: running, verdict not pending"
        return
    assert re.search(r"^\|.+\|$\n^\|[-| ]+\|$", found["Outcome"], re.MULTILINE), f"{page.name}: no outcome table"
    assert re.search(r"\bholds\b|not established|not a claim", found["Verdict"], re.IGNORECASE), \
        f"{page.name}: the verdict says neither 'holds' nor 'not established'"


@pytest.mark.parametrize("page", [*PAGES, PROTOCOL], ids=lambda p: p.stem)
def test_a_study_page_is_short_and_free_of_the_work_log(page):
    text = page.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{page.name}: {len(text.splitlines())} lines > {MAX_LINES}"
    assert "§" not in text, f"{page.name}: '§' belongs only in the index's mapping column"
    assert not ORDINAL_SESSION.search(text), f"{page.name}: work-log ordinal {ORDINAL_SESSION.search(text)[0]!r}"
    assert "RESULTS.md" not in text and "preregistered.md" not in text, f"{page.name}: names a deleted file"


@pytest.mark.parametrize("page", [*PAGES, PROTOCOL, INDEX], ids=lambda p: p.stem)
def test_links_between_study_pages_resolve(page):
    for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
        assert (page.parent / target).is_file(), f"{page.name} links to missing {target}"


def test_the_index_lists_every_page_once_with_its_verdict_and_old_section():
    text = INDEX.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    linked = [re.match(r"\| \[[^\]]+\]\(([^)]+)\)", row).group(1) for row in rows]
    assert sorted(linked) == sorted(p.name for p in PAGES)
    old_sections = []
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4, row
        assert re.search(r"holds|not established|no claim|running", cells[2]), f"no verdict in: {row}"
        assert re.fullmatch(r"§\d+|—", cells[3]), f"old section column: {cells[3]!r}"
        old_sections += [int(cells[3][1:])] if cells[3] != "—" else []
    assert sorted(old_sections) == list(range(1, 27)), "every old § 1–26 maps to exactly one page"
    # '§' appears in the index only in that mapping column (its rows and its header).
    outside = [line for line in text.splitlines()
               if "§" in line and not line.startswith("| [") and line != "| study | question | verdict | old § |"]
    assert outside == [], outside


@pytest.mark.parametrize("recipe, study", sorted(RECIPE_STUDY.items()))
def test_the_pages_behind_the_recipes_name_them(recipe, study):
    text = (STUDIES / f"{study}.md").read_text(encoding="utf-8")
    assert f"Recipe: `echorl train-llm --recipe {recipe}`" in text
    if RECIPES.is_dir():  # the recipe files land with `--recipe`; once there, each named one must exist
        assert (RECIPES / f"{recipe}.yaml").is_file(), f"{study}.md names a recipe {recipe!r} with no YAML"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_a_study_page_names_its_per_seed_data_and_it_is_in_the_repository(page):
    text = page.read_text(encoding="utf-8")
    line = re.search(r"^Per-seed data: (.+?)\.$", text, re.MULTILINE | re.DOTALL)
    assert line, f"{page.name}: no 'Per-seed data:' line"
    paths = re.findall(r"`([^`]+\.(?:jsonl|csv)|[^`]+/)`", line.group(1))
    assert paths, f"{page.name}: the per-seed data names no file"
    for name in paths:
        path = ROOT / name if "/" in name.rstrip("/") else ROOT / "benchmarks" / "results" / name
        # The compact summary (<out>.jsonl) or, where a study's raw folder is still tracked, that folder.
        assert path.exists() or path.with_suffix("").is_dir() or running(page), \
            f"{page.name}: {name} is not in the repository"
