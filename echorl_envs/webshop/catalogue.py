"""WebShop's data model: products, goals (instructions) and the catalogue that holds both.

Field names follow the dictionaries of ``web_agent_site/engine/engine.py::load_products`` and
``goal.py::get_human_goals`` (``Title``/``BulletPoints``/``Attributes`` become ``title``/``bullet_points``/
``attributes``), so real WebShop files and the generated catalogue share one representation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Review", "Product", "Goal", "Catalogue", "PRICE_RANGE", "SPLITS", "price_upper_bound"]

#: Upper bounds a goal may use (``goal.py::PRICE_RANGE``: 10, 20, ..., 990 dollars).
PRICE_RANGE = [10.0 * i for i in range(1, 100)]

#: Instruction splits; WebShop's baseline uses goals [0, 500) for test, [500, 1500) for eval, the rest for train.
SPLITS = ("all", "train", "eval", "test")


def price_upper_bound(price: float, rng) -> float:  # rng: random.Random
    """A goal's price bound as ``goal.py`` draws it: the larger of two of the four round prices above ``price``.

    Returns 1,000,000 (no effective bound) when fewer than two round prices lie above ``price``.
    """
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return 1_000_000.0
    return max(rng.sample(candidates, 2))


@dataclass(frozen=True)
class Review:
    """One customer review (``reviews.json``: title, score/stars, body/review)."""

    title: str
    score: float
    body: str


@dataclass
class Product:
    """One catalogue item.

    Attributes:
        asin: Amazon-style id (10 characters, upper case), shown on results pages and clicked in lower case.
        title: the product name (WebShop's ``Title`` == ``name``).
        category: top-level category (beauty, electronics, fashion, food, furniture).
        query: the search query the product was scraped for (``r_type``'s query match).
        product_category: breadcrumb joined by " \u203a " (``r_type``'s category match).
        description: full description (``Description``).
        bullet_points: feature bullets (``BulletPoints``).
        attributes: hidden attribute phrases (``Attributes``), matched by ``r_att``.
        options: option name -> values, lower case (``customization_options`` after normalisation).
        pricing: one price, or a [low, high] range.
        reviews: customer reviews.
        rating: average score, or "N.A.".
    """

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    description: str
    bullet_points: list[str]
    attributes: list[str]
    options: dict[str, list[str]]
    pricing: list[float]
    reviews: list[Review] = field(default_factory=list)
    rating: float | str = "N.A."

    @property
    def name(self) -> str:
        return self.title

    @property
    def price_tag(self) -> str:
        """The ``Price`` string of the pages: ``$12.5`` or ``$12.5 to $20.0`` (upstream formats floats with str)."""
        if len(self.pricing) >= 2:
            return f"${self.pricing[0]} to ${self.pricing[1]}"
        return f"${self.pricing[0]}"

    def search_text(self) -> str:
        """The document WebShop indexes: title, description, first bullet and options (lower case).

        Mirrors ``search_engine/convert_product_file_format.py``.
        """
        option_text = ", and ".join(f"{k}: {', '.join(v)}" for k, v in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, option_text]).lower()


@dataclass(frozen=True)
class Goal:
    """One instruction: buy ``asin`` (or anything as good) with these attributes, options and price bound.

    Attributes:
        asin: the product the instruction was written for.
        instruction_text: the text the agent sees (ends with ", and price lower than X dollars").
        attributes: goal attribute phrases (``instruction_attributes``).
        goal_options: goal option values (human goals give a list; synthetic ones a name -> value dict,
            of which only the values count, as in ``get_reward``).
        price_upper: price bound in dollars.
        query, category, product_category, name: copied from the goal product (``r_type``).
        option_names: option name of each goal option when known (generated/synthetic goals), else empty.
    """

    asin: str
    instruction_text: str
    attributes: tuple[str, ...]
    goal_options: tuple[str, ...]
    price_upper: float
    query: str
    category: str
    product_category: str
    name: str
    option_names: tuple[str, ...] = ()
    weight: float = 1.0


@dataclass
class Catalogue:
    """Products, their sampled prices and the shuffled goal list of one data source."""

    products: list[Product]
    prices: dict[str, float]
    goals: list[Goal]
    source: str
    by_asin: dict[str, Product] = field(init=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}

    def split_range(self, split: str) -> range:
        """Goal indices of ``split``: WebShop's ranges (test [0, 500), eval [500, 1500), train the rest) when
        there are more than 1,500 goals, else 10% test, 10% eval, 80% train in the same order."""
        n = len(self.goals)
        if split not in SPLITS:
            import difflib

            hint = difflib.get_close_matches(str(split), SPLITS, n=1)
            raise ValueError(
                f"split must be one of {SPLITS}, got split={split!r}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        if split == "all":
            return range(n)
        if n > 1500:
            n_test, n_eval = 500, 1000
        else:
            n_test = n_eval = max(1, n // 10) if n >= 3 else 0
        bounds = {"test": (0, n_test), "eval": (n_test, n_test + n_eval), "train": (n_test + n_eval, n)}
        lo, hi = bounds[split]
        return range(lo, hi)
