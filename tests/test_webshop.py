"""WebShop: reward formula, generated catalogue, search, pages, oracle/random scores, real-format loader."""

from __future__ import annotations

import json
import pickle

import gymnasium as gym
import numpy as np
import pytest

import echorl_envs  # noqa: F401  (registers the ids)
from echorl_envs.webshop import (
    GeneratorConfig,
    Goal,
    Product,
    ProductSearch,
    WebShopEnv,
    generate_catalogue,
    get_reward,
    load_webshop,
    normalize_color,
)
from echorl_envs.webshop.baselines import play_oracle, play_random
from echorl_envs.webshop.loader import parse_pricing
from echorl_envs.webshop.reward import attribute_reward, option_reward, type_reward

CAT = "Beauty & Personal Care \u203a Hair Care \u203a Shampoo & Conditioner \u203a Shampoos"


def product(**kw) -> Product:
    base = dict(
        asin="B000000001", title="Acme Shampoo with Argan Oil", category="beauty", query="shampoo",
        product_category=CAT, description="A gentle shampoo.", bullet_points=["Cleans well."],
        attributes=["sulfate-free", "paraben free"], options={"size": ["8 fl oz", "16 fl oz"]}, pricing=[10.0],
    )
    base.update(kw)
    return Product(**base)


def goal(**kw) -> Goal:
    base = dict(
        asin="B000000001", instruction_text="i need sulfate free shampoo", attributes=("sulfate free",),
        goal_options=("16 fl oz",), price_upper=20.0, query="shampoo", category="beauty",
        product_category=CAT, name="Acme Shampoo with Argan Oil",
    )
    base.update(kw)
    return Goal(**base)


# ----------------------------------------------------------------------------- reward (goal.py::get_reward)
def test_normalize_color_matches_upstream_cases():
    cases = [("", ""), ("black forest", "black"), ("violet lavender", "lavender"),
             ("steelivy fuchsia", "fuchsia"), ("123alabaster", "alabaster"), ("webshop", "webshop"),
             ("navy blue", "blue")]
    for value, expected in cases:
        assert normalize_color(value) == expected


def test_attribute_reward_fuzzy_and_text_matches():
    p = product(description="Great for dry hair.", bullet_points=["Long lasting freshness."])
    g = goal(attributes=("sulfate free", "dry hair", "long lasting", "vegan"))
    # "sulfate free" ~ "sulfate-free" (token_set_ratio 100); "dry hair" in description; "long lasting" in a
    # bullet; "vegan" nowhere.
    assert attribute_reward(p, g) == (0.75, 3)


def test_option_reward_exact_size_fuzzy_and_colour():
    p = product(options={"size": ["large", "x-large"], "color": ["navy blue"], "pack": ["12 pack"]})
    goals = ("large", "blue", "pack of 12")
    assert option_reward(p, goals, {"size": "large"}) == (pytest.approx(1 / 3), 1)
    # size is matched exactly: "x-large" is not "large"
    assert option_reward(p, goals, {"size": "x-large"}) == (0.0, 0)
    # colours are normalised ("navy blue" -> "blue"), other options fuzzy ("12 pack" ~ "pack of 12")
    assert option_reward(p, goals, {"color": "navy blue", "pack": "12 pack", "size": "large"}) == (1.0, 3)
    # an option value found in the title counts even when it is not a goal option (upstream behaviour)
    p2 = product(title="Acme Shampoo Mint", options={"scent": ["mint"]})
    assert option_reward(p2, ("lavender",), {"scent": "mint"}) == (1.0, 1)
    assert option_reward(p, (), {}) == (None, 0)


def test_option_matches_are_capped_at_goal_options():
    p = product(title="Acme Red Large Shampoo", options={"color": ["red"], "size": ["large"]})
    assert option_reward(p, ("large",), {"color": "red", "size": "large"}) == (1.0, 1)


