"""WebShop's purchase reward (``web_agent_site/engine/goal.py::get_reward``), with rapidfuzz.

    R = (matched attributes + matched options + r_price) / (|goal attributes| + |goal options| + 1) * r_type

* attributes: a goal attribute matches when ``token_set_ratio`` with one of the product's attributes is
  > 85, or when it appears verbatim in the title, bullet points or description;
* options: every *purchased* option value (colour-normalised) matches when it equals a goal option (size
  options) or has ``token_set_ratio`` > 85 with one (other options), or appears in the product text;
* r_price: 1 when the price is at most the goal's bound;
* r_type: 1 / 0.5 / 0.1 / 0 from query, category and title-noun overlap (``get_type_reward``).

Deviations from upstream, all documented where they happen: title nouns are content words (upstream uses
spaCy's noun tagger, which we do not ship); matched options are capped at the number of goal options so that
R stays in [0, 1] (upstream can exceed 1 when extra purchased options match the title); a goal without a price
bound (``price_upper <= 0``) counts the price as matched (upstream crashes on ``None``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from bm25s.stopwords import STOPWORDS_EN
from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from echorl_envs.webshop.catalogue import Goal, Product

__all__ = ["COLOR_SET", "EXACT_MATCH_OPTS", "RewardInfo", "get_reward", "normalize_color", "type_reward",
           "attribute_reward", "option_reward", "fuzzy_match"]

#: Option names matched exactly rather than fuzzily (``goal.py::EXACT_MATCH_OPTS``).
EXACT_MATCH_OPTS = ("size",)

#: Base colours, in upstream order (``engine/normalize.py::COLOR_SET``): the first one contained in an option
#: value replaces it ("navy blue" -> "blue", "black forest" -> "black").
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
    "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
    "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
    "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
    "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

#: Fuzzy threshold of every match in ``goal.py`` (strictly greater than).
FUZZY_THRESHOLD = 85

_WORD = re.compile(r"[a-z][a-z0-9'-]*")
_STOP = frozenset(STOPWORDS_EN) | {"with"}


def normalize_color(value: str) -> str:
    """The first base colour contained in ``value``, else ``value`` (``normalize.py::normalize_color``)."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def fuzzy_match(a: str, b: str) -> bool:
    """``fuzz.token_set_ratio(a, b) > 85`` with thefuzz's default preprocessing (lower case, alphanumerics)."""
    return fuzz.token_set_ratio(a, b, processor=default_process) > FUZZY_THRESHOLD


def _title_nouns(name: str) -> list[str]:
    # Upstream keeps spaCy NOUN/PROPN tokens; we keep content words (no stop words), a close, dependency-free
    # stand-in that is exact for our generated titles' type nouns and brands.
    return [w for w in _WORD.findall(name.lower()) if w not in _STOP]


def type_reward(product: Product, goal: Goal) -> dict[str, Any]:
    """``get_type_reward``: 1 if query or category (>= 2 shared breadcrumb levels) or title (> 0.2) match,
    0.5 otherwise, 0.1 when the title overlap is < 0.1, 0 when it is 0."""
    query_match = product.query == goal.query
    p_cat = {x.strip() for x in product.product_category.split("\u203a")}
    g_cat = {x.strip() for x in goal.product_category.split("\u203a")}
    category_match = len(p_cat & g_cat) >= 2
    desired = _title_nouns(goal.name)
    purchased = set(_title_nouns(product.name))
    title_score = 0.2 if not desired else len(purchased & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def _in_text(needle: str, product: Product) -> bool:
    return (
        needle in product.title.lower()
        or needle in " ".join(product.bullet_points).lower()
        or needle in product.description.lower()
    )


def attribute_reward(product: Product, goal: Goal) -> tuple[float, int]:
    """``get_attribute_reward``: (fraction, count) of goal attributes found in the product."""
    matches = 0
    for g_attr in goal.attributes:
        if any(fuzzy_match(p_attr, g_attr) for p_attr in product.attributes) or _in_text(g_attr, product):
            matches += 1
    return (matches / len(goal.attributes) if goal.attributes else 0.0), matches


def option_reward(product: Product, goal_options: tuple[str, ...] | list[str],
                  purchased: dict[str, str]) -> tuple[float | None, int]:
    """``get_option_reward``: (fraction or None without goal options, count) of purchased options matching."""
    goals = [normalize_color(o) for o in goal_options]
    matches = 0
    for name, value in purchased.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTS:
            matched = value in goals
        else:
            matched = any(fuzzy_match(g, value) for g in goals)
        if matched or _in_text(value, product):
            matches += 1
    # Deviation: upstream does not cap, so extra matching options could push R above 1.
    matches = min(matches, len(goals))
    return (matches / len(goals) if goals else None), matches


@dataclass(frozen=True)
class RewardInfo:
    """The reward and its components, as ``get_reward(..., verbose=True)`` reports them."""

    reward: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool
    query_match: bool
    category_match: bool
    title_score: float
    w_att: float
    w_option: float
    w_price: float

    def as_info(self) -> dict[str, Any]:
        return asdict(self)


def get_reward(product: Product, goal: Goal, price: float, options: dict[str, str]) -> RewardInfo:
    """Reward of buying ``product`` at ``price`` with the chosen ``options`` (name -> value) for ``goal``."""
    t = type_reward(product, goal)
    r_price = bool(price <= goal.price_upper) if goal.price_upper > 0 else True
    r_att, n_att = attribute_reward(product, goal)
    r_option, n_opt = option_reward(product, goal.goal_options, options)
    denom = len(goal.attributes) + len(goal.goal_options) + 1
    reward = (n_att + n_opt + float(r_price)) / denom * t["r_type"]
    return RewardInfo(
        reward=float(reward), r_type=t["r_type"], r_att=r_att, r_option=r_option, r_price=r_price,
        query_match=t["query_match"], category_match=t["category_match"], title_score=t["title_score"],
        w_att=len(goal.attributes) / denom, w_option=len(goal.goal_options) / denom, w_price=1 / denom,
    )
