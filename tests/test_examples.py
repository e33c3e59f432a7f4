"""Every example in examples/ runs as its docstring says and prints a result that shows what it is named after.

Each example runs with its documented default command (``--out`` pointed at a temporary folder); the checks parse
the printed numbers and assert on the demonstration itself (the compared methods differ the way the example says,
curves rise), not only that the script exits 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _num(pattern: str, text: str, group: int = 1) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in output:\n{text}"
    return float(m.group(group))


def check_train_echo_rl(out: str, tmp: Path) -> None:
    rows = {m[0]: (int(m[1]), float(m[2]), float(m[3])) for m in
            re.findall(r"^(PPO|EchoPPO)\s+(\d+)\s+[\d.]+\s+\d+\s+([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {"PPO", "EchoPPO"}, out
    for algo, (steps, train_sr, eval_sr) in rows.items():
        assert steps == 8192 and train_sr >= 0.5, f"{algo} did not learn: {out}"
        # a large greedy/sampled gap is explained in a note naming the algorithm, and only then
        assert (f"note: {algo}'s greedy policy" in out) == (train_sr - eval_sr >= 0.5), out


def check_benchmark(out: str, tmp: Path) -> None:
    assert re.search(r"\| EchoRL/MiniGrid-Empty-5x5-v0 \| expert\s+\| -\s+\| 100\s+\| 3\s+\| 1\.00 \[", out), out
    assert re.search(r"\| EchoRL/Game24-v0\s+\| expert\s+\| -\s+\| 10\s+\| 3\s+\| 1\.00 \[", out), out
    assert "Δ vs random [95% CI]" in out and out.count("(reference)") == 2, out
    assert re.search(r"\| ppo\s+\| deterministic .*\n.*\| ppo\s+\| stochastic", out), out
    wrote = out.strip().splitlines()[-1]
    assert wrote.startswith("24 episodes; wrote "), wrote
    for name in ("episodes.jsonl", "run.json", "summary.md", "summary.csv", "summary.json"):
        assert str(tmp / name) in wrote and (tmp / name).exists(), (name, wrote)


def check_latent_planning(out: str, tmp: Path) -> None:
    assert "latent_dim=16" in out and re.search(r"episode: (won|not won) in \d+ steps", out), out
    with_plan = _num(r"with the plan mu_t\s+success ([\d.]+)", out)
    zero_plan = _num(r"with mu_t set to zero\s+success ([\d.]+)", out)
    changed, total = (int(_num(r"(\d+) of (\d+) actions", out, g)) for g in (1, 2))
    assert with_plan > zero_plan and 0 < changed <= total, out  # the trained policy acts on its plan
    assert _num(r"trained ([\d.]+), untrained", out) > _num(r"untrained ([\d.]+)", out), out


def check_prioritized_replay(out: str, tmp: Path) -> None:
    assert re.search(r"DQN \(uniform\)\s+[\d.]+ s\s+greedy success [\d.]+", out), out
    assert re.search(r"EchoDQN \(hot/cold\)\s+[\d.]+ s\s+greedy success [\d.]+", out), out
    assert "hot/cold buffer: 6000 transitions stored" in out, out
    uniform = _num(r"rewarded transitions: ([\d.]+)% of the uniform buffer", out)
    prioritized = _num(r"; ([\d.]+)% of a prioritized batch", out)
    assert prioritized > uniform > 0, out  # prioritized sampling favours rewarded transitions


def check_async(out: str, tmp: Path) -> None:
    one, two = _num(r"1 worker ([\d.]+) steps/s", out), _num(r"2 workers ([\d.]+) steps/s", out)
    assert ("2 workers gain little here" in out) == (two / one < 1.5), out
    conc_steps = _num(r"concurrent [\d.]+ s \((\d+) engine steps", out)
    seq_steps = _num(r"sequential [\d.]+ s \((\d+) engine steps", out)
    assert conc_steps < seq_steps, out  # concurrent actors are decoded together in batches
    assert _num(r"sequential / concurrent = ([\d.]+)", out) > 0


def check_bandwidth(out: str, tmp: Path) -> None:
    saved_on = _num(r"cache on\s+[\d.]+\s+5\s+[\d.]+\s+([\d.]+)%", out)
    saved_off = _num(r"cache off\s+[\d.]+\s+5\s+[\d.]+\s+([\d.]+)%", out)
    assert saved_on > saved_off, out  # the prefix cache saves attention bandwidth across steps
    assert "same actions in both runs: True" in out, out
    returns = [float(r) for r in re.findall(r"cache o(?:n|ff)\s+(?:\S+\s+){5}([\d.]+)\s", out)]
    assert len(returns) == 2 and ("no episode was won" in out) == (max(returns) == 0), out


def check_train_sb3(out: str, tmp: Path) -> None:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if re.match(r"\| \S+\s+\| \d+\s+\|", line)]
    rates = {r[0]: [float(x) for x in r[2:]] for r in rows}
    assert all(len(r) == 4 for r in rates.values()), out
    assert set(rates) == {"PPO", "MaskablePPO", "DQN", "EchoPPO"}, out
    for algo in ("PPO", "MaskablePPO", "EchoPPO"):  # their curves rise
        assert rates[algo][-1] >= 0.8 and rates[algo][-1] > rates[algo][0], (algo, out)
    for algo, r in rates.items():
        assert (f"note: {algo} peaked" in out) == (max(r) - r[-1] > 0.3), out
    folder = tmp / "EchoRL_MiniGrid-Empty-5x5-v0"
    assert f"wrote {folder / 'learning_curves.png'}" in out, out
    for name in ("learning_curves.png", "summary.csv", "PPO.csv", "EchoPPO.zip"):
        assert (folder / name).exists(), name


#: (script, args beyond its defaults, check of its output)
EXAMPLES = [
    ("train_echo_rl.py", [], check_train_echo_rl),
    ("benchmark_echo_rl.py", ["--out", "{tmp}"], check_benchmark),
    ("latent_planning_demo.py", [], check_latent_planning),
    ("prioritized_replay_demo.py", [], check_prioritized_replay),
    ("async_execution_demo.py", [], check_async),
    ("bandwidth_efficient_demo.py", [], check_bandwidth),
    ("train_sb3.py", ["--out", "{tmp}"], check_train_sb3),
]


@pytest.mark.slow
@pytest.mark.parametrize("script,args,check", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_prints_what_it_demonstrates(script, args, check, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(proc.stdout, tmp_path)


def test_every_example_is_covered_and_states_its_time():
    scripts = {p.name for p in (ROOT / "examples").glob("*.py")}
    covered = {e[0] for e in EXAMPLES}
    assert scripts <= covered, f"examples without a test: {sorted(scripts - covered)}"
    for name in scripts:  # the docstring's first usage line says how long the default run takes
        text = (ROOT / "examples" / name).read_text()
        assert re.search(r"examples/" + re.escape(name) + r"\s+# ~[\d-]+ (s|min) on 2 CPU cores", text), name
