"""Loaders for the real WebShop data files (``setup.sh`` downloads them into ``data/``).

* ``items_shuffle_1000.json`` / ``items_shuffle.json``: a JSON list of scraped products (``asin``, ``name``,
  ``category``, ``query``, ``product_category``, ``full_description``, ``small_description``, ``pricing``,
  ``customization_options``, ...);
* ``items_ins_v2_1000.json`` / ``items_ins_v2.json``: ``{asin: {"attributes": [...], "instruction": ...,
  "instruction_attributes": [...]}}`` (hidden attributes and synthetic instructions);
* ``items_human_ins.json``: ``{asin: [{"instruction": ..., "instruction_attributes": [...],
  "instruction_options": [...]}, ...]}`` (the human instructions WebShop evaluates on);
* ``reviews.json`` (optional): ``[{"asin": ..., "average_rating": ..., "reviews": [...]}]``.

Processing follows ``engine.py::load_products`` and ``goal.py::get_human_goals`` / ``get_synthetic_goals``;
where upstream draws from the global ``random`` (range prices, price bounds) we draw from a seeded
``random.Random`` so that the goal list is the same in every process (cf. WebShop issue #44).
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import re
from collections import defaultdict
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from echorl_envs.webshop.catalogue import Catalogue, Goal, Product, Review, price_upper_bound
from echorl_envs.webshop.generator import GOAL_SHUFFLE_SEED

__all__ = ["load_webshop", "parse_pricing", "parse_product", "find_webshop_files"]

_PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
_ATTR_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
_HUMAN_FILE = "items_human_ins.json"
_REVIEW_FILE = "reviews.json"


def find_webshop_files(data_path: str | Path) -> dict[str, Path | None]:
    """Locate the WebShop files under ``data_path`` (a directory, or the products file itself).

    A ``*_1000`` products file pairs with the ``*_1000`` attributes file when both exist.
    """
    path = Path(data_path).expanduser()
    if not path.exists():
        raise ValueError(f"data_path does not exist: data_path={str(path)!r}; point it at WebShop's data/ folder")
    folder = path.parent if path.is_file() else path
    products = path if path.is_file() else next((folder / n for n in _PRODUCT_FILES if (folder / n).exists()), None)
    if products is None:
        raise ValueError(
            f"no products file in data_path={str(folder)!r}: expected one of {list(_PRODUCT_FILES)}"
        )
    attr_names = list(_ATTR_FILES)
    if "_1000" in products.name:
        attr_names.reverse()
    attrs = next((folder / n for n in attr_names if (folder / n).exists()), None)
    human = folder / _HUMAN_FILE
    reviews = folder / _REVIEW_FILE
    return {"products": products, "attributes": attrs, "human": human if human.exists() else None,
            "reviews": reviews if reviews.exists() else None}


def parse_pricing(pricing: Any) -> list[float]:
    """``"$12.99"`` -> [12.99]; ``"$12.99 - $15.99"`` -> [12.99, 15.99]; missing -> [100.0] (upstream)."""
    if isinstance(pricing, (int, float)):
        return [float(pricing)]
    if isinstance(pricing, list):
        vals = [float(v) for v in pricing if isinstance(v, (int, float))]
        return vals[:2] or [100.0]
    if not pricing:
        return [100.0]
    vals = []
    for part in str(pricing).split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            vals.append(float(Decimal(digits)))
        except InvalidOperation:
            continue
    return vals[:2] or [100.0]


def _options(raw: Any) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    for name, contents in (raw or {}).items():
        if not contents:
            continue
        values = []
        for c in contents:
            value = c.get("value", "") if isinstance(c, dict) else str(c)
            value = value.strip().replace("/", " | ").lower()
            if value and value not in values:
                values.append(value)
        if values:
            options[name.lower()] = values
    return options


def _reviews(raw: list[dict]) -> list[Review]:
    out = []
    for r in raw or []:
        score = r.get("score", r.get("stars", 0))
        try:
            score = float(score)
        except (TypeError, ValueError):
            score = 0.0
        out.append(Review(str(r.get("title", "")), score, str(r.get("body", r.get("review", "")))))
    return out


def parse_product(p: dict, attributes: dict | None = None, review: dict | None = None) -> Product:
    """One raw ``items_shuffle`` record -> :class:`Product` (as ``load_products`` cleans it)."""
    bullets = p.get("small_description") or []
    if not isinstance(bullets, list):
        bullets = [bullets]
    attrs = (attributes or {}).get("attributes") or ["DUMMY_ATTR"]
    return Product(
        asin=str(p["asin"]),
        title=str(p.get("name") or p.get("Title") or ""),
        category=str(p.get("category", "")),
        query=str(p.get("query", "")).lower().strip(),
        product_category=str(p.get("product_category", "")),
        description=str(p.get("full_description") or p.get("Description") or ""),
        bullet_points=[str(b) for b in bullets],
        attributes=[str(a) for a in attrs],
        options=_options(p.get("customization_options")),
        pricing=parse_pricing(p.get("pricing")),
        reviews=_reviews((review or {}).get("reviews", [])),
        rating=(review or {}).get("average_rating", "N.A."),
    )


def _read_json(path: Path | None) -> Any:
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _goal_from(product: Product, text: str, attrs: list[str], options: list[str], names: tuple[str, ...],
               upper: float) -> Goal:
    return Goal(
        asin=product.asin, instruction_text=text, attributes=tuple(attrs), goal_options=tuple(options),
        price_upper=upper, query=product.query, category=product.category,
        product_category=product.product_category, name=product.title, option_names=names,
    )


def _price_text(upper: float) -> str:
    return f", and price lower than {upper:.2f} dollars" if upper < 1_000_000 else ""


def _human_goals(products: list[Product], prices: dict[str, float], human: dict, rng: random.Random) -> list[Goal]:
    goals = []
    for product in products:
        for ins in human.get(product.asin, []):
            attrs = ins.get("instruction_attributes") or []
            if not attrs:
                continue  # upstream skips instructions without attributes
            upper = price_upper_bound(prices[product.asin], rng)
            opts = ins.get("instruction_options") or []
            opts = list(opts.values()) if isinstance(opts, dict) else list(opts)
            text = str(ins.get("instruction", "")).strip(".") + _price_text(upper)
            goals.append(_goal_from(product, text, attrs, [str(o) for o in opts], (), upper))
    return goals


def _synthetic_goals(products: list[Product], prices: dict[str, float], ins: dict, rng: random.Random) -> list[Goal]:
    goals = []
    counts: dict[str, int] = defaultdict(int)
    for product in products:
        entry = ins.get(product.asin) or {}
        text = entry.get("instruction")
        attrs = entry.get("instruction_attributes") or []
        if not text or not attrs:
            continue
        upper = price_upper_bound(prices[product.asin], rng)
        names = tuple(sorted(product.options))
        for combo in itertools.product(*(product.options[n] for n in names)):
            opt_text = ", and ".join(f"{n}: {v}" for n, v in zip(names, combo, strict=True))
            full = f"{text}{' with ' + opt_text if opt_text else ''}{_price_text(upper)}"
            goals.append(_goal_from(product, full, attrs, list(combo), names, upper))
        for a in attrs:
            counts[a] += 1
    # goal.py weights synthetic goals by inverse attribute frequency (used for weighted sampling upstream).
    return [
        Goal(**{**g.__dict__, "weight": sum(1.0 / counts[a] for a in g.attributes) / len(g.attributes)})
        for g in goals
    ]


@functools.lru_cache(maxsize=2)
def _load_cached(products_file: str, mtime: float, human_goals: bool, num_products: int | None,
                 seed: int) -> Catalogue:
    files = find_webshop_files(products_file)
    raw = _read_json(files["products"])
    if not isinstance(raw, list):
        raise ValueError(f"{files['products']} must hold a JSON list of products, got {type(raw).__name__}")
    if num_products is not None:
        raw = raw[:num_products]  # items_shuffle is already shuffled (upstream does the same)
    attrs = _read_json(files["attributes"]) or {}
    reviews = {r["asin"]: r for r in (_read_json(files["reviews"]) or []) if "asin" in r}
    products: list[Product] = []
    seen: set[str] = set()
    for p in raw:
        asin = str(p.get("asin", "nan"))
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        products.append(parse_product(p, attrs.get(asin), reviews.get(asin)))
    rng = random.Random(seed)
    prices = {
        p.asin: rng.uniform(p.pricing[0], p.pricing[1]) if len(p.pricing) > 1 else p.pricing[0] for p in products
    }
    if human_goals:
        if files["human"] is None:
            raise ValueError(
                f"human_goals=True needs {_HUMAN_FILE} next to {files['products'].name}; add it or pass "
                "human_goals=False to use the synthetic instructions of items_ins_v2"
            )
        goals = _human_goals(products, prices, _read_json(files["human"]), rng)
    else:
        goals = _synthetic_goals(products, prices, attrs, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalogue(products=products, prices=prices, goals=goals,
                     source=f"webshop({files['products']}, human_goals={human_goals})")


def load_webshop(data_path: str | Path, human_goals: bool = True, num_products: int | None = None,
                 seed: int = 0) -> Catalogue:
    """Load real WebShop files into a :class:`Catalogue` (cached per process by path, mtime and options).

    Args:
        data_path: WebShop's ``data/`` folder, or its ``items_shuffle*.json`` file.
        human_goals: use ``items_human_ins.json`` (WebShop's evaluation goals) rather than the synthetic
            goals of ``items_ins_v2``.
        num_products: keep only the first N products, as upstream's ``num_products``.
        seed: seed of the range-price and price-bound draws.
    """
    if num_products is not None and num_products < 1:
        raise ValueError(f"num_products must be >= 1 or None, got num_products={num_products}")
    files = find_webshop_files(data_path)
    products_file = files["products"].resolve()
    return _load_cached(str(products_file), products_file.stat().st_mtime, bool(human_goals), num_products, seed)
