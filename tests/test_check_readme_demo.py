"""``benchmarks/check_readme_demo.py`` accepts the demo rows documented for the host's CPU, and only those."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "benchmarks" / "baselines" / "demo"
ECHOPPO = ("EchoRL/MiniGrid-Empty-Random-5x5-v0", "echoppo")


@pytest.fixture(scope="module")
def chk():
    spec = importlib.util.spec_from_file_location("check_readme_demo", ROOT / "benchmarks" / "check_readme_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cpuinfo(vendor: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\nvendor_id\t: x\n"


def test_cpu_key_names_the_vendor_and_the_widest_vector_unit(chk):
    assert chk.cpu_key(_cpuinfo("GenuineIntel", "avx2 avx512f avx512bw amx_tile amx_bf16")) == "intel/amx"
    assert chk.cpu_key(_cpuinfo("GenuineIntel", "avx2 avx512f avx512_bf16")) == "intel/avx512"
    assert chk.cpu_key(_cpuinfo("AuthenticAMD", "avx2 fma")) == "amd/avx2"
    assert chk.cpu_key(_cpuinfo("AuthenticAMD", "sse4_2")) == "amd/other"
    assert chk.cpu_key().split("/")[1] in ("amx", "avx512", "avx2", "other")  # this host


def _summary_on(chk, cpu: str) -> list[dict[str, str]]:
    """The committed demo summary with the EchoPPO rows replaced by those documented for ``cpu``."""
    summary = chk.parse_table((BASE / "summary.md").read_text())
    documented = chk.cpu_rows((BASE / "cpu_rows.md").read_text(), cpu)
    out = []
    for row in summary:
        key = tuple(row[k] for k in chk.KEY)
        out.append({**row, **{c: v for c, v in documented.get(key, {}).items() if v and c in row}})
    return out


def test_the_documented_avx512_rows_pass_on_avx512_and_fail_elsewhere(chk):
    readme = chk.readme_table((ROOT / "README.md").read_text())
    documented = chk.cpu_rows((BASE / "cpu_rows.md").read_text(), "intel/avx512")
    assert set(documented) == {(*ECHOPPO, "deterministic"), (*ECHOPPO, "stochastic")}
    assert documented[(*ECHOPPO, "deterministic")]["Success@1 [95% CI]"] == "0.85 [0.71, 0.93]"
    summary = _summary_on(chk, "intel/avx512")
    assert chk.compare(readme, summary, documented) == []
    drift = chk.compare(readme, summary, chk.cpu_rows((BASE / "cpu_rows.md").read_text(), "amd/avx2"))
    assert ("('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'deterministic') Success@1 [95% CI]: "
            "README '0.95 [0.83, 0.99]', summary '0.85 [0.71, 0.93]'") in drift
    # a row documented for this CPU is accepted only whole: one more difference is still reported
    summary[[tuple(r[k] for k in chk.KEY) for r in summary].index((*ECHOPPO, "stochastic"))]["return"] = "0.5"
    assert chk.compare(readme, summary, documented) == [
        "('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'stochastic') Success@1 [95% CI]: README "
        "'1.00 [0.91, 1.00]', summary '0.95 [0.83, 0.99]'",
        "('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'stochastic') Δ vs random [95% CI]: README "
        "'+0.50 [+0.35, +0.65] *', summary '+0.45 [+0.28, +0.62] *'",
        "('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'stochastic') McNemar p: README '1.9e-06', summary '4e-05'",
        "('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'stochastic') return: README '0.804', summary '0.5'",
        "('EchoRL/MiniGrid-Empty-Random-5x5-v0', 'echoppo', 'stochastic') steps: README '21.8', summary '29'",
    ]


def test_the_partly_recorded_amx_rows_constrain_their_filled_cells(chk):
    documented = chk.cpu_rows((BASE / "cpu_rows.md").read_text(), "intel/amx")
    readme = chk.readme_table((ROOT / "README.md").read_text())
    assert chk.compare(readme, _summary_on(chk, "intel/avx512"), documented) == []  # success cells agree
    assert chk.compare(readme, _summary_on(chk, "amd/avx2"), documented) == []  # README's own rows pass too


def test_every_documented_row_is_a_row_of_the_demo(chk):
    keys = {tuple(r[k] for k in chk.KEY) for r in chk.parse_table((BASE / "summary.md").read_text())}
    rows = chk.parse_table((BASE / "cpu_rows.md").read_text())
    assert rows and all(tuple(r[k] for k in chk.KEY) in keys for r in rows)
    assert all(r["cpu"].split("/")[1] in ("amx", "avx512", "avx2", "other") for r in rows)


def test_main_reports_the_documented_rows_it_used(chk, tmp_path, capsys):
    summary = _summary_on(chk, "intel/avx512")
    (tmp_path / "summary.md").write_text(chk.readme_markdown(summary).split("\n", 1)[1].rsplit("\n", 1)[0])
    assert chk.main(["--summary", str(tmp_path / "summary.md"), "--cpu", "intel/avx512"]) == 0
    assert "matches" in capsys.readouterr().out.splitlines()[-1]
    assert chk.main(["--summary", str(tmp_path / "summary.md"), "--cpu", "amd/avx2"]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS FROM" in out and "documents no rows for this CPU, amd/avx2" in out
