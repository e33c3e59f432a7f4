"""Cost of one weight push to ``echorl serve``: the size of the LLM-RL adapter, its save, and the server's load.

The adapter is the default of ``LLMPolicyConfig`` (LoRA r=8 on every linear layer of the top 2 decoder layers of
SmolLM2-135M-Instruct). The load is :meth:`echorl_agent.llm.serving.lora.ServedModels.load`, what
``POST /v1/load_lora_adapter`` runs (merge into a copy of the model + a new engine); the first load adds the adapter,
the later ones replace it, as every push after the first does. No HTTP: the request itself is a few hundred bytes.

Run: ``python benchmarks/adapter_push.py --pushes 3`` (figures in docs/scaling.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=3, help="pushes timed one after the other")
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank")
    ap.add_argument("--layers", type=int, default=2, help="top decoder layers that carry the adapter")
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model

    from echorl_agent.llm import EngineConfig, LLMEngine, load_model
    from echorl_agent.llm.engine.prefix_cache import PrefixCacheConfig
    from echorl_agent.llm.serving.lora import ServedModels
    from echorl_agent.llm_rl.config import LORA_TARGETS

    torch.set_num_threads(1)
    llm = load_model("smollm2-135m")
    n = llm.model.config.num_hidden_layers
    peft_model = get_peft_model(load_model("smollm2-135m").model, LoraConfig(
        r=args.rank, lora_alpha=2 * args.rank, target_modules=list(LORA_TARGETS),
        layers_to_transform=list(range(n - args.layers, n))))
    base = LLMEngine(llm, EngineConfig(prefix_cache=PrefixCacheConfig(max_tokens=4096))).start()
    served = ServedModels(base, "smollm2-135m")
    folder = Path(tempfile.mkdtemp(prefix="echorl-push-"))
    try:
        for v in range(1, args.pushes + 1):
            t0 = time.perf_counter()
            peft_model.save_pretrained(str(folder / f"v{v}"))
            save_s = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in (folder / f"v{v}").iterdir())
            t0 = time.perf_counter()
            served.load("policy", str(folder / f"v{v}"))
            load_s = time.perf_counter() - t0
            print(f"push {v}: adapter {size:,} bytes, save {save_s:.2f} s, echorl serve load {load_s:.2f} s")
        print(f"load average {os.getloadavg()[0]:.1f}")
    finally:
        served.close()
        base.stop()


if __name__ == "__main__":
    main()
