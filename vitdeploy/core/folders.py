"""What is wrong with a path given where a folder is wanted, in words that are true of it (issue 40: ``--gallery
FILE`` said "no such folder" for a file that exists)."""

from __future__ import annotations

from pathlib import Path


def not_a_folder(path: str | Path) -> str:
    """Why ``path`` is not a folder: "no such folder" where nothing is there, "is a file, not a folder" for a file,
    "is not a folder" for anything else (a FIFO, a device, a dangling link)."""
    p = Path(path)
    if p.is_file():
        return "is a file, not a folder"
    if not p.exists() and not p.is_symlink():
        return "no such folder"
    return "is not a folder"
