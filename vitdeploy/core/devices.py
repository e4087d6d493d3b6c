"""What users know of their device — a JetPack release, a Jetson module — and what it decides for an artifact.

Users know "Orin Nano, JetPack 6.1", not "trt10". This table turns those names into the TensorRT a JetPack ships
(which picks the target, core/targets.py) and the module's facts that decide a request (DLA cores, FP8). Every row
names the NVIDIA page it comes from; a fact no NVIDIA page we read gave is marked unconfirmed (as in
shared/TENSORRT.md) and never used to refuse a request. Nothing here imports anything heavy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vitdeploy.core import trt_table


@dataclass(frozen=True)
class JetPack:
    """One JetPack release: the TensorRT it ships and the modules it supports."""

    release: str  # "6.1"
    tensorrt: str  # the TensorRT version it ships, e.g. "10.3"
    modules: tuple[str, ...]  # Module.name of every module it supports
    source: str  # the NVIDIA page that gives the row
    unconfirmed: bool = False  # the TensorRT version was not confirmed on an NVIDIA page


@dataclass(frozen=True)
class Module:
    """One Jetson module: what its silicon has (whatever TensorRT runs on it)."""

    name: str  # the name users type, e.g. "orin-nano"
    title: str  # NVIDIA's name, e.g. "Jetson Orin Nano"
    dla_cores: int  # DLA engines on the module (0: none)
    fp8: bool  # FP8 tensor cores (TensorRT's FP8 needs compute capability 8.9+)
    compute: str  # the GPU's compute capability
    source: str
    aliases: tuple[str, ...] = ()


# Sources (one line each, named in the rows below):
_JP_NOTES = "NVIDIA JetPack {v} Release Notes, docs.nvidia.com/jetson/archives/jetpack-archived/jetpack-{d}"
_JP7_PAGE = "NVIDIA JetPack SDK Downloads and Notes, developer.nvidia.com/embedded/jetpack/downloads/archive-{v}"
_DLA_PAGE = ("NVIDIA TensorRT 11.4.1 'Working with DLA' (docs.nvidia.com/deeplearning/tensorrt/11.4.1/inference-library/"
             "work-with-dla.html): DLA on Jetson AGX Orin with JetPack 7.2.2+, Thor has no DLA, 10.7 the last 10.x with DLA")
_DLA_FAQ = ("NVIDIA DLA developer page FAQ (developer.nvidia.com/deep-learning-accelerator): Jetson AGX Orin, Orin NX, "
            "AGX Xavier and Xavier NX have DLA cores; NVIDIA/Deep-Learning-Accelerator-SW README: up to two per SoC")
_FP8 = "NVIDIA TensorRT Support Matrix, 'Hardware and Precision': FP8 needs compute capability 8.9 or newer"

ORIN = ("agx-orin", "orin-nx", "orin-nano")
XAVIER = ("agx-xavier", "xavier-nx")
THOR = ("thor",)

MODULES: tuple[Module, ...] = (
    Module("agx-orin", "Jetson AGX Orin", 2, False, "8.7", f"{_DLA_FAQ}; {_FP8}", ("orin-agx", "agxorin", "orin")),
    Module("orin-nx", "Jetson Orin NX", 2, False, "8.7", f"{_DLA_FAQ} (the 8 GB module has one); {_FP8}", ("orinnx", "nx-orin")),
    Module("orin-nano", "Jetson Orin Nano", 0, False, "8.7", f"{_DLA_FAQ} (Orin Nano is not among them); {_FP8}",
           ("orinnano", "nano-orin", "orin-nano-super")),
    Module("agx-xavier", "Jetson AGX Xavier", 2, False, "7.2", f"{_DLA_FAQ}; {_FP8}", ("xavier-agx", "xavier")),
    Module("xavier-nx", "Jetson Xavier NX", 2, False, "7.2", f"{_DLA_FAQ}; {_FP8}", ("nx-xavier", "xaviernx")),
    Module("thor", "Jetson Thor", 0, True, "11.0 (unconfirmed)", f"{_DLA_PAGE}; {_FP8} (Thor: Blackwell)",
           ("agx-thor", "jetson-thor", "t5000", "t4000")),
)

# The TensorRT each JetPack ships. Marks as in shared/TENSORRT.md: a row is unconfirmed where no NVIDIA page we read
# named its TensorRT version.
JETPACKS: tuple[JetPack, ...] = (
    JetPack("5.1", "8.5.2", ORIN + XAVIER, _JP_NOTES.format(v="5.1.4", d="514")),
    JetPack("6.0", "8.6.2", ORIN, _JP_NOTES.format(v="6.0", d="60"), unconfirmed=True),
    JetPack("6.1", "10.3", ORIN, _JP_NOTES.format(v="6.1", d="61")),
    JetPack("6.2", "10.3", ORIN, "NVIDIA JetPack 6.2 Release Notes, docs.nvidia.com/jetson/jetpack/release-notes"),
    JetPack("7.0", "10.13", THOR, _JP7_PAGE.format(v="7.0"), unconfirmed=True),
    JetPack("7.1", "10.13", THOR, _JP7_PAGE.format(v="7.1"), unconfirmed=True),
    JetPack("7.2", "10.16", THOR + ("agx-orin",), f"{_DLA_PAGE} (TensorRT 11.4.1 from JetPack 7.2.2)", unconfirmed=True),
)


@dataclass(frozen=True)
class DeviceFacts:
    """A device as the user named it, and what it decides: the TensorRT, DLA and FP8."""

    spoken: str  # what the user typed
    jetpack: str | None  # "6.1"
    module: str | None  # Module.name
    tensorrt: str | None  # the TensorRT the JetPack ships
    dla_cores: int | None  # None: no module named (unknown)
    dla: bool | None  # DLA usable here: True, False, or None (unknown / unconfirmed: never refused)
    fp8: bool | None
    sources: tuple[str, ...] = ()
    unconfirmed: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: 'Jetson Orin Nano, JetPack 6.1 (TensorRT 10.3)'."""
        parts = []
        if self.module:
            parts.append(module(self.module).title)
        if self.jetpack:
            parts.append(f"JetPack {self.jetpack}" + (f" (TensorRT {self.tensorrt})" if self.tensorrt else ""))
        return ", ".join(parts) or self.spoken