def test_type_reward_levels():
    g = goal(name="Acme Shampoo Argan Oil")
    assert type_reward(product(), g)["r_type"] == 1.0  # same query
    other = dict(query="conditioner", product_category="Beauty & Personal Care \u203a Hair Care \u203a Other")
    assert type_reward(product(**other, title="Zed Shampoo"), g)["r_type"] == 1.0  # category match (2 levels)
    far = dict(query="kettle", product_category="Home \u203a Kitchen")
    assert type_reward(product(**far, title="Acme Shampoo Kettle"), g)["r_type"] == 1.0  # title 2/4 > 0.2
    t = type_reward(product(**far, title="Zed Kettle Oil"), g)  # title 1/4 = 0.25 > 0.2
    assert t["title_score"] == 0.25 and t["r_type"] == 1.0
    g5 = goal(name="one two three four five six seven eight nine ten")  # 10 content words
    t = type_reward(product(**far, title="two kettle"), g5)  # 0.1: no match, not < 0.1 -> 0.5
    assert t["title_score"] == pytest.approx(0.1) and t["r_type"] == 0.5
    g11 = goal(name="one two three four five six seven eight nine ten eleven")
    assert type_reward(product(**far, title="two kettle"), g11)["r_type"] == 0.1  # 1/11 < 0.1
    assert type_reward(product(**far, title="Zed Kettle"), g)["r_type"] == 0.0  # no shared word


def test_total_reward_formula_and_price():
    p = product(attributes=["sulfate free"], options={"size": ["8 fl oz", "16 fl oz"], "scent": ["mint", "rose"]})
    g = goal(attributes=("sulfate free", "vegan"), goal_options=("16 fl oz", "mint"), price_upper=20.0)
    full = get_reward(p, g, price=20.0, options={"size": "16 fl oz", "scent": "mint"})
    assert full.reward == pytest.approx(4 / 5) and full.r_price is True  # vegan missing: (1 + 2 + 1) / 5
    assert (full.r_att, full.r_option, full.r_type) == (0.5, 1.0, 1.0)
    assert full.w_att == pytest.approx(2 / 5) and full.w_option == pytest.approx(2 / 5)
    pricey = get_reward(p, g, price=20.01, options={"size": "16 fl oz", "scent": "rose"})
    assert pricey.r_price is False and pricey.reward == pytest.approx(2 / 5)  # (1 + 1 + 0) / 5
    unbounded = get_reward(p, goal(price_upper=0.0, goal_options=()), price=1e9, options={})
    assert unbounded.r_price is True and unbounded.reward == 1.0  # (1 + 0 + 1) / 2
    far = product(query="kettle", product_category="Home \u203a Kitchen", title="Zed Kettle")
    assert get_reward(far, g, price=1.0, options={}).reward == 0.0  # r_type 0 zeroes everything


# ----------------------------------------------------------------------------- generated catalogue and search
def test_generated_catalogue_is_large_varied_and_deterministic():
    cat = generate_catalogue()
    assert len(cat.products) >= 1000 and len(cat.goals) >= 500
    assert len({p.category for p in cat.products}) == 5
    assert len({p.query for p in cat.products}) >= 25
    assert len({p.asin for p in cat.products}) == len(cat.products)
    assert all(p.options and p.attributes for p in cat.products)
    fresh = generate_catalogue.__wrapped__(GeneratorConfig())
    assert [g.instruction_text for g in fresh.goals] == [g.instruction_text for g in cat.goals]
    assert fresh.prices == cat.prices
    other = generate_catalogue(GeneratorConfig(seed=1))
    assert [g.instruction_text for g in other.goals] != [g.instruction_text for g in cat.goals]
    for g in cat.goals[:200]:
        p = cat.by_asin[g.asin]
        assert set(g.attributes) <= set(p.attributes)
        assert all(v in p.options[n] for n, v in zip(g.option_names, g.goal_options, strict=True))
        assert cat.prices[g.asin] <= g.price_upper
        assert f"price lower than {g.price_upper:.2f} dollars" in g.instruction_text


def test_generator_config_validates():
    with pytest.raises(ValueError, match="num_products"):
        GeneratorConfig(num_products=3)


def test_search_ranks_exact_title_first_and_drops_non_matches():
    cat = generate_catalogue()
    engine = ProductSearch(cat.products)
    for p in cat.products[:20]:
        assert engine.search(p.title)[0] == p.asin
    hits = engine.search("shampoo")
    assert 0 < len(hits) <= 50
    assert all(cat.by_asin[a].query == "shampoo" or "shampoo" in cat.by_asin[a].search_text() for a in hits)
    assert engine.search("zzqx qqwv") == [] and engine.search("the of and") == []


