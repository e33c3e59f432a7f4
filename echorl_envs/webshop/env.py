"""The WebShop text environment (a light reimplementation of princeton-nlp/WebShop's text mode)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from echorl_envs.core import DatasetTextEnv, InvalidAction, Transition, normalize_action, to_printable
from echorl_envs.core.base import MAX_TEXT
from echorl_envs.webshop.catalogue import Catalogue, Goal
from echorl_envs.webshop.generator import GeneratorConfig, generate_catalogue
from echorl_envs.webshop.loader import load_webshop
from echorl_envs.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PREV_PAGE,
    SUB_PAGES,
    Session,
    clickables,
    option_value_names,
    render,
)
from echorl_envs.webshop.reward import RewardInfo, fuzzy_match, get_reward, normalize_color
from echorl_envs.webshop.search import PRODUCT_WINDOW, search_for

__all__ = ["WebShopEnv", "load_catalogue"]

_SEARCH = re.compile(r"^\s*search\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_CLICK = re.compile(r"^click\[(.*)\]$", re.DOTALL)
_PRICE_CLAUSE = re.compile(r",?\s*and price lower than [\d.]+ dollars\s*$")


def load_catalogue(data_path: str | None = None, human_goals: bool = True, num_products: int | None = None,
                   seed: int = 0) -> Catalogue:
    """The catalogue an env plays: real WebShop files under ``data_path``, else the generated one."""
    if data_path is None:
        return generate_catalogue(GeneratorConfig(num_products=num_products or 1500, seed=seed))
    return load_webshop(data_path, human_goals=human_goals, num_products=num_products, seed=seed)


class WebShopEnv(DatasetTextEnv):
    """Find and buy the product an instruction describes, in a text web shop.

    Description:
        WebShop (Yao et al., 2022) in its text mode: a search page, BM25 search results (top 50, 10 per page),
        product pages with option buttons and description/features/reviews sub-pages, and a purchase scored
        by WebShop's ``get_reward``. By default a generated catalogue (1,500 products in 5 categories, 30
        product types, 1,500 instructions) is used; ``data_path=`` points at WebShop's real ``data/`` files.

    Observation:
        The page text, WebShop's ``observation_mode="text"`` (visible strings joined by `` [SEP] ``).

    Actions:
        On the search page ``search[<keywords>]`` (free text; ``info["admissible_actions"]`` is empty there
        and ``info["has_search_bar"]`` is True). Elsewhere one of ``info["admissible_actions"]``:
        ``click[<asin>]`` (also ``click[<product title>]``), ``click[next >]``, ``click[< prev]``,
        ``click[back to search]``, ``click[<option value>]``, ``click[description]``, ``click[features]``,
        ``click[reviews]``, ``click[buy now]``. Anything else is invalid (feedback, reward 0).

    Rewards:
        0 until ``click[buy now]``, then R = (matched attributes + matched options + r_price) /
        (|attributes| + |options| + 1) * r_type in [0, 1]; ``info`` then holds ``r_att``, ``r_option``,
        ``r_price``, ``r_type`` and the weights. ``won`` (success) is R == 1.

    Termination:
        Terminated at the purchase; truncated by ``max_episode_steps`` (15, as ReAct's WebShop runs).

    Registered ids:
        ``EchoRL/WebShop-v0``.

    Extra info keys: ``task_id``, ``page``, ``has_search_bar``, ``selected_options``, ``expert_action`` (the
    oracle: search the goal's words, open the goal product, choose its options, buy; after a search that
    misses the product, it searches the product's title).

    Args:
        split: the instructions played: ``"all"``, or WebShop's disjoint goal ranges ``"train"``, ``"eval"``,
            ``"test"`` (:meth:`Catalogue.split_range`); a reset draws one of them from its seed.
        instruction_search: list ``search[<the instruction without its price clause>]`` (the oracle's first
            query, WebShop's instruction-as-query) as the search page's one admissible action, so a policy that
            chooses among ``info["admissible_actions"]`` (the LLM choice policy of ``echorl train-llm``) can play:
            every page then has admissible actions, and the policy's choices are the clicks (results, options,
            buy). Typing another ``search[...]`` stays valid. The oracle then never searches the product's title
            (not admissible): when the query misses the goal product (14 of the 1,200 generated train goals) it
            opens the first result and buys it. False: WebShop's free-text search page (no admissible action).
    """

    reset_options: ClassVar[frozenset[str]] = frozenset({"index"})
    #: the purchase's reward breakdown (None before the purchase)
    step_info_keys: ClassVar[tuple[str, ...]] = (*(f.name for f in dataclasses.fields(RewardInfo)),
                                                 "purchased_asin", "goal_asin", "purchased_options")

    def __init__(
        self,
        data_path: str | None = None,
        split: str = "all",
        human_goals: bool = True,
        num_products: int | None = None,
        show_attrs: bool = False,
        catalogue_seed: int = 0,
        instruction_search: bool = False,
        render_mode: str | None = None,
        max_text_length: int = MAX_TEXT,
    ) -> None:
        super().__init__(render_mode=render_mode, max_text_length=max_text_length)
        if num_products is not None and (isinstance(num_products, bool) or int(num_products) < 1):
            raise ValueError(f"num_products must be a positive int or None, got num_products={num_products!r}")
        self._kwargs = dict(data_path=None if data_path is None else str(data_path), human_goals=bool(human_goals),
                            num_products=num_products, seed=int(catalogue_seed))
        self.split = split
        self.show_attrs = bool(show_attrs)
        self.instruction_search = bool(instruction_search)
        self._attach()
        self._goal_index = self._indices[0] if len(self._indices) else 0
        self._session = Session()

    def _attach(self) -> None:
        self.catalogue = load_catalogue(**self._kwargs)
        self._indices = self.catalogue.split_range(self.split)
        self._search = search_for(self.catalogue)

    def search(self, query: str) -> list[str]:
        """The ASINs ``search[query]`` lists, best first (the same BM25 engine the env's search page uses)."""
        return list(self._search.search(query))

    # pickling: the catalogue and index are rebuilt (from the per-process cache) rather than serialised
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("catalogue", "_indices", "_search"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._attach()

    # ----------------------------------------------------------------- dataset protocol
    @property
    def num_tasks(self) -> int:
        return len(self._indices)

    @property
    def goal(self) -> Goal:
        return self.catalogue.goals[self._goal_index]

    def _task(self) -> str:
        return self.goal.instruction_text

    def _reset_episode(self, options: dict[str, Any]) -> Transition:
        self._goal_index = self._indices[self._select_index(options)]
        self._session = Session()
        return Transition(self._render())

    def _info(self, invalid: bool, extra: dict[str, Any]) -> dict[str, Any]:
        info = super()._info(invalid, extra)
        info["task_id"] = f"webshop-{self._goal_index}"
        info["page"] = self._session.page
        info["has_search_bar"] = self._session.page == "search"
        info["selected_options"] = dict(self._session.options)
        return info

    def _render(self) -> str:
        return render(self._session, self.catalogue, self.goal.instruction_text, self.show_attrs)

    def _admissible(self) -> list[str]:
        if self.instruction_search and self._session.page == "search":
            return [f"search[{self.oracle_query()}]"]
        return clickables(self._session, self.catalogue, self.show_attrs)

    def _match_parametric(self, action: str) -> str | None:
        # instruction_search lists one query on the search page; any other search[...] typed there stays valid
        if self._session.page == "search" and _SEARCH.match(action):
            return action.strip()
        return None

    def _aliases(self, normalized_action: str) -> tuple[str, ...]:
        # A product link may also be clicked by its title (or "item - <title>", WebShop's click_item_name).
        s = self._session
        m = _CLICK.match(normalized_action)
        if s.page != "results" or m is None:
            return ()
        p = self.catalogue.by_asin.get(m.group(1).upper())
        if p is None:
            return ()
        title = normalize_action(to_printable(p.title))
        return (f"click[{title}]", f"click[item - {title}]")

    def _invalid_message(self, reason: str, admissible) -> str:
        msg = super()._invalid_message(reason, admissible)
        if reason.lower().startswith(("'search", '"search')):
            msg = "Search is only available on the search page; use click[back to search] first. " + msg
        return msg

    # ----------------------------------------------------------------- transitions
    def _apply(self, action: str) -> Transition:
        s = self._session
        if s.page == "search":
            m = _SEARCH.match(action)
            if m is None or not m.group(1).strip():
                raise InvalidAction(
                    f"Invalid action: {self.describe(action)}. On the search page the only action is "
                    "search[<keywords>], e.g. search[red running shoes]."
                )
            s.keywords = m.group(1).strip().lower()
            s.results = self._search.search(s.keywords)
            s.searches += 1
            s.page, s.page_num, s.asin, s.options = "results", 1, None, {}
            return Transition(self._render())
        target = _CLICK.match(action)
        assert target is not None, action  # admissible actions are all click[...]
        arg = target.group(1)
        if arg == BACK_TO_SEARCH:
            s.page, s.keywords, s.results, s.page_num, s.asin, s.options = "search", "", [], 1, None, {}
        elif s.page == "results":
            if arg == NEXT_PAGE:
                s.page_num += 1
            elif arg == PREV_PAGE:
                s.page_num -= 1
            else:
                s.page, s.asin, s.options = "item", arg.upper(), {}
        elif s.page == "sub":  # only "< prev" remains: back to the item page
            s.page, s.sub_page = "item", ""
        elif s.page == "item":
            if arg == PREV_PAGE:
                s.page, s.asin, s.options = "results", None, {}
            elif arg in SUB_PAGES:
                s.page, s.sub_page = "sub", arg
            elif arg == BUY_NOW:
                return self._buy()
            else:
                assert s.asin is not None
                name, value = option_value_names(self.catalogue, s.asin)[arg]
                s.options[name] = value
        return Transition(self._render())

    def _buy(self) -> Transition:
        s = self._session
        assert s.asin is not None
        product = self.catalogue.by_asin[s.asin]
        info = get_reward(product, self.goal, self.catalogue.prices[s.asin], s.options)
        s.reward = info.reward
        won = info.reward >= 1.0 - 1e-9
        extra = info.as_info()
        extra.update(purchased_asin=s.asin, goal_asin=self.goal.asin, purchased_options=dict(s.options))
        s.page = "done"
        return Transition(self._render(), reward=info.reward, terminated=True, won=won, info=extra)

    # ----------------------------------------------------------------- oracle
    def _goal_option_clicks(self) -> list[tuple[str, str]]:
        """(option name, clickable value) the oracle chooses on the goal product."""
        goal = self.goal
        product = self.catalogue.by_asin[goal.asin]
        clicks = option_value_names(self.catalogue, goal.asin)
        by_raw = {(n, v): c for c, (n, v) in clicks.items()}
        out: list[tuple[str, str]] = []
        if goal.option_names:
            for name, value in zip(goal.option_names, goal.goal_options, strict=True):
                if (name, value) in by_raw:
                    out.append((name, by_raw[(name, value)]))
            return out
        wanted = [normalize_color(o) for o in goal.goal_options]
        for name, values in product.options.items():
            for v in values:
                nv = normalize_color(v)
                if (nv in wanted or any(fuzzy_match(w, nv) for w in wanted)) and (name, v) in by_raw:
                    out.append((name, by_raw[(name, v)]))
                    break
        return out

    def oracle_query(self) -> str:
        """The oracle's first search: the instruction without its price clause."""
        return _PRICE_CLAUSE.sub("", self.goal.instruction_text).strip().lower()

    def _expert(self) -> str | None:
        s, goal = self._session, self.goal
        if s.page == "search":
            query = self.oracle_query() if s.searches == 0 or self.instruction_search else goal.name.lower()
            return f"search[{query}]"
        if s.page == "results":
            if goal.asin not in s.results:
                if self.instruction_search and s.results:  # the title search is not admissible: take the top hit
                    return f"click[{s.page_results()[0].lower()}]" if s.page_results() else f"click[{PREV_PAGE}]"
                return f"click[{BACK_TO_SEARCH}]"
            want = s.results.index(goal.asin) // PRODUCT_WINDOW + 1
            if want == s.page_num:
                return f"click[{goal.asin.lower()}]"
            return f"click[{NEXT_PAGE if want > s.page_num else PREV_PAGE}]"
        if s.page == "sub":
            return f"click[{PREV_PAGE}]"
        if s.page == "item":
            if s.asin != goal.asin:
                missed = self.instruction_search and goal.asin not in s.results
                return f"click[{BUY_NOW if missed else PREV_PAGE}]"
            for name, click in self._goal_option_clicks():
                if option_value_names(self.catalogue, goal.asin)[click][1] != s.options.get(name):
                    return f"click[{click}]"
            return f"click[{BUY_NOW}]"
        return None
