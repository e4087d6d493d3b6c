"""What a model answers: a classifier (logits over named classes) or an embedding model (a vector per image).

The task is kept in one place, the way Polygraphy keeps one comparator and NVIDIA's TensorRT-Model-Connect keeps a
task strategy apart from the model: the manifest records it (key ``task``), ``info`` shows it, and
``checks/judge.py`` reads it to decide which comparison, which figures and which budget judge an artifact. Commands
ask the task, never the family. A zero-shot CLIP/SigLIP classifier and a linear probe are classifiers: their text
matrix or head is folded into the graph.

A manifest made before tasks existed has no ``task`` key: it is a classifier when its model has classes, else an
embedding model of the model's pooled width (the 0-class backbones older imports wrote).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vitdeploy.core.errors import UsageError, VitdeployError

CLASSIFIER = "classifier"
EMBEDDING = "embedding"
KINDS = (CLASSIFIER, EMBEDDING)
# The names of the graph's outputs: the one a runner returns first, and the optional per-patch tokens
LOGITS_OUTPUT = "logits"
EMBEDDING_OUTPUT = "embedding"
TOKENS_OUTPUT = "patch_tokens"
# --pool: how an embedding model pools its tokens when the family has the choice (ViTConfig.embed_pool)
POOLS = ("cls", "mean", "cls+mean")


@dataclass(frozen=True)
class Task:
    """A model's task and, for an embedding model, what its vector is.

    ``dim``: logits per image (classifier) or the embedding's width. ``pool``: how the tokens became one vector
    ("cls", "mean", "cls+mean", "map", "avg", "token_avg", "distilled"). ``projection``: a projection after the
    pooling (CLIP's visual projection). ``normalize``: L2-normalised in the graph. ``tokens``: a second output
    ``patch_tokens`` [batch, patches, width]. ``register_tokens``: the register tokens dropped from patch_tokens.
    ``zero_shot``: for a classifier made from class names, the templates and the SHA-256 of the text matrix.
    """

    kind: str = CLASSIFIER
    dim: int = 0
    pool: str = ""
    projection: bool = False
    normalize: bool = False
    tokens: bool = False
    register_tokens: int = 0
    zero_shot: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise VitdeployError(f"unknown task {self.kind!r}: a model is one of {', '.join(KINDS)}")

    @property
    def is_embedding(self) -> bool:
        return self.kind == EMBEDDING

    @property
    def output(self) -> str:
        """The name of the graph's first output."""
        return EMBEDDING_OUTPUT if self.is_embedding else LOGITS_OUTPUT

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output, TOKENS_OUTPUT) if self.tokens else (self.output,)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v not in (None, "", False) or k in ("kind", "dim")}
        if not self.is_embedding:
            for k in ("pool", "projection", "normalize", "tokens", "register_tokens"):
                d.pop(k, None)
        return d

    def describe(self) -> str:
        """One line for info and the tables: 'classifier, 10 classes' / 'embedding 384-d (cls, L2-normalised)'."""
        if not self.is_embedding:
            what = f"classifier, {self.dim} classes"
            if self.zero_shot:
                n = len(self.zero_shot.get("templates") or [])
                what += f" (zero-shot from class names, {n} template{'s' if n != 1 else ''})"
            if self.probe:
                what += f" (a {self.probe.get('kind', 'linear')} probe on frozen {self.probe.get('features', '')} features)"
            return what
        parts = [self.pool or "pooled"]
        if self.projection:
            parts.append("projected")
        if self.normalize:
            parts.append("L2-normalised")
        if self.tokens:
            parts.append(f"+ patch tokens{f', {self.register_tokens} registers dropped' if self.register_tokens else ''}")
        return f"embedding {self.dim}-d ({', '.join(parts)})"


def pool_of(model: dict[str, Any]) -> str:
    """How a model's config pools (the manifest's "model"): embed_pool where set, else its head's pooling."""
    if model.get("embed_pool"):
        return str(model["embed_pool"])
    if model.get("distilled"):
        return "distilled"
    legacy = str(model.get("pool", "cls"))  # the manifest's older name: cls, mean, or timm's own (map, token_avg)
    gp = model.get("global_pool") or {"cls": "token", "mean": "avg"}.get(legacy, legacy)
    return {"token": "cls", "token_avg": "cls+mean"}.get(gp, gp)


def task_from_model(model: dict[str, Any], *, normalize: bool | None = None, tokens: bool = False) -> Task:
    """The task a model config implies: a classifier with its classes, or the embedding its pooled output is."""
    n = int(model.get("num_classes", 0) or 0)
    if n > 0:
        return Task(CLASSIFIER, n)
    width = int(model.get("embed_dim", 0))
    pooled = 2 * width if pool_of(model) == "cls+mean" else width
    proj = int(model.get("proj_dim", 0) or 0)
    return Task(
        EMBEDDING,
        proj or pooled,
        pool=pool_of(model),
        projection=bool(proj),
        normalize=bool(model.get("l2_norm", False)) if normalize is None else normalize,
        tokens=tokens,
        register_tokens=int(model.get("reg_tokens", 0) or 0),
    )


def task_of(manifest: Any) -> Task:
    """The task of a manifest (core.manifest.Manifest): its ``task`` entry, else what its model config implies."""
    raw = manifest.extra.get("task") if hasattr(manifest, "extra") else None
    if isinstance(raw, dict):
        known = set(Task.__dataclass_fields__)
        try:
            return Task(**{k: v for k, v in raw.items() if k in known})
        except TypeError as e:
            raise VitdeployError(f"the manifest's task entry is damaged ({e})") from None
    return task_from_model(manifest.model)


def require_classifier(manifest: Any, what: str, instead: str = "") -> Task:
    """The task, when it is a classifier; an embedding model is one line naming what to do instead (exit 2)."""
    task = task_of(manifest)
    if task.is_embedding:
        tail = f"; {instead}" if instead else ""
        raise UsageError(f"{what} needs a classifier, and this is an {task.describe()}{tail}")
    return task