# ----------------------------------------------------------------------------- pages and actions
def test_pages_and_actions_follow_webshop_text_mode():
    env = WebShopEnv()
    obs, info = env.reset(options={"index": 0})
    g = env.goal
    assert obs == f"WebShop [SEP] Instruction: [SEP] {g.instruction_text} [SEP] Search"
    assert info["admissible_actions"] == [] and info["has_search_bar"] and info["task_id"] == "webshop-0"
    obs, r, term, trunc, info = env.step("click[buy now]")
    assert info["invalid_action"] and "search[" in obs and r == 0.0
    obs, *_, info = env.step("search[Shampoo]")
    assert info["page"] == "results" and obs.startswith(f"Instruction: [SEP] {g.instruction_text} [SEP] Back to Search")
    assert "Page 1 (Total results: 50) [SEP] Next >" in obs and "< Prev" not in obs
    adm = info["admissible_actions"]
    assert adm[:2] == ["click[back to search]", "click[next >]"] and len(adm) == 12
    obs, *_, info = env.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next >" in obs
    first = info["admissible_actions"][3]
    asin = first[6:-1].upper()
    p = env.catalogue.by_asin[asin]
    obs, *_, info = env.step(f"click[{p.title}]")  # product links may be clicked by title
    assert info["page"] == "item" and f"{p.title} [SEP] Price: {p.price_tag}" in obs
    assert obs.endswith("Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    name, values = next(iter(p.options.items()))
    obs, *_, info = env.step(f"click[{values[-1]}]")
    assert info["selected_options"] == {name: values[-1]}
    obs, *_, info = env.step("click[description]")
    assert info["page"] == "sub" and obs.endswith(p.description)
    assert info["admissible_actions"] == ["click[back to search]", "click[< prev]"]
    obs, *_, info = env.step("click[< prev]")
    assert info["page"] == "item" and info["selected_options"] == {name: values[-1]}
    obs, *_, info = env.step("click[< prev]")
    assert info["page"] == "results" and "Page 2" in obs
    obs, r, term, trunc, info = env.step("click[back to search]")
    assert info["page"] == "search" and not term


def test_buy_reports_reward_components():
    env = WebShopEnv()
    _, info = env.reset(options={"index": 5})
    while True:
        _, r, term, trunc, info = env.step(info["expert_action"])
        if term:
            break
    assert r == 1.0 and info["won"]
    assert {k: info[k] for k in ("r_att", "r_option", "r_price", "r_type")} == {
        "r_att": 1.0, "r_option": 1.0, "r_price": True, "r_type": 1.0}
    assert info["purchased_asin"] == info["goal_asin"] == env.goal.asin
    assert info["admissible_actions"] == [] and "expert_action" not in info


def test_splits_index_and_task_id():
    env = WebShopEnv(split="test")
    assert env.num_tasks == 150 and WebShopEnv(split="train").num_tasks == 1200
    _, info = WebShopEnv(split="eval").reset(options={"index": 0})
    assert info["task_id"] == "webshop-150"
    with pytest.raises(ValueError, match="did you mean 'test'"):
        WebShopEnv(split="tset")
    with pytest.raises(ValueError, match="index"):
        env.reset(options={"index": 150})


def test_train_and_test_instructions_are_disjoint():
    """The held-out instructions of ``webshop-sft-rl`` (``split="test"``) share no text and no goal product with
    the training ones (``split="train"``)."""
    train, test = WebShopEnv(split="train"), WebShopEnv(split="test")
    assert not set(train._indices) & set(test._indices)
    text = {e.split: {e.catalogue.goals[i].instruction_text for i in e._indices} for e in (train, test)}
    asins = {e.split: {e.catalogue.goals[i].asin for i in e._indices} for e in (train, test)}
    assert len(text["train"]) == 1200 and len(text["test"]) == 150
    assert not text["train"] & text["test"] and not asins["train"] & asins["test"]


def test_instruction_search_gives_every_page_admissible_actions():
    """``instruction_search``: the search page lists the instruction (price clause cut) as its one search, the
    LLM choice wrapper can play every page, the expert plays admissible actions only and still wins, and a typed
    query stays valid."""
    from echorl_envs.wrappers.llm import LLMObservationWrapper

    env = WebShopEnv(split="test", instruction_search=True)
    won = 0
    for i in range(20):
        obs, info = env.reset(options={"index": i})
        assert info["has_search_bar"] and info["admissible_actions"] == [f"search[{env.oracle_query()}]"]
        assert "price lower than" not in info["admissible_actions"][0] and info["expert_action"] == \
            info["admissible_actions"][0]
        done = False
        while not done:
            assert info["expert_action"] in info["admissible_actions"]
            _, r, done, trunc, info = env.step(info["expert_action"])
            assert not info["invalid_action"] and not trunc
        won += info["won"]
    assert won >= 19
    env.reset(options={"index": 0})
    obs, _, _, _, info = env.step("search[red running shoes]")
    assert not info["invalid_action"] and info["page"] == "results"
    plain = WebShopEnv(split="test")
    assert plain.reset(options={"index": 0})[1]["admissible_actions"] == []
    wrapped = LLMObservationWrapper(gym.make("EchoRL/WebShop-v0", instruction_search=True, split="test"),
                                    history=0, max_actions=32, encode=False)
    state, _ = wrapped.reset(seed=1)
    assert state["admissible"][0].startswith("search[") and len(state["admissible"]) == 1
    state, *_ = wrapped.step(0)
    assert "click[back to search]" in state["admissible"] and len(state["admissible"]) > 5
    wrapped.close()


def test_pickle_mid_episode_keeps_state():
    env = gym.make("EchoRL/WebShop-v0")
    _, info = env.reset(seed=3)
    for _ in range(2):
        _, _, _, _, info = env.step(info["expert_action"])
    clone = pickle.loads(pickle.dumps(env))
    a = env.step(info["expert_action"])
    b = clone.step(info["expert_action"])
    assert a[0] == b[0] and a[4]["selected_options"] == b[4]["selected_options"]


# ----------------------------------------------------------------------------- oracle and random clicker
def _oracle_success(indices) -> float:
    env = WebShopEnv()
    return float(np.mean([play_oracle(env, i).reward == 1.0 for i in indices]))


def test_oracle_scores_one_on_a_sample():
    indices = np.random.default_rng(0).choice(1500, size=50, replace=False)
    assert _oracle_success(indices.tolist()) >= 0.95


@pytest.mark.slow
def test_oracle_scores_one_on_all_instructions():
    assert _oracle_success(range(WebShopEnv().num_tasks)) >= 0.95


def test_random_clicker_scores_low():
    env = WebShopEnv()
    rng = np.random.default_rng(0)
    res = [play_random(env, i, rng) for i in range(60)]
    assert np.mean([r.reward for r in res]) < 0.4
    assert np.mean([r.success for r in res]) < 0.1


# ----------------------------------------------------------------------------- loader (real file formats)
def _write_webshop_files(folder):
    products = [
        {"asin": "B0AAAAAAA1", "name": "Lumen Gentle Shampoo for Dry Hair", "category": "beauty",
         "query": "Shampoo ", "product_category": CAT, "full_description": "A sulfate free shampoo.",
         "small_description": ["Paraben free formula"], "pricing": "$12.99",
         "customization_options": {"Size": [{"value": "8 Fl Oz", "image": None}, {"value": "16 Fl Oz"}],
                                   "Color": [{"value": "Black/White"}]},
         "images": ["x.jpg"]},
        {"asin": "B0AAAAAAA2", "name": "Zed Kettle", "category": "kitchen", "query": "kettle",
         "product_category": "Home \u203a Kitchen", "full_description": "", "small_description": "One bullet",
         "pricing": "$20.00 - $40.00", "customization_options": None, "images": []},
        {"asin": "B0AAAAAAA1", "name": "duplicate", "query": "x", "small_description": [], "pricing": ""},
        {"asin": "nan", "name": "broken", "query": "x", "small_description": [], "pricing": ""},
        {"asin": "B0TOOLONGASIN", "name": "broken", "query": "x", "small_description": [], "pricing": ""},
    ]
    attrs = {"B0AAAAAAA1": {"attributes": ["sulfate free", "dry hair"], "instruction": "i want shampoo",
                            "instruction_attributes": ["sulfate free"]}}
    human = {"B0AAAAAAA1": [
        {"asin": "B0AAAAAAA1", "instruction": "i need a sulfate free shampoo for dry hair.",
         "instruction_attributes": ["sulfate free", "dry hair"], "instruction_options": ["16 fl oz"]},
        {"asin": "B0AAAAAAA1", "instruction": "no attributes here", "instruction_attributes": [],
         "instruction_options": []},
    ]}
    reviews = [{"asin": "B0AAAAAAA1", "average_rating": 4.5,
                "reviews": [{"title": "ok", "stars": "4", "review": "fine"}]}]
    for name, data in [("items_shuffle_1000.json", products), ("items_ins_v2_1000.json", attrs),
                       ("items_human_ins.json", human), ("reviews.json", reviews)]:
        (folder / name).write_text(json.dumps(data))


def test_parse_pricing_formats():
    assert parse_pricing("$12.99") == [12.99]
    assert parse_pricing("$1,299.00 - $1,499.50") == [1299.0, 1499.5]
    assert parse_pricing("") == [100.0] and parse_pricing(None) == [100.0]


def test_loader_reads_real_formats(tmp_path):
    _write_webshop_files(tmp_path)
    cat = load_webshop(tmp_path)
    assert [p.asin for p in cat.products] == ["B0AAAAAAA1", "B0AAAAAAA2"]  # dup, nan, long asin skipped
    p1, p2 = cat.products
    assert p1.options == {"size": ["8 fl oz", "16 fl oz"], "color": ["black | white"]}
    assert p1.query == "shampoo" and p1.attributes == ["sulfate free", "dry hair"] and p1.rating == 4.5
    assert p1.reviews[0].score == 4.0 and p1.reviews[0].body == "fine"
    assert p2.attributes == ["DUMMY_ATTR"] and p2.bullet_points == ["One bullet"] and p2.pricing == [20.0, 40.0]
    assert 20.0 <= cat.prices["B0AAAAAAA2"] <= 40.0 and cat.prices["B0AAAAAAA1"] == 12.99
    assert len(cat.goals) == 1  # the instruction without attributes is skipped, as upstream
    g = cat.goals[0]
    assert g.instruction_text.startswith("i need a sulfate free shampoo for dry hair, and price lower than ")
    assert g.price_upper in (20.0, 30.0, 40.0, 50.0) and g.goal_options == ("16 fl oz",)
    synth = load_webshop(tmp_path / "items_shuffle_1000.json", human_goals=False)
    assert sorted(x.instruction_text for x in synth.goals)[0].startswith(
        "i want shampoo with color: black | white, and size: 16 fl oz")
    assert len(synth.goals) == 2  # one per option combination
    with pytest.raises(ValueError, match="data_path does not exist"):
        load_webshop(tmp_path / "missing")


def test_env_plays_real_format_files(tmp_path):
    _write_webshop_files(tmp_path)
    env = WebShopEnv(data_path=str(tmp_path))
    assert env.num_tasks == 1
    res = play_oracle(env, 0)
    assert res.reward == 1.0 and res.success
    clone = pickle.loads(pickle.dumps(env))
    assert clone.catalogue is env.catalogue  # rebuilt from the per-process cache, not serialised


def test_search_index_disk_cache_round_trip(tmp_path):
    products = generate_catalogue().products[:300]
    built = ProductSearch(products, cache_dir=tmp_path)
    loaded = ProductSearch(products, cache_dir=tmp_path)
    assert not built.loaded_from_cache and loaded.loaded_from_cache
    assert len(list(tmp_path.iterdir())) == 1
    for p in products[:10]:
        assert loaded.search(p.title) == built.search(p.title)
    assert loaded.search("wireless earbuds noise cancelling") == built.search("wireless earbuds noise cancelling")
    changed = ProductSearch(products[:299], cache_dir=tmp_path)  # different documents: a new index
    assert not changed.loaded_from_cache and len(list(tmp_path.iterdir())) == 2


def test_show_attrs_page_and_search_hint():
    env = WebShopEnv(show_attrs=True)
    _, info = env.reset(options={"index": 7})
    while info["page"] != "item" or env._session.asin != env.goal.asin:
        _, _, _, _, info = env.step(info["expert_action"])
    assert "click[attributes]" in info["admissible_actions"]
    obs, *_, info = env.step("click[attributes]")
    assert obs.endswith(" [SEP] ".join(env.catalogue.by_asin[env.goal.asin].attributes))
    obs, r, term, trunc, info = env.step("search[anything]")
    assert info["invalid_action"] and obs.startswith("Search is only available on the search page")
    assert "click[attributes]" not in clickables_of(WebShopEnv(), 7)


def clickables_of(env: WebShopEnv, index: int) -> list[str]:
    _, info = env.reset(options={"index": index})
    while info["page"] != "item":
        _, _, _, _, info = env.step(info["expert_action"])
    return info["admissible_actions"]
