"""The one sanitiser for text a person reads: labels and file names on the terminal, in reports and in CSV cells.

Labels and file names come from outside (a model someone sent, a folder of photos): an id2label entry
``"\\x1b[2J"`` would clear the screen, a newline in a label would forge report lines, a right-to-left override
(U+202E) would show ``cod.exe`` as ``exe.doc``, a BOM or zero-width character would make two labels that print
the same. Decision (docs/cli.md): vitdeploy keeps labels as the model says them (the manifest, JSON and
labels.txt carry them exactly) and escapes them wherever they are shown; it refuses nothing.

- ``printable(text)``: every control (C0, DEL, C1), format (bidi controls, zero-width, BOM), line/paragraph
  separator and lone surrogate (a file name that is not UTF-8) becomes a visible escape: ``\\x1b``, ``\\n``,
  ``\\u202e``, ``\\xff``. Other text, including non-ASCII letters and emoji, is kept as it is. A backslash is kept
  too: a name that already holds ``\\n`` as two characters reads the same (readability over round-tripping; JSON
  carries the exact text).
- ``printable(text, keep_newlines=True)``: the same but line breaks and tabs stay: the CLI's consoles pass every
  segment they write through it (cli/app.py), so nothing a command prints can reach the terminal as a control.
- ``csv_cell(text)``: ``printable`` plus the OWASP rule against spreadsheet formula injection: a cell that starts
  with ``= + - @`` (or a tab or carriage return) is prefixed with ``'``.
- ``strip_bom(text)``: a label file saved by Notepad starts with U+FEFF, which would become part of the first label.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

_UNSAFE_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, decoded with surrogateescape: show the byte
        return f"\\x{o - 0xDC00:02x}"
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def unsafe(c: str) -> bool:
    """A character that moves the cursor, changes the terminal, reorders or hides text, or breaks a line."""
    return unicodedata.category(c) in _UNSAFE_CATEGORIES


def printable(text: object, keep_newlines: bool = False) -> str:
    """``text`` (a str, a path, anything with a str()) with every unsafe character escaped (see the module doc)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable() and not any(c in s for c in "\u2028\u2029"):  # the common case: nothing to do
        return s
    keep = "\n\t" if keep_newlines else ""
    return "".join(_escape(c) if unsafe(c) and c not in keep else c for c in s)


def printable_list(items: Iterable[object], sep: str = ", ") -> str:
    """Labels joined for one line, each escaped."""
    return sep.join(printable(x) for x in items)


def csv_cell(value: object) -> object:
    """A CSV cell: text escaped and, where it would start a formula, prefixed with ``'``; numbers as they are."""
    if not isinstance(value, str):
        return value
    s = printable(value)
    return "'" + s if s.startswith(FORMULA_STARTS) else s


def strip_bom(text: str) -> str:
    """Text without a leading byte-order mark (U+FEFF), as a label file saved by Notepad starts."""
    return text[1:] if text.startswith("\ufeff") else text


# What one line of labels.txt (run.py, Triton, the C++ example) cannot hold in a label: every character
# str.splitlines() breaks on (\n \r \v \f \x1c-\x1e \x85 \u2028 \u2029) and the other C0/C1 controls (terminal escapes).
NOT_IN_A_LABEL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def label_problem(label: str) -> str | None:
    """Why ``label`` cannot be one line of labels.txt (the offending character, escaped), or None when it can: one
    rule for the bundle's labels.txt and for the class names a zero-shot classifier is made from."""
    bad = NOT_IN_A_LABEL.search(label)
    if bad is None:
        return None
    return f"holds {bad.group().encode('unicode_escape').decode('ascii')} (a line break or control character)"
