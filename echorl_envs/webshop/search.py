"""BM25 product search with ``bm25s`` (WebShop uses pyserini's Lucene BM25 over the same documents).

Documents are :meth:`Product.search_text` (title, description, first bullet, options; as
``convert_product_file_format.py`` writes them). Tokenisation follows Lucene's ``EnglishAnalyzer`` closely:
lower case, its 33 English stop words (bm25s' ``"en"`` list) and a Snowball English stemmer. Results keep
only documents with a positive score (Lucene returns matching documents only), ranked by score with ties
broken by catalogue order, so a query always gives the same list. Indexes are cached per process.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import bm25s
import numpy as np
import Stemmer

from echorl_envs.webshop.catalogue import Catalogue, Product

__all__ = ["ProductSearch", "SEARCH_RETURN_N", "PRODUCT_WINDOW", "search_for"]

#: Number of results a search returns (``engine.py::SEARCH_RETURN_N``).
SEARCH_RETURN_N = 50
#: Results per page (``engine.py::PRODUCT_WINDOW``).
PRODUCT_WINDOW = 10

_log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


class ProductSearch:
    """A BM25 index over a product list; :meth:`search` returns the top ASINs for a keyword string."""

    def __init__(self, products: Sequence[Product], top_n: int = SEARCH_RETURN_N) -> None:
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got top_n={top_n}")
        self.asins = [p.asin for p in products]
        self.top_n = top_n
        corpus = [p.search_text() for p in products]
        tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=_stemmer(), show_progress=False)
        self._bm25 = bm25s.BM25()  # Lucene's BM25 (k1=1.5, b=0.75 as bm25s defaults)
        self._bm25.index(tokens, show_progress=False)
        _log.debug("indexed %d products", len(corpus))

    def tokenize(self, keywords: str) -> list[str]:
        """Query tokens after the same analysis as the documents."""
        out = bm25s.tokenize([keywords], stopwords="en", stemmer=_stemmer(), return_ids=False,
                             show_progress=False)
        return list(out[0])

    def search(self, keywords: str) -> list[str]:
        """ASINs of the best ``top_n`` products with a positive BM25 score for ``keywords``."""
        tokens = self.tokenize(keywords)
        if not tokens:
            return []
        scores = np.asarray(self._bm25.get_scores(tokens), dtype=np.float64)
        positive = np.flatnonzero(scores > 0)
        if positive.size == 0:
            return []
        # Descending score, ascending catalogue index on ties (lexsort's last key is the primary one).
        order = positive[np.lexsort((positive, -scores[positive]))][: self.top_n]
        return [self.asins[i] for i in order]


def search_for(catalogue: Catalogue) -> ProductSearch:
    """The catalogue's index, built on first use and kept on the (per-process cached) catalogue."""
    engine = catalogue.__dict__.get("_search_engine")
    if engine is None:
        engine = ProductSearch(catalogue.products)
        catalogue.__dict__["_search_engine"] = engine
    return engine
