"""Replay throughput: HotColdReplayBuffer vs TorchRL's PrioritizedReplayBuffer (C++ segment tree) and SB3's
uniform ReplayBuffer, measured side by side in one run.

    .venv/bin/python benchmarks/replay_throughput.py                # N = 10^6, batch 256
    .venv/bin/python benchmarks/replay_throughput.py --n 100000     # quicker

Scenarios (all single-env transitions with CartPole-sized observations unless --obs-dim is given):

* ``add``: transitions/s of ``add()`` while filling N transitions (ours: hot tier N/2 in RAM, cold tier N/2 in a
  numpy memmap, so the second half of the fill demotes a row to the memmap on every add).
* ``sample``: samples/s of ``sample(batch)`` on the full buffer (priorities already non-uniform).
* ``sample + update``: the prioritized-replay training pattern, sample then write back new priorities.
* ``train loop``: per iteration add 4 transitions, sample a batch, update priorities (DQN with train_freq=4): here
  tau_bar moves between samples, so our exact sampler pays rejections and re-anchors.

Each sampling scenario times the buffers alternately (``--rounds`` rounds of ``--iters / --rounds`` batches each),
so a change of machine load during the run hits every buffer alike and the ratios stay comparable.

TorchRL note: on this machine TorchRL 0.14.1's compiled extension was built against an older torch and fails to
load under torch 2.13 because two autograd symbols (used by its custom autograd ops, not by the segment trees) are
missing. With ``--torchrl-shim`` (default) the script compiles a tiny library defining those two symbols as aborting
stubs and loads it first, so TorchRL's real C++ ``SumSegmentTreeFp32``/``MinSegmentTreeFp32`` run unchanged.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from echorl_agent.replay import HotColdReplayBuffer  # noqa: E402

_MISSING_SYMBOLS = (
    "_ZN5torch8autograd13_wrap_outputsERKSt6vectorIN2at6TensorESaIS3_EERKSt13unordered_setIPN3c1010TensorImplESt4"
    "hashISB_ESt8equal_toISB_ESaISB_EESJ_NS9_8ArrayRefISt8optionalIS3_EEERKNS9_13intrusive_ptrINS0_4NodeENS9_6det"
    "ail34intrusive_target_default_null_typeISP_EEEERKSt8functionIFS5_S5_S5_EESJ_RKSW_IFS3_S3_EEbRST_",
    "_ZN5torch8autograd24fire_node_creation_hooksERKN3c1013intrusive_ptrINS0_4NodeENS1_6detail34intrusive_target"
    "_default_null_typeIS3_EEEE",
)


def load_torchrl(shim: bool):
    """Import TorchRL's PrioritizedReplayBuffer; returns (classes, note) or (None, reason)."""
    spec = importlib.util.find_spec("torchrl")
    if spec is None:
        return None, "torchrl not installed (pip install 'echorl[bench]')"
    folder = Path(spec.submodule_search_locations[0])
    ext = next(folder.glob("_torchrl*.so"), None)
    note = "TorchRL C++ extension loaded as is"
    if ext is not None:
        try:
            ctypes.CDLL(str(ext))
        except OSError as e:
            if "undefined symbol" not in str(e) or not shim:
                return None, f"TorchRL C++ extension does not load: {e}"
            tmp = Path(tempfile.mkdtemp(prefix="echorl-trl-shim-"))
            src = tmp / "shim.c"
            src.write_text("#include <stdlib.h>\n" + "".join(
                f'void stub{i}(void) __asm__("{s}");\nvoid stub{i}(void) {{ abort(); }}\n'
                for i, s in enumerate(_MISSING_SYMBOLS)))
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp / "libshim.so"), str(src)], check=True)
            ctypes.CDLL(str(tmp / "libshim.so"), mode=ctypes.RTLD_GLOBAL)
            shutil.rmtree(tmp, ignore_errors=True)  # the mapped library stays loaded
            note = "TorchRL C++ extension loaded with 2 aborting autograd-symbol stubs (ABI mismatch torch 2.13)"
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    return (PrioritizedReplayBuffer, LazyTensorStorage, TensorDict), note


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="transitions stored (default 10^6)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--obs-dim", type=int, default=4)
    ap.add_argument("--iters", type=int, default=300, help="timed batches per sampling scenario")
    ap.add_argument("--rounds", type=int, default=10, help="alternating rounds the timed batches are split into")
    ap.add_argument("--no-torchrl-shim", dest="shim", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n, bs, d = args.n, args.batch, args.obs_dim
    rng = np.random.default_rng(args.seed)
    obs = rng.normal(size=(n, d)).astype(np.float32)
    next_obs = rng.normal(size=(n, d)).astype(np.float32)
    actions = rng.integers(0, 2, size=n)
    rewards = rng.normal(size=n).astype(np.float32)
    dones = (rng.random(n) < 0.02).astype(np.float32)
    obs_space = spaces.Box(-np.inf, np.inf, (d,), np.float32)
    act_space = spaces.Discrete(2)
    infos = [{}]
    rows: dict[str, dict[str, float]] = {}

    def fill(buf) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            buf.add(obs[i : i + 1], next_obs[i : i + 1], actions[i : i + 1], rewards[i : i + 1], dones[i : i + 1], infos)
        return rate(n, time.perf_counter() - t0)

    # ---------------------------------------------------------------- SB3 uniform
    sb3 = ReplayBuffer(n, obs_space, act_space, device="cpu")
    rows["SB3 ReplayBuffer (uniform)"] = {"add": fill(sb3)}
    # ---------------------------------------------------------------- ours
    # cold_dir=None: a private temporary folder for the memmaps, deleted by close()
    ours = HotColdReplayBuffer(n // 2, obs_space, act_space, device="cpu", cold_size=n - n // 2,
                               plan_source="observation", seed=args.seed)
    rows["HotColdReplayBuffer (ours)"] = {"add": fill(ours)}
    t0 = time.perf_counter()
    ours.sample(bs)  # first sample folds the N deferred leaf updates into the tree (one O(N d) pass)
    first_sample = time.perf_counter() - t0
    ours.update_priorities(np.arange(n), np.abs(rng.normal(size=n)))
    # ---------------------------------------------------------------- TorchRL PER
    trl, note = load_torchrl(args.shim)
    per = None
    if trl is not None:
        PrioritizedReplayBuffer, LazyTensorStorage, TensorDict = trl
        per = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(n), batch_size=bs)
        chunk = 100_000
        t0 = time.perf_counter()
        for s in range(0, n, chunk):
            sl = slice(s, min(n, s + chunk))
            per.extend(TensorDict({
                "obs": torch.from_numpy(obs[sl]), "next_obs": torch.from_numpy(next_obs[sl]),
                "action": torch.from_numpy(actions[sl]).view(-1, 1), "reward": torch.from_numpy(rewards[sl]).view(-1, 1),
                "done": torch.from_numpy(dones[sl]).view(-1, 1)}, batch_size=[sl.stop - sl.start]))
        rows["TorchRL PrioritizedReplayBuffer"] = {"add": float("nan"), "extend_bulk": rate(n, time.perf_counter() - t0)}
        per.update_priority(torch.arange(n), torch.from_numpy(np.abs(rng.normal(size=n))).float())

    # ---------------------------------------------------------------- sampling scenarios
    def alternate(fns: dict[str, object]) -> dict[str, float]:
        """samples/s of each fn, timed in ``args.rounds`` alternating rounds so machine-load drift hits all alike."""
        for fn in fns.values():
            fn()  # warm-up
        spent = dict.fromkeys(fns, 0.0)
        per_round = max(1, args.iters // args.rounds)
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(per_round):
                    fn()
                spent[name] += time.perf_counter() - t0
        return {name: rate(args.rounds * per_round * bs, t) for name, t in spent.items()}

    def ours_update():
        s = ours.sample(bs)
        ours.update_priorities(s.indices, torch.rand(bs))

    sample_fns = {"SB3 ReplayBuffer (uniform)": lambda: sb3.sample(bs), "HotColdReplayBuffer (ours)": lambda: ours.sample(bs)}
    update_fns = {"HotColdReplayBuffer (ours)": ours_update}
    if per is not None:
        def per_update():
            _, info = per.sample(return_info=True)
            per.update_priority(info["index"], torch.rand(bs))

        sample_fns["TorchRL PrioritizedReplayBuffer"] = lambda: per.sample(return_info=True)  # data + IS weights + indices
        update_fns["TorchRL PrioritizedReplayBuffer"] = per_update
    for name, r in alternate(sample_fns).items():
        rows[name]["sample"] = r
    for name, r in alternate(update_fns).items():
        rows[name]["sample+update"] = r

    # ---------------------------------------------------------------- train loop: add 4, sample, update
    k = [0]

    def next4():
        i = k[0] % (n - 4)
        k[0] += 4
        return slice(i, i + 4)

    def sb3_train():
        sl = next4()
        for j in range(sl.start, sl.stop):
            sb3.add(obs[j : j + 1], next_obs[j : j + 1], actions[j : j + 1], rewards[j : j + 1], dones[j : j + 1], infos)
        sb3.sample(bs)

    def ours_train():
        sl = next4()
        for j in range(sl.start, sl.stop):
            ours.add(obs[j : j + 1], next_obs[j : j + 1], actions[j : j + 1], rewards[j : j + 1], dones[j : j + 1], infos)
        ours_update()

    train_fns = {"SB3 ReplayBuffer (uniform)": sb3_train, "HotColdReplayBuffer (ours)": ours_train}
    if per is not None:
        def per_train():
            sl = next4()
            for j in range(sl.start, sl.stop):
                per.add(TensorDict({
                    "obs": torch.from_numpy(obs[j]), "next_obs": torch.from_numpy(next_obs[j]),
                    "action": torch.tensor([actions[j]]), "reward": torch.tensor([rewards[j]]),
                    "done": torch.tensor([dones[j]])}, batch_size=[]))
            per_update()

        train_fns["TorchRL PrioritizedReplayBuffer"] = per_train
    refresh0, cand0, acc0 = ours.stats["refreshes"], ours.stats["candidates"], ours.stats["accepted"]
    for name, r in alternate(train_fns).items():
        rows[name]["train loop"] = r
    refreshes = ours.stats["refreshes"] - refresh0
    acceptance = (ours.stats["accepted"] - acc0) / max(1, ours.stats["candidates"] - cand0)
    # Same loop with a 10x slower EMA of plans (tau_bar drifts less between batches -> fewer rejections/re-anchors)
    ours.tracker.decay = 1e-3
    refresh1 = ours.stats["refreshes"]
    rows["HotColdReplayBuffer (ours, ema_decay=1e-3)"] = {"train loop": alternate({"x": ours_train})["x"]}
    refreshes_slow = ours.stats["refreshes"] - refresh1

    # ---------------------------------------------------------------- report
    cols = ["add", "sample", "sample+update", "train loop"]
    table = [[name] + [f"{r.get(c, float('nan')):,.0f}" for c in cols] for name, r in rows.items()]
    print(f"N = {n:,} transitions (ours: {n // 2:,} hot in RAM + {n - n // 2:,} cold in memmap), batch {bs}, "
          f"obs dim {d}, {args.iters} timed batches per buffer in {args.rounds} alternating rounds; units: "
          f"transitions/s (add) or samples/s; sum-tree kernel: {'C' if ours.tree._lib() is not None else 'numpy'}")
    print(tabulate(table, headers=["buffer"] + cols, tablefmt="github"))
    o = rows["HotColdReplayBuffer (ours)"]
    s = rows["SB3 ReplayBuffer (uniform)"]
    o2 = rows["HotColdReplayBuffer (ours, ema_decay=1e-3)"]
    ratios = [["ours / SB3 uniform", f"{o['add'] / s['add']:.2f}", f"{o['sample'] / s['sample']:.2f}", "-",
               f"{o['train loop'] / s['train loop']:.2f}"]]
    if per is not None:
        t = rows["TorchRL PrioritizedReplayBuffer"]
        ratios.append(["ours / TorchRL PER", "-", f"{o['sample'] / t['sample']:.2f}",
                       f"{o['sample+update'] / t['sample+update']:.2f}", f"{o['train loop'] / t['train loop']:.2f}"])
        ratios.append(["ours (ema_decay=1e-3) / TorchRL PER", "-", "-", "-",
                       f"{o2['train loop'] / t['train loop']:.2f}"])
    print()
    print(tabulate(ratios, headers=["ratio"] + cols, tablefmt="github"))
    print(f"\nours: first sample after the fill (folds {n:,} deferred leaves) {first_sample * 1e3:.0f} ms; "
          f"train loop: {refreshes} re-anchors in {args.iters + 1} batches, candidate acceptance {acceptance:.3f}; "
          f"with ema_decay=1e-3: {refreshes_slow} re-anchors")
    if per is not None:
        print(f"TorchRL bulk extend (not comparable to per-transition add): {rows['TorchRL PrioritizedReplayBuffer']['extend_bulk']:,.0f} transitions/s")
    print(f"torchrl: {note}")
    ours.close()


if __name__ == "__main__":
    main()
