"""WebShop: find and buy a product in a text web shop (princeton-nlp/WebShop's text mode, reimplemented).

Modules: :mod:`catalogue` (data model), :mod:`generator` (offline catalogue), :mod:`loader` (real WebShop
files), :mod:`search` (bm25s), :mod:`pages` (text pages), :mod:`reward` (``get_reward``), :mod:`env`.
"""

from __future__ import annotations

from echorl_envs.webshop.catalogue import Catalogue, Goal, Product, Review
from echorl_envs.webshop.env import WebShopEnv, load_catalogue
from echorl_envs.webshop.generator import GeneratorConfig, generate_catalogue
from echorl_envs.webshop.loader import load_webshop
from echorl_envs.webshop.reward import RewardInfo, get_reward, normalize_color
from echorl_envs.webshop.search import ProductSearch

__all__ = [
    "Catalogue",
    "GeneratorConfig",
    "Goal",
    "Product",
    "ProductSearch",
    "Review",
    "RewardInfo",
    "WebShopEnv",
    "generate_catalogue",
    "get_reward",
    "load_catalogue",
    "load_webshop",
    "normalize_color",
]
