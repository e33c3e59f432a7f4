"""Figure for the README: EchoRL's parts on the LM (issue 26) -- the rolling training success of BC + GiGPO, + plan,
+ replay and BC + EchoRL (both) vs env steps, mean and 95% CI over seeds, on BabyAI-GoToLocal
(docs/studies/echorl-claim-lm-gotolocal.md) and on ALFWorld-PickAndPlace (docs/studies/echorl-claim-lm-alfworld.md),
one panel each, with the target success that the steps-to-target ratios are counted at, and the held-out evaluation
of each method (both modes; on GoToLocal also of BC) as points with CIs over seeds. The number of seeds each method
has is in the legend.

Run: ``python benchmarks/plot_echorl_claim.py`` (reads the committed results, writes
``docs/figures/echorl_claim_lm.png``); the ratios themselves come from ``python benchmarks/llm_rl_learning.py
--summary --out benchmarks/results/llm_rl_gotolocal_s950 --target 0.5 --target-reference bc+gigpo`` and ``...
--out benchmarks/results/llm_rl_alfworld_s1040 --target 0.3 --target-reference bc+gigpo``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plot_reward_teaches_lm import ROOT, group_rl_panel, save_figure  # noqa: E402

METHODS = ("bc+gigpo", "bc+gigpo+plan", "bc+gigpo+replay", "bc+echorl")


def target_line(ax, target: float) -> None:
    ax.axhline(target, color="k", lw=0.7, ls="--")
    ax.text(ax.get_xlim()[0], target, f" target {target:g} (rolling success over the last 20 episodes)",
            fontsize=7, va="bottom")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "benchmarks/results/llm_rl_gotolocal_s950"))
    ap.add_argument("--target", type=float, default=0.5,
                    help="the GoToLocal claim study's registered target training success")
    ap.add_argument("--alfworld-results", default=str(ROOT / "benchmarks/results/llm_rl_alfworld_s1040"),
                    help="the ALFWorld claim study's folder; its panel is left out when the folder does not exist")
    ap.add_argument("--alfworld-target", type=float, default=0.3,
                    help="the ALFWorld claim study's registered target training success")
    ap.add_argument("--out", default=str(ROOT / "docs/figures/echorl_claim_lm.png"))
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alfworld = Path(args.alfworld_results)
    panels = 2 if alfworld.is_dir() else 1
    fig, axes = plt.subplots(1, panels, figsize=(9 * panels, 5.2), squeeze=False)
    group_rl_panel(axes[0, 0], Path(args.results), "BabyAI-GoToLocal, 24-step budget, BC on 2 demos, then (§8)",
                   trained=METHODS, starts=("bc",))
    target_line(axes[0, 0], args.target)
    if panels == 2:
        group_rl_panel(axes[0, 1], alfworld, "ALFWorld-PickAndPlace, 30-step budget, BC on 8 demos, then (§15)",
                       trained=METHODS, starts=(), colors={m: f"C{i + 1}" for i, m in enumerate(METHODS)})
        target_line(axes[0, 1], args.alfworld_target)
    save_figure(fig, "EchoRL's parts on the LM (SmolLM2-135M, LoRA r=8 top 2 layers, CPU): mean and 95% CI over seeds",
                args.out)


if __name__ == "__main__":
    main()
