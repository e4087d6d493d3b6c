"""The ``.files.txt`` format: the file names beside a ``.npy`` of vectors, one line per row, in the rows' order.

Written by ``vitdeploy infer -o emb.npy``, the bundle's run.py (``--out``) and its C++ example, byte for byte alike
(run.py and the C++ example carry their own copy of this rule; a test holds the copies to this one). A file name may
hold any byte but ``/`` and NUL, so each is escaped into one line that means one name (issue 40: ``a<LF>b.png`` and a
file literally named ``a\\nb.png`` used to give the same line):

- a backslash is written ``\\\\``;
- a line feed ``\\n``, a carriage return ``\\r``, a tab ``\\t``; every other ASCII control (0x00-0x1f, 0x7f) ``\\xNN``;
- a byte that is not part of valid UTF-8 (a Linux name may hold one) ``\\xNN`` (NN 80-ff): ``\\xNN`` is always byte NN;
- the C1 controls (U+0080-U+009F), the bidirectional marks and overrides (U+200E, U+200F, U+202A-U+202E,
  U+2066-U+2069), the line and paragraph separators (U+2028, U+2029) and the BOM (U+FEFF) ``\\uXXXX``: the code point,
  written as UTF-8;
- everything else as it is, in UTF-8.

``read_file_list`` undoes it exactly: each line gives back the name's bytes (as ``os.fsdecode`` gives them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# what a line escapes besides the backslash: ASCII controls, C1 controls, bidi marks/overrides, separators, the BOM,
# and the surrogates os.fsdecode makes of bytes that are not UTF-8 (U+DC80-U+DCFF; other lone surrogates too)
_ESCAPED = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_TOKEN = re.compile(r"\\(\\|n|r|t|x[0-9a-f]{2}|u[0-9a-f]{4})")
_UNNAMED = {"\\": "\\", "n": "\n", "r": "\r", "t": "\t"}


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    if o < 0x80:
        return f"\\x{o:02x}"
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, decoded with surrogateescape: the byte itself
        return f"\\x{o - 0xDC00:02x}"
    return f"\\u{o:04x}"


def file_list_line(name: str | os.PathLike[str] | bytes) -> str:
    """One line of a ``.files.txt`` (no line end): the name, escaped as the module doc says."""
    s = os.fsdecode(name)
    return _ESCAPED.sub(lambda m: _escape(m.group()), s)


def parse_file_list_line(line: str) -> str:
    """The name one line means (as ``os.fsdecode`` gives a name: bytes that are not UTF-8 as surrogates); ValueError
    for a backslash that begins no escape of the format."""
    out = bytearray()
    pos = 0
    for m in _TOKEN.finditer(line):
        _literal(out, line, line[pos:m.start()])
        t = m.group(1)
        if t in _UNNAMED:
            out += _UNNAMED[t].encode()
        elif t[0] == "x":
            out.append(int(t[1:], 16))
        else:
            out += chr(int(t[1:], 16)).encode("utf-8", "surrogatepass")
        pos = m.end()
    _literal(out, line, line[pos:])
    return os.fsdecode(bytes(out))


def _literal(out: bytearray, line: str, text: str) -> None:
    if "\\" in text:
        raise ValueError(f"{line!r}: a backslash that begins no escape (\\\\, \\n, \\r, \\t, \\xNN, \\uXXXX)")
    out += text.encode("utf-8", "surrogateescape")


def read_file_list(path: str | Path) -> list[str]:
    """The names of a ``.files.txt``, one per row of its ``.npy``, exactly as they were on disk."""
    text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    return [parse_file_list_line(line) for line in text.split("\n")[:-1]] if text else []