def module(name: str) -> Module:
    for m in MODULES:
        if m.name == name:
            return m
    raise KeyError(name)


def jetpack(release: str) -> JetPack:
    for j in JETPACKS:
        if j.release == release:
            return j
    raise KeyError(release)


def known_names() -> str:
    """The device names, for an error message."""
    jps = ", ".join(f"jetpack{j.release}" for j in JETPACKS)
    mods = ", ".join(m.name for m in MODULES)
    return f"a JetPack ({jps}), optionally with a module ({mods}), e.g. jetpack6.1-orin-nano"


_JP_RE = re.compile(r"(?:jetpack|jp)[-_ ]?(\d+(?:\.\d+)*)")


def _normalize(text: str) -> str:
    return re.sub(r"[\s_/+@,:]+", "-", text.strip().lower()).strip("-")


def _find_module(text: str) -> tuple[str | None, str]:
    """(module name, the text without it); the longest alias wins ('orin-nano' before 'orin')."""
    cands = sorted(((a, m.name) for m in MODULES for a in (m.name, *m.aliases)), key=lambda t: -len(t[0]))
    for alias, name in cands:
        pat = re.compile(rf"(?:^|-)(?:jetson-)?{re.escape(alias)}(?:-|$)")
        hit = pat.search(text)
        if hit:
            return name, (text[: hit.start()] + "-" + text[hit.end():]).strip("-")
    return None, text


def parse_device(name: str) -> DeviceFacts | None:
    """A JetPack and/or module named the way users write them ('jetpack6.1', 'JetPack 6.1', 'jp6.1',
    'orin-nano-jetpack6.1'); None when the text names neither. Impossible pairs raise ImpossibleRequest."""
    from vitdeploy.core.errors import ImpossibleRequest, UsageError

    text = _normalize(name)
    jp_hit = _JP_RE.search(text)
    release = None
    if jp_hit:
        release = jp_hit.group(1)
        text = (text[: jp_hit.start()] + "-" + text[jp_hit.end():]).strip("-")
    mod, text = _find_module(text)
    if text.replace("-", "") not in ("", "jetson") or (release is None and mod is None):
        return None
    jp: JetPack | None = None
    if release is not None:
        parts = release.split(".")
        key = ".".join(parts[:2]) if len(parts) > 1 else f"{parts[0]}.0"
        try:
            jp = jetpack(key)
        except KeyError:
            return None
    if mod is not None and jp is not None and mod not in jp.modules:
        raise ImpossibleRequest(f"{name}: JetPack {jp.release} does not support the {module(mod).title} "
                                f"(it supports {', '.join(module(m).title for m in jp.modules)})")
    if jp is None:
        assert mod is not None
        cands = [j for j in JETPACKS if mod in j.modules]
        lines = {_line(j.tensorrt) for j in cands}
        if len(lines) != 1:
            raise UsageError(f"{name}: the {module(mod).title} runs JetPack "
                             + ", ".join(j.release for j in cands)
                             + f", which ship different TensorRT versions: name the JetPack too, e.g. "
                             f"jetpack{cands[-1].release}-{mod}")
        jp = cands[0]
        release = None
    return _facts(name, jp, mod, release is not None)


def _line(version: str) -> str:
    """The version table's row (core/trt_table.py): two JetPacks whose TensorRT share a row make the same artifact."""
    return trt_table.row_of(version)


def _facts(spoken: str, jp: JetPack, mod: str | None, jp_named: bool) -> DeviceFacts:
    sources = [jp.source] if jp_named else []
    unconfirmed = [f"TensorRT {jp.tensorrt} on JetPack {jp.release}"] if jp.unconfirmed and jp_named else []
    dla: bool | None = None
    cores: int | None = None
    fp8: bool | None = None
    if mod is not None:
        m = module(mod)
        sources.append(m.source)
        cores, fp8 = m.dla_cores, m.fp8
        if m.dla_cores == 0:
            dla = False
        elif jp_named:
            trt_dla = trt_table.has_dla(jp.tensorrt)
            if trt_dla is True and not jp.unconfirmed:
                dla = True
            elif trt_dla is False and not jp.unconfirmed:
                dla = False
            else:
                unconfirmed.append(f"DLA with TensorRT {jp.tensorrt} on JetPack {jp.release}")
    return DeviceFacts(spoken, jp.release if jp_named else None, mod, jp.tensorrt if jp_named else None, cores, dla,
                       fp8, tuple(sources), tuple(unconfirmed))
