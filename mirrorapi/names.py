"""StableToolBench's name normalisation, reproduced exactly (quirks included).

Clients and data files of StableToolBench carry names normalised by these rules, so both the
registry and the cache key on them. See ../shared/notes/stabletoolbench.md §1.
"""

from __future__ import annotations

import re

# The upstream character class is `[^\u4e00-\u9fa5^a-zA-Z^0-9^_]`: inside the class the extra `^`
# are literal, so `^` survives standardisation. Kept on purpose, for exactness.
_NOT_KEPT = re.compile("[^\u4e00-\u9fa5^a-zA-Z0-9_]")
_UNDERSCORES = re.compile("_{2,}")

# Python keywords / literals that StableToolBench renames with an `is_` prefix.
RESERVED = frozenset({"from", "class", "return", "false", "true", "id", "and"})


def standardize(name: str) -> str:
    """Tool, API and parameter names as StableToolBench writes them: `"50K Radio"` -> `get_50k_radio`."""
    name = _UNDERSCORES.sub("_", _NOT_KEPT.sub("_", name)).lower().strip("_")
    if name[:1].isdigit():
        name = "get_" + name
    return name


def change_name(name: str) -> str:
    """`id` -> `is_id`, `from` -> `is_from`, ...; any other name unchanged. Applied after `standardize`."""
    return "is_" + name if name in RESERVED else name


def standardize_category(category: str) -> str:
    """RapidAPI category -> folder name: `"News, Media"` -> `News_Media`.

    Upstream replaces spaces, commas and slashes, then `__` -> `_` in a single pass, so `___`
    becomes `__`; case and other punctuation are kept.
    """
    return category.replace(" ", "_").replace(",", "_").replace("/", "_").replace("__", "_")


def api_key_name(api_name: str) -> str:
    """The name an agent sends for an API (`change_name(standardize(name))`)."""
    return change_name(standardize(api_name))
