"""BM25 product search with ``bm25s`` (WebShop uses pyserini's Lucene BM25 over the same documents).

Documents are :meth:`Product.search_text` (title, description, first bullet, options; as
``convert_product_file_format.py`` writes them). Tokenisation follows Lucene's ``EnglishAnalyzer`` closely:
lower case, its 33 English stop words (bm25s' ``"en"`` list) and a Snowball English stemmer. Results keep
only documents with a positive score (Lucene returns matching documents only), ranked by score with ties
broken by catalogue order, so a query always gives the same list. Indexes are cached per process, and
large ones (real WebShop data) also on disk, keyed by a hash of the documents and the analysis settings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from echorl_envs.core import cache_root
from echorl_envs.webshop.catalogue import Catalogue, Product

__all__ = ["ProductSearch", "SEARCH_RETURN_N", "PRODUCT_WINDOW", "DISK_CACHE_MIN_PRODUCTS", "default_cache_dir", "search_for"]

#: Number of results a search returns (``engine.py::SEARCH_RETURN_N``).
SEARCH_RETURN_N = 50
#: Results per page (``engine.py::PRODUCT_WINDOW``).
PRODUCT_WINDOW = 10
#: Catalogues at least this large keep their index on disk (building it takes minutes for WebShop's 1.18M items).
DISK_CACHE_MIN_PRODUCTS = 20_000
#: Bump when the document text or the analysis changes, so stale disk indexes are not reused.
_INDEX_FORMAT = "webshop-bm25-v1"

_log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


class ProductSearch:
    """A BM25 index over a product list; :meth:`search` returns the top ASINs for a keyword string."""

    def __init__(self, products: Sequence[Product], top_n: int = SEARCH_RETURN_N,
                 cache_dir: str | Path | None = None) -> None:
        """Index ``products``.

        Args:
            products: the catalogue, in order (ties rank by this order).
            top_n: results per search (WebShop: 50).
            cache_dir: folder of on-disk indexes; when given, an index with the same documents is loaded
                from there instead of rebuilt, and a new one is saved there.
        """
        if top_n < 1:
            raise ValueError(f"top_n must be >= 1, got top_n={top_n}")
        self.asins = [p.asin for p in products]
        self.top_n = top_n
        self.loaded_from_cache = False
        corpus = [p.search_text() for p in products]
        folder = None
        if cache_dir is not None:
            h = hashlib.sha256(f"{_INDEX_FORMAT}|bm25s {bm25s.__version__}".encode())
            for asin, doc in zip(self.asins, corpus, strict=True):
                h.update(asin.encode() + b"\0" + doc.encode() + b"\0")
            folder = Path(cache_dir).expanduser() / h.hexdigest()[:24]
            if (folder / "asins.json").exists():
                self._bm25 = bm25s.BM25.load(str(folder), show_progress=False)
                self.loaded_from_cache = True
                _log.debug("loaded BM25 index of %d products from %s", len(corpus), folder)
                return
        tokens = bm25s.tokenize(corpus, stopwords="en", stemmer=_stemmer(), show_progress=False)
        self._bm25 = bm25s.BM25()  # Lucene's BM25 (k1=1.5, b=0.75 as bm25s defaults)
        self._bm25.index(tokens, show_progress=False)
        _log.debug("indexed %d products", len(corpus))
        if folder is not None:
            self._save(folder)

    def _save(self, folder: Path) -> None:
        # Write to a temporary sibling, then rename: concurrent processes never see a half-written index.
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-"))
        try:
            self._bm25.save(str(tmp), show_progress=False)
            (tmp / "asins.json").write_text(json.dumps(self.asins))
            os.replace(tmp, folder)
        except OSError as e:  # another process won the race, or the disk is read-only: keep the memory index
            _log.debug("could not save BM25 index to %s: %s", folder, e)
            shutil.rmtree(tmp, ignore_errors=True)

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


def default_cache_dir() -> Path:
    """``$ECHORL_CACHE_DIR/webshop`` if set, else the platform's user cache folder for echorl."""
    return cache_root() / "webshop"


def search_for(catalogue: Catalogue) -> ProductSearch:
    """The catalogue's index, built on first use and kept on the (per-process cached) catalogue; catalogues of
    at least :data:`DISK_CACHE_MIN_PRODUCTS` products also reuse an index saved on disk."""
    engine = catalogue.__dict__.get("_search_engine")
    if engine is None:
        big = len(catalogue.products) >= DISK_CACHE_MIN_PRODUCTS
        engine = ProductSearch(catalogue.products, cache_dir=default_cache_dir() if big else None)
        catalogue.__dict__["_search_engine"] = engine
    return engine
