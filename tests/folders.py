"""What the output-folder tests share: fill a staging folder with texts, read a folder's files back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def fill_with(names: dict[str, str]) -> Callable[[Path], None]:
    """A ``fill`` for :meth:`umsearch.storage.output_folder.OutputFolder.write` writing ``names`` (name -> text)."""

    def fill(stage: Path) -> None:
        for name, text in names.items():
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_text(text)

    return fill


def tree(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (links not followed) and its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}  # fmt: skip
