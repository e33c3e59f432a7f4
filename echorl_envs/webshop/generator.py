"""A deterministic WebShop-style catalogue and instruction set, so the environment works offline.

Products follow the shape of WebShop's scraped items (title, breadcrumb, description, bullet points, hidden
attributes, customisation options, a price or price range, reviews); goals follow ``goal.py``'s synthetic
goals: one option value per option name, 1-3 of the product's attributes, and a price bound drawn from the
round prices just above the product's price. Everything comes from ``random.Random(seed)``, so the same
config always yields the same catalogue, in any process.
"""

from __future__ import annotations

import functools
import random
import string
from dataclasses import dataclass

from echorl_envs.webshop import _vocab as V
from echorl_envs.webshop.catalogue import Catalogue, Goal, Product, Review, price_upper_bound

__all__ = ["GeneratorConfig", "generate_catalogue"]

#: Seed of the goal shuffle (``SimServer`` shuffles goals after ``random.seed(233)``).
GOAL_SHUFFLE_SEED = 233


@dataclass(frozen=True)
class GeneratorConfig:
    """Size and seed of the generated catalogue."""

    #: number of products (one instruction is written for each)
    num_products: int = 1500
    #: seed of every random choice (brands, attributes, options, prices, goals)
    seed: int = 0
    #: fraction of products priced as a range ("$12.0 to $15.0"), as some WebShop items are
    range_price_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.num_products < len(V.TYPES):
            raise ValueError(
                f"num_products must be >= {len(V.TYPES)} (one per product type), got num_products="
                f"{self.num_products}; raise it or use the default 1500"
            )
        if not 0.0 <= self.range_price_fraction <= 1.0:
            raise ValueError(
                f"range_price_fraction must be in [0, 1], got range_price_fraction={self.range_price_fraction}"
            )


def _asin(rng: random.Random, taken: set[str]) -> str:
    alphabet = string.ascii_uppercase + string.digits
    while True:
        asin = "B0" + "".join(rng.choices(alphabet, k=8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _join_attrs(attrs: list[str]) -> str:
    return attrs[0] if len(attrs) == 1 else ", ".join(attrs[:-1]) + " and " + attrs[-1]


def _make_product(rng: random.Random, spec: dict, taken: set[str], titles: set[str],
                  range_fraction: float) -> Product:
    brand = rng.choice(V.BRANDS[spec["category"]])
    noun = rng.choice(spec["nouns"])
    attrs = rng.sample(spec["attrs"], rng.randint(3, 5))
    extra = rng.choice(spec["extras"])
    title = f"{brand} {attrs[0].title()} {noun} {extra}"
    n = 2
    base_title = title
    while title in titles:
        title = f"{base_title}, Edition {n}"
        n += 1
    titles.add(title)

    options: dict[str, list[str]] = {}
    for name, pool, lo, hi in spec["options"]:
        k = rng.randint(lo, min(hi, len(pool)))
        chosen = set(rng.sample(pool, k))
        options[name] = [v for v in pool if v in chosen]

    lo, hi = spec["price"]
    base = round(rng.uniform(lo, hi), 2)
    pricing = [base]
    if rng.random() < range_fraction:
        pricing = [base, round(base * rng.uniform(1.1, 1.5), 2)]

    fill = {"brand": brand, "noun": noun.lower()}
    sentences = [rng.choice(V.DESC_OPENERS).format(**fill)]
    for a in attrs[:2]:
        sentences.append(rng.choice(V.DESC_ATTR).format(attr=a))
    bullets = [rng.choice(V.BULLET).format(Attr=a.capitalize()) for a in rng.sample(attrs, len(attrs))]
    reviews = [
        Review(rng.choice(V.REVIEW_TITLES), float(rng.randint(2, 5)), rng.choice(V.REVIEW_BODIES))
        for _ in range(rng.randint(0, 3))
    ]
    rating: float | str = round(sum(r.score for r in reviews) / len(reviews), 1) if reviews else "N.A."
    return Product(
        asin=_asin(rng, taken), title=title, category=spec["category"], query=spec["query"],
        product_category=V.SEP.join(spec["path"]), description=" ".join(sentences), bullet_points=bullets,
        attributes=attrs, options=options, pricing=pricing, reviews=reviews, rating=rating,
    )


def _make_goal(rng: random.Random, product: Product, price: float) -> Goal:
    attrs = rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes))))
    names = sorted(product.options)
    values = [rng.choice(product.options[n]) for n in names]
    text = rng.choice(V.INSTRUCTIONS).format(attrs=_join_attrs(attrs), noun=product.query)
    if names:
        text += " with " + ", and ".join(f"{n}: {v}" for n, v in zip(names, values, strict=True))
    upper = price_upper_bound(price, rng)
    if upper < 1_000_000:
        text += f", and price lower than {upper:.2f} dollars"
    return Goal(
        asin=product.asin, instruction_text=text, attributes=tuple(attrs), goal_options=tuple(values),
        price_upper=upper, query=product.query, category=product.category,
        product_category=product.product_category, name=product.title, option_names=tuple(names),
    )


@functools.lru_cache(maxsize=4)
def generate_catalogue(config: GeneratorConfig = GeneratorConfig()) -> Catalogue:
    """Build (once per process and config) the generated catalogue: products, prices and shuffled goals."""
    rng = random.Random(config.seed)
    taken: set[str] = set()
    titles: set[str] = set()
    products = [
        _make_product(rng, V.TYPES[i % len(V.TYPES)], taken, titles, config.range_price_fraction)
        for i in range(config.num_products)
    ]
    rng.shuffle(products)
    # A range-priced item's price is drawn once, uniformly in its range (``generate_product_prices``).
    prices = {
        p.asin: round(rng.uniform(p.pricing[0], p.pricing[1]), 2) if len(p.pricing) > 1 else p.pricing[0]
        for p in products
    }
    goals = [_make_goal(rng, p, prices[p.asin]) for p in products]
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalogue(products=products, prices=prices, goals=goals, source=f"generated(seed={config.seed})")
