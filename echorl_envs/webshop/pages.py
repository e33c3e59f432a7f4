"""WebShop's pages in text mode: what each page shows and which buttons it offers.

Observations are upstream's ``observation_mode="text"``: the visible strings of the HTML page joined by
``" [SEP] "`` (``WebAgentTextEnv.convert_html_to_text(simple=True)``), e.g. a results page reads
``Instruction: [SEP] <goal> [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP]
B0ABCD1234 [SEP] <title> [SEP] $12.5 [SEP] ...``. Clickables are the lower-cased button texts, product
ASINs and option values, offered as ``click[<text>]`` (``get_available_actions``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from echorl_envs.core import to_printable
from echorl_envs.webshop.catalogue import Catalogue
from echorl_envs.webshop.search import PRODUCT_WINDOW

__all__ = ["Session", "render", "clickables", "SUB_PAGES", "BACK_TO_SEARCH", "NEXT_PAGE", "PREV_PAGE", "BUY_NOW"]

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
#: Item sub-pages (``engine.py::ACTION_TO_TEMPLATE``); "attributes" only with ``show_attrs``.
SUB_PAGES = ("description", "features", "reviews", "attributes")

SEP = " [SEP] "


@dataclass
class Session:
    """Where the shopper is (``SimServer.user_sessions[session_id]``)."""

    #: "search", "results", "item", "sub" or "done"
    page: str = "search"
    keywords: str = ""
    results: list[str] = field(default_factory=list)
    page_num: int = 1
    asin: str | None = None
    #: option name -> chosen value
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str = ""
    searches: int = 0
    reward: float = 0.0

    def page_results(self) -> list[str]:
        return self.results[(self.page_num - 1) * PRODUCT_WINDOW: self.page_num * PRODUCT_WINDOW]


def option_value_names(catalogue: Catalogue, asin: str) -> dict[str, tuple[str, str]]:
    """Clickable text -> (option name, raw value) of a product's option buttons (first name wins on clashes)."""
    out: dict[str, tuple[str, str]] = {}
    for name, values in catalogue.by_asin[asin].options.items():
        for v in values:
            out.setdefault(to_printable(v), (name, v))
    return out


def clickables(s: Session, catalogue: Catalogue, show_attrs: bool = False) -> list[str]:
    """The admissible ``click[...]`` actions of the current page (empty on the search page)."""
    if s.page == "results":
        acts = [BACK_TO_SEARCH]
        if s.page_num > 1:
            acts.append(PREV_PAGE)
        if s.page_num * PRODUCT_WINDOW < len(s.results):
            acts.append(NEXT_PAGE)
        acts += [a.lower() for a in s.page_results()]
    elif s.page == "item":
        assert s.asin is not None
        acts = [BACK_TO_SEARCH, PREV_PAGE]
        acts += [v for v in option_value_names(catalogue, s.asin) if v not in acts]
        acts += [p for p in SUB_PAGES if show_attrs or p != "attributes"]
        acts.append(BUY_NOW)
    elif s.page == "sub":
        acts = [BACK_TO_SEARCH, PREV_PAGE]
    else:
        return []
    seen: list[str] = []
    for a in acts:
        if a not in seen:
            seen.append(a)
    return [f"click[{a}]" for a in seen]


def render(s: Session, catalogue: Catalogue, instruction: str, show_attrs: bool = False) -> str:
    """The text observation of the current page."""
    head = ["Instruction:", instruction]
    if s.page == "search":
        parts = ["WebShop", *head, "Search"]
    elif s.page == "results":
        parts = [*head, "Back to Search", f"Page {s.page_num} (Total results: {len(s.results)})"]
        if s.page_num > 1:
            parts.append("< Prev")
        if s.page_num * PRODUCT_WINDOW < len(s.results):
            parts.append("Next >")
        for asin in s.page_results():
            p = catalogue.by_asin[asin]
            parts += [asin, p.title, p.price_tag]
    elif s.page == "item":
        assert s.asin is not None
        p = catalogue.by_asin[s.asin]
        parts = [*head, "Back to Search", "< Prev"]
        for name, values in p.options.items():
            parts += [name, *values]
        parts += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}", "Description", "Features", "Reviews"]
        if show_attrs:
            parts.append("Attributes")
        parts.append("Buy Now")
    elif s.page == "sub":
        assert s.asin is not None
        p = catalogue.by_asin[s.asin]
        parts = [*head, "Back to Search", "< Prev"]
        if s.sub_page == "description":
            parts.append(p.description or "N.A.")
        elif s.sub_page == "features":
            parts += p.bullet_points or ["N.A."]
        elif s.sub_page == "reviews":
            for r in p.reviews:
                parts += [r.title, f"{r.score:g}", r.body]
            if not p.reviews:
                parts.append("N.A.")
        else:
            parts += p.attributes
    else:  # done
        parts = ["Thank you for shopping with us!", "Purchased", "asin", str(s.asin), "options",
                 json.dumps(s.options), "Your score (min 0.0, max 1.0)", f"{s.reward:.4f}"]
    return SEP.join(str(x).strip() for x in parts)
