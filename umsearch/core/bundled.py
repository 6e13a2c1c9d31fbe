"""Where the bundled search spaces and profiles are, installed or in a checkout.

They live in ``search_spaces/`` and ship as the package ``umsearch.data``
(``setup.cfg`` maps one onto the other), so the same lookup works after
``pip install .``, in an editable install and in a fresh clone.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def data_dir() -> Path:
    """The folder holding ``default.toml`` and ``profiles/``."""
    try:
        root = Path(str(resources.files("umsearch.data")))
    except ModuleNotFoundError:  # running from a checkout that was never installed
        root = Path(__file__).resolve().parents[2] / "search_spaces"
    return root


def default_space() -> Path:
    """The space ``umsearch search`` runs without arguments."""
    return data_dir() / "default.toml"
