"""Zero-shot text that means what it says (issue 40, C, F, G and H's zero-shot lines), on small CLIP, SigLIP and
open_clip pairs built offline with their own libraries (tests/foundation_pairs.py).

- A prompt that does not fit the text context is refused in one line naming the template, the class and the token
  count (on 4f50930 ``truncation=True`` cut it, and a cut before ``{}`` gave every class one vector, exit 0).
- Two distinct class names whose vectors come out equal are refused naming both (a lower-casing tokenizer, a
  vocabulary that has never seen the script): on 4f50930, exit 0 and a classifier that cannot tell them apart.
- The text tower's sizes come from its config, within core/limits and equal to the weights', before anything is
  allocated (an open_clip context_length of 10**9 asked 256 GB; 1 was silently resized).
- A tokenizer or text config the library cannot read is ``FILE: what is wrong; what to do``, exit 1.
- Long lists are checked and encoded in batches, with progress in phases; the batches answer as one class at a time.
- One class, a tab inside a class name, ``--templates openai`` beside a file named ``openai``: one line, exit 2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

# --- fast: no pair, no torch ----------------------------------------------------------------------------------


def test_one_class_is_refused_as_the_probe_refuses_it(tmp_path: Path) -> None:
    """A softmax over one class scores 1.000 on every image (4f50930 imported it, while train --probe refused one
    class): one line, exit 2."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.zero_shot import read_class_names

    (tmp_path / "one.txt").write_text("cat\n")
    with pytest.raises(UsageError, match=r"only one class \('cat'\); a classifier needs at least two class names"):
        read_class_names(tmp_path / "one.txt")
    (tmp_path / "two.txt").write_text("cat\ndog\n")
    assert read_class_names(tmp_path / "two.txt") == ["cat", "dog"]


def test_a_tab_inside_a_class_name_is_refused_as_the_docs_say(tmp_path: Path) -> None:
    """docs/commands.md: a name holding a control character is refused; 4f50930 accepted a tab inside one (tabs
    around a name are still trimmed)."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.zero_shot import read_class_names

    (tmp_path / "c.txt").write_text("cat\nblack\tdog\n")
    with pytest.raises(UsageError, match=r"line 2 'black\\tdog' holds \\t \(a control character\)"):
        read_class_names(tmp_path / "c.txt")
    (tmp_path / "ok.txt").write_text("\tcat \nblack dog\t\n")
    assert read_class_names(tmp_path / "ok.txt") == ["cat", "black dog"]


def test_templates_openai_beside_a_file_named_openai_is_refused_as_ambiguous(tmp_path: Path, monkeypatch: Any) -> None:
    """4f50930 took open_clip's table and ignored ./openai without a word. Decision: the ambiguity is refused (exit 2,
    one line, before any work), and ``./openai`` names the file; without a file of that name the table is taken."""
    from vitdeploy.model.zero_shot import read_templates

    monkeypatch.chdir(tmp_path)
    (tmp_path / "openai").write_text("a drawing of a {}.\n")
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    r = CliRunner().invoke(app, ["import", "no_such_pair", "--classes", "classes.txt", "--templates", "openai",
                                 "-o", "out.pth"], terminal_width=400)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "--templates openai: both open_clip's openai table and the file ./openai here; write --templates ./openai" \
        in lines[0]
    assert read_templates("./openai") == ["a drawing of a {}."]
    assert read_templates(Path("openai")) == ["a drawing of a {}."]  # a Path is a file, never a table name
    assert not (tmp_path / "out.pth").exists()


def test_the_prompt_ceiling_lives_in_core_limits_and_the_help(tmp_path: Path) -> None:
    """classes × templates past core/limits' ``prompts`` is refused before any weights are read (a template file
    of 81 lines × 123,457 classes: 10,000,017 prompts), and --help states the ceiling."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.limits import bounds
    from vitdeploy.model.zero_shot import ZeroShotRequest, check_zero_shot

    top = int(bounds("prompts")["max"])
    assert top == 10_000_000
    n = top // 81 + 1
    (tmp_path / "c.txt").write_text("".join(f"class {i}\n" for i in range(n)))
    (tmp_path / "t.txt").write_text("".join(f"photo {i} of a {{}}.\n" for i in range(81)))
    with pytest.raises(UsageError, match=rf"{n:,} classes × 81 templates = {n * 81:,} prompts, more than the "
                                         rf"{top:,} one import encodes \(core/limits.py\)"):
        check_zero_shot(tmp_path / "no_pair", ZeroShotRequest(tmp_path / "c.txt", str(tmp_path / "t.txt")))
    r = CliRunner().invoke(app, ["import", "--help"], terminal_width=400)
    assert f"{top:,} prompts (classes × templates)" in " ".join(r.output.split())


def test_text_sizes_past_core_limits_are_refused_naming_the_field_before_torch(tmp_path: Path) -> None:
    """open_clip's context_length 10**9 (4f50930: "tried to allocate 256000000000 bytes", no field named) or 1 (4f50930:
    resized silently, every class one vector), a transformers text_config with max_position_embeddings 1 or a
    vocab_size of 10**9: one line naming the file and the field, exit 1, before torch is imported."""
    from cli_cases import run_cli_cases

    def open_clip_folder(name: str, **text: Any) -> Path:
        d = tmp_path / name
        d.mkdir()
        cfg = {"model_cfg": {"embed_dim": 24, "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8},
                             "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2,
                                          **text}},
               "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3}}
        (d / "open_clip_config.json").write_text(json.dumps(cfg))
        return d

    def hf_folder(name: str, **text: Any) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "clip", "architectures": ["CLIPModel"],
                                                   "text_config": {"max_position_embeddings": 32, **text},
                                                   "vision_config": {}}))
        (d / "tokenizer.json").write_text("{}")
        return d

    (tmp_path / "c.txt").write_text("cat\ndog\n")
    cases = [
        (open_clip_folder("huge", context_length=10**9),
         "open_clip_config.json: model_cfg.text_cfg.context_length 1000000000 must be a whole number from 2 to 8192"),
        (open_clip_folder("one", context_length=1), "model_cfg.text_cfg.context_length 1 must be a whole number from 2"),
        (open_clip_folder("vocab", vocab_size=-5), "model_cfg.text_cfg.vocab_size -5 must be a whole number from 2"),
        (hf_folder("hf_one", max_position_embeddings=1),
         "config.json: text_config.max_position_embeddings 1 must be a whole number from 2 to 8192; fix config.json"),
        (hf_folder("hf_vocab", vocab_size=10**9), "config.json: text_config.vocab_size 1000000000 must be a whole number"),
    ]
    rows = run_cli_cases([["import", str(d), "--classes", "c.txt", "-o", "out.pth"] for d, _ in cases], tmp_path)
    for (d, says), r in zip(cases, rows, strict=True):
        print(f"{d.name}: exit {r.code}: {r.lines()}")
        assert r.code == 1 and len(r.lines()) == 1 and says in r.lines()[0], (d.name, r.stderr)
        assert str(d) in r.lines()[0]
        assert not r.loaded("torch"), f"{d.name}: torch imported before the refusal"
    assert not (tmp_path / "out.pth").exists()


# --- the pairs: CLIP, SigLIP, open_clip, and their foreign-file variants -----------------------------------------


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import foundation_pairs as fp
    import torch

    root = tmp_path_factory.mktemp("pairs")
    torch.manual_seed(0)
    clip_tok = fp.clip_bpe_tokenizer(root / "clip_bpe")
    out = {"hf_clip": fp.hf_clip(root, clip_tok), "hf_siglip": fp.hf_siglip(root, fp.siglip_tokenizer(root / "spm")),
           "clip_bpe": root / "clip_bpe"}
    out["open_clip"] = fp.open_clip_pair(root, out["hf_clip"])
    return out


def _variants(pairs: dict[str, Path], root: Path) -> dict[str, Path]:
    """Each foreign-file defect of issue 40 F and G, made from a good pair by what a careless copy or edit does."""
    from safetensors.torch import load_file, save_file

    def cp(src: str, name: str) -> Path:
        return Path(shutil.copytree(pairs[src], root / name))

    def edit(f: Path, fn: Any) -> None:
        j = json.loads(f.read_text())
        fn(j)
        f.write_text(json.dumps(j))

    def cut(f: Path) -> None:
        b = f.read_bytes()
        f.write_bytes(b[: len(b) // 2])

    def tensors(d: Path, fn: Any) -> None:
        sd = load_file(d / "model.safetensors")
        fn(sd)
        save_file(sd, d / "model.safetensors")

    v = {}
    v["vocab_cut"] = d = cp("hf_clip", "vocab_cut")  # CLIP's BPE as vocab.json + merges.txt, the vocab cut short
    (d / "tokenizer.json").unlink()
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(pairs["clip_bpe"] / f, d)
    cut(d / "vocab.json")
    v["spiece_foreign"] = d = cp("hf_siglip", "spiece_foreign")
    (d / "spiece.model").write_bytes(b"this is no sentencepiece model\n" * 40)
    v["projection"] = d = cp("hf_siglip", "projection")
    edit(d / "config.json", lambda j: j["text_config"].update(projection_size=32))
    v["context_1"] = d = cp("hf_clip", "context_1")
    edit(d / "config.json", lambda j: j["text_config"].update(max_position_embeddings=1))
    v["context_16"] = d = cp("hf_clip", "context_16")  # within the limits, but not the weights' 32
    edit(d / "config.json", lambda j: j["text_config"].update(max_position_embeddings=16))
    v["oc_context_1"] = d = cp("open_clip", "oc_context_1")
    edit(d / "open_clip_config.json", lambda j: j["model_cfg"]["text_cfg"].update(context_length=1))
    v["oc_context_huge"] = d = cp("open_clip", "oc_context_huge")
    edit(d / "open_clip_config.json", lambda j: j["model_cfg"]["text_cfg"].update(context_length=10**9))
    v["big_vocab"] = d = cp("hf_siglip", "big_vocab")  # CLIP's 49408-entry tokenizer beside SigLIP's 207 embeddings
    (d / "spiece.model").unlink()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pairs["hf_clip"] / f, d)
    v["oc_embed_dim"] = d = cp("open_clip", "oc_embed_dim")
    edit(d / "open_clip_config.json", lambda j: j["model_cfg"].update(embed_dim=32))
    v["tokenizer_json_cut"] = d = cp("hf_clip", "tokenizer_json_cut")
    cut(d / "tokenizer.json")
    v["tokenizer_config_cut"] = d = cp("hf_clip", "tokenizer_config_cut")
    cut(d / "tokenizer_config.json")
    v["nan_scale"] = d = cp("hf_siglip", "nan_scale")
    tensors(d, lambda sd: sd["logit_scale"].fill_(float("nan")))
    v["nan_bias"] = d = cp("hf_siglip", "nan_bias")
    tensors(d, lambda sd: sd["logit_bias"].fill_(float("nan")))
    v["no_bias"] = d = cp("hf_siglip", "no_bias")
    tensors(d, lambda sd: sd.pop("logit_bias"))
    return v


def _one_line(r: Any) -> list[str]:
    return [ln for ln in r.lines() if not ln.startswith("importing ")]  # the progress line of the heavy cases


@pytest.mark.slow
def test_tokenizer_and_text_config_errors_name_the_file_and_what_to_do(pairs: dict[str, Path], tmp_path: Path) -> None:
    """Each raw library error of issue 40 F (and G's 256 GB context) is now ``FILE: what is wrong; what to do``: exit
    1 (2 for weights that lack a tensor), one line, nothing written. What 4f50930 said is in each comment."""
    from cli_cases import run_cli_cases

    v = _variants(pairs, tmp_path)
    (tmp_path / "c.txt").write_text("cat\ndog\nrocket\n")
    cases = [
        # Exception: Error while initializing BPE: EOF while parsing a string …
        ("vocab_cut", 1, "vocab_cut/vocab.json: not valid JSON (", "the file is cut or damaged; save the tokenizer again"),
        # RuntimeError: INTERNAL: could not parse ModelProto from …/spiece.model
        ("spiece_foreign", 1, "spiece_foreign/spiece.model: not a sentencepiece model (", "save the tokenizer again"),
        # RuntimeError: You set `ignore_mismatched_sizes` to `False` … look at the above report!
        ("projection", 1, "projection/config.json: text_config.projection_size makes text_model.head.",
         "fix text_config.projection_size in config.json"),
        # the same ignore_mismatched_sizes line (the issue saw a ValueError)
        ("context_1", 1, "context_1/config.json: text_config.max_position_embeddings 1 must be a whole number from 2 to",
         "fix config.json"),
        ("context_16", 1, "context_16/config.json: text_config.max_position_embeddings 16 must be the weights' 32 "
         "(text_model.embeddings.position_embedding.weight is [32, 64] in model.safetensors)", "fix config.json"),
        # exit 0: open_clip resized the position embeddings to 1, every prompt one token, every class one vector
        ("oc_context_1", 1, "oc_context_1/open_clip_config.json: model_cfg.text_cfg.context_length 1 must be",
         "fix open_clip_config.json"),
        # DefaultCPUAllocator: can't allocate memory: you tried to allocate 256000000000 bytes
        ("oc_context_huge", 1, "model_cfg.text_cfg.context_length 1000000000 must be a whole number from 2 to 8192",
         "fix open_clip_config.json"),
        # IndexError: index out of range in self
        ("big_vocab", 1, "big_vocab/tokenizer.json: the tokenizer gives token id 49407 for",
         "past the text model's 207 embeddings (its vocab_size): this tokenizer is not the model's"),
        # open_clip cannot load the model (Error(s) in loading state_dict for CLIP:)
        ("oc_embed_dim", 1, "oc_embed_dim/open_clip_config.json: model_cfg.embed_dim 32 must be the weights' 24 "
         "(text_projection is [64, 24] in open_clip_model.safetensors)", "fix open_clip_config.json"),
        # transformers cannot load the pair (Expecting value: line 96699 column 6 (char 1810128))
        ("tokenizer_json_cut", 1, "tokenizer_json_cut/tokenizer.json: not valid JSON (", "save the tokenizer again"),
        ("tokenizer_config_cut", 1, "tokenizer_config_cut/tokenizer_config.json: not valid JSON (", "save the tokenizer"),
        # logit scale nan / bias -2.5: not finite numbers
        ("nan_scale", 1, "nan_scale/model.safetensors: tensor logit_scale is nan, not one finite number",
         "use the pair's original weights"),
        ("nan_bias", 1, "nan_bias/model.safetensors: tensor logit_bias is nan, not one finite number",
         "use the pair's original weights"),
        # the weights lack the text tower (logit_bias)
        ("no_bias", 2, "no_bias/model.safetensors: no tensor logit_bias (the pair's learned logit bias)",
         "save the whole pair (model.save_pretrained)"),
    ]
    rows = run_cli_cases([["import", str(v[name]), "--classes", "c.txt", "-o", "out.pth"] for name, *_ in cases],
                         tmp_path, timeout=600)
    for (name, code, says, todo), r in zip(cases, rows, strict=True):
        lines = _one_line(r)
        print(f"{name}: exit {r.code}: {lines}")
        assert r.code == code and len(lines) == 1, (name, r.code, r.stderr)
        assert says in lines[0] and todo in lines[0], (name, lines[0])
        assert "lacks the text tower" not in lines[0] and "Traceback" not in r.stderr
        assert r.changed == [], (name, r.changed)


@pytest.mark.slow
def test_a_prompt_past_the_text_context_is_refused_naming_template_class_and_tokens(pairs: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    """A 10,000-character class name, and a template long enough that ``{}`` falls past the cut (4f50930: every class
    the same vector, exit 0), on each pair: exit 2, one line naming the class, its line, the template, the token count
    and where the context comes from; nothing written."""
    from cli_cases import run_cli_cases

    (tmp_path / "long.txt").write_text("cat\n" + "x" * 10_000 + "\ndog\n")
    (tmp_path / "c.txt").write_text("cat\ndog\nrocket\n")
    template = "a photo of " + "a very " * 30 + "nice {}."
    (tmp_path / "t.txt").write_text(template + "\n")
    context = {"hf_clip": "text_config.max_position_embeddings in", "hf_siglip": "text_config.max_position_embeddings in",
               "open_clip": "model_cfg.text_cfg.context_length in"}
    argv, says = [], []
    for name in ("hf_clip", "hf_siglip", "open_clip"):
        argv.append(["import", str(pairs[name]), "--classes", "long.txt", "--templates", "simple", "-o", "out.pth"])
        says.append(["the prompt of class 'xxxxxxxxxx", "(10,000 characters)' (line 2 of --classes) in template '",
                     " tokens, past the 32 the text tower reads (", context[name], "vitdeploy does not cut prompts"])
        argv.append(["import", str(pairs[name]), "--classes", "c.txt", "--templates", "t.txt", "-o", "out.pth"])
        says.append(["the prompt of class 'cat' (line 1 of --classes) in template 'a photo of a very a very",
                     "past the 32 the text tower reads", "shorten the class name or the template"])
    rows = run_cli_cases(argv, tmp_path, timeout=600)
    for a, want, r in zip(argv, says, rows, strict=True):
        lines = _one_line(r)
        print(f"{a[1]} {a[3]}: exit {r.code}: {lines}")
        assert r.code == 2 and len(lines) == 1, (a, r.stderr)
        assert all(w in lines[0] for w in want), (a, lines[0])
        tokens = int(lines[0].split(" tokens, past")[0].rsplit(" ", 1)[1].replace(",", ""))
        assert tokens > 32
        assert r.changed == []


@pytest.mark.slow
def test_class_names_whose_vectors_come_out_equal_are_refused_naming_both(pairs: dict[str, Path], tmp_path: Path) -> None:
    """open_clip's CLIP tokenizer lower-cases ('cat' and 'Cat' are the same tokens); the SigLIP pair's sentencepiece
    vocabulary has never seen Chinese ('猫' and '狗' are both <unk>): 4f50930 made a classifier that answers the
    same logit for both (exit 0). Now exit 1, one line naming both and the cause. Names the tokenizer separates
    still import."""
    from cli_cases import run_cli_cases

    (tmp_path / "case.txt").write_text("cat\ndog\nCat\n")
    (tmp_path / "zh.txt").write_text("rocket\n猫\n狗\n", encoding="utf-8")
    (tmp_path / "ok.txt").write_text("cat\ndog\nrocket\n")
    cases = [(["import", str(pairs["open_clip"]), "--classes", "case.txt"],
              "classes 'cat' (line 1) and 'Cat' (line 3) get the same text vector (cosine 1.000000)"),
             (["import", str(pairs["hf_siglip"]), "--classes", "zh.txt", "--templates", "simple"],
              "classes '猫' (line 2) and '狗' (line 3) get the same text vector")]
    rows = run_cli_cases([[*a, "-o", "out.pth"] for a, _ in cases] +
                         [["import", str(pairs["hf_siglip"]), "--classes", "ok.txt", "--templates", "simple", "-o",
                           "ok.pth"]], tmp_path, timeout=600)
    for (a, says), r in zip(cases, rows, strict=False):
        lines = _one_line(r)
        print(f"{a[1]} {a[3]}: exit {r.code}: {lines}")
        assert r.code == 1 and len(lines) == 1 and says in lines[0], (a, r.stderr)
        assert "the classifier could not tell them apart; the tokenizer (" in lines[0]
        assert "turns both into the same tokens" in lines[0]
        assert not (tmp_path / "out.pth").exists()
    assert rows[-1].code == 0, rows[-1].stderr
    assert (tmp_path / "ok.pth").is_file()


@pytest.mark.slow
def test_batches_answer_as_one_class_at_a_time_and_report_each_phase(pairs: dict[str, Path]) -> None:
    """40 classes × 80 templates (3,200 prompts, 4 batches of 12 classes and one of 4): the class matrix equals the
    one each class gets alone (cosine >= 0.99999), and progress reports every phase up to its total."""
    import torch
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    from vitdeploy.model.zero_shot import PROMPTS_PER_BATCH, class_embeddings, open_pair, read_templates, text_tower

    templates = read_templates("openai")
    # distinct words: a random tower's vectors of "object 12" and "object 21" (the same tokens) are 0.9999 apart
    classes = list(dict.fromkeys(c for c in IMAGENET_CLASSNAMES if len(c) <= 12))[:40]
    assert len(classes) * len(templates) > 3 * PROMPTS_PER_BATCH
    tower = text_tower(*open_pair(pairs["hf_clip"]))
    seen: list[tuple[int, int, str]] = []
    w = class_embeddings(tower, classes, templates, lambda done, total, phase: seen.append((done, total, phase)))
    alone = torch.cat([class_embeddings(tower, [c], templates) for c in classes[::13]])
    cos = (w[::13] * alone).sum(-1)
    print(f"batched vs one class at a time: cosine min {float(cos.min()):.8f}; progress: {seen}")
    assert float(cos.min()) >= 0.99999
    phases = [p for _, _, p in seen]
    assert phases.index("checking prompts") < phases.index("text tower") < phases.index("comparing classes")
    last = {p: (d, t) for d, t, p in seen}
    assert last["checking prompts"] == last["text tower"] == (3200, 3200)
    assert last["comparing classes"] == (40, 40)
    assert phases.count("text tower") == 4  # 1,024 prompts a forward: 12 classes × 80 templates, four times


@pytest.mark.slow
def test_the_bar_clock_runs_through_each_phase(pairs: dict[str, Path], tmp_path: Path, monkeypatch: Any) -> None:
    """The text tower's pass has the check pass's total, and rich kept the check's finished clock for it: through the
    whole encode of 10,000 classes × 80 templates the bar read an elapsed time frozen at the check's end and 0:00:00
    remaining. Each phase now starts its own clock: never finished before its last report."""
    import rich.progress

    seen: list[tuple[str, int, bool]] = []

    class Recording(rich.progress.Progress):
        def update(self, task_id: Any, **kw: Any) -> None:
            super().update(task_id, **kw)
            t = self._tasks[task_id]
            seen.append((t.description, int(t.completed), t.finished))

        def reset(self, task_id: Any, **kw: Any) -> None:
            super().reset(task_id, **kw)
            t = self._tasks[task_id]
            seen.append((t.description, int(t.completed), t.finished))

    monkeypatch.setattr(rich.progress, "Progress", Recording)
    (tmp_path / "c.txt").write_text("\n".join(["cat", "dog", "rocket", "tench", "goldfish", "hen", "ostrich", "jay",
                                               "magpie", "newt", "frog", "turtle", "gecko", "iguana"]) + "\n")
    r = CliRunner().invoke(app, ["import", str(pairs["hf_clip"]), "--classes", str(tmp_path / "c.txt"), "-o",
                                 str(tmp_path / "z.pth")], terminal_width=400)
    assert r.exit_code == 0, r.output
    tower = [(done, finished) for phase, done, finished in seen if phase == "text tower" and done]
    assert tower == [(960, False), (1120, True)], seen  # 12 classes × 80 templates a forward, then 2 × 80


@pytest.mark.slow
def test_a_transformers_tower_tokenises_each_prompt_once_and_encodes_as_its_own_call(pairs: dict[str, Path]) -> None:
    """The check pass's ids are the encode pass's (the tokenizer called once a prompt, not twice: a third of a small
    tower's time at 10,000 classes × 80 templates), padded by the tokenizer's own ``pad``: the features equal those
    of the tokenizer's padded call exactly, CLIP padded to the longest prompt and SigLIP to its context."""
    import torch

    from vitdeploy.model.zero_shot import class_embeddings, open_pair, read_templates, text_tower

    templates = read_templates("openai")[:9]
    prompts = [t.format(c) for c in ("cat", "great white shark", "a b c d e f") for t in templates]
    for name in ("hf_clip", "hf_siglip"):
        tower = text_tower(*open_pair(pairs[name]))
        assert tower.encodes_ids
        assert torch.equal(tower.encode_ids(tower.ids(prompts)), tower.encode(prompts)), name
        tower.encodes_ids = False  # the tokenizer's own padded call, as open_clip's towers still encode
        expected = class_embeddings(tower, ["cat", "great white shark", "a b c d e f"], templates)
        tower.encodes_ids = True
        calls: list[int] = []
        ids = tower.ids
        tower.ids = lambda ps, ids=ids, calls=calls: calls.append(len(ps)) or ids(ps)  # type: ignore[method-assign]
        tower.encode = lambda ps: (_ for _ in ()).throw(AssertionError("tokenised again"))  # type: ignore[method-assign]
        assert torch.equal(class_embeddings(tower, ["cat", "great white shark", "a b c d e f"], templates), expected)
        assert calls == [27], calls


@pytest.mark.slow
def test_off_a_terminal_a_long_text_tower_says_where_it_is(pairs: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: Any) -> None:
    """In a log or a pipe the bar is off; a line per LOG_EVERY_S seconds says each phase's count (4f50930: nothing
    at all for as long as the text tower ran). LOG_EVERY_S set to 0 so that a small list shows it."""
    import vitdeploy.cli.importers as imp

    monkeypatch.setattr(imp, "LOG_EVERY_S", 0.0)
    (tmp_path / "c.txt").write_text("cat\ndog\nrocket\n")
    r = CliRunner().invoke(app, ["import", str(pairs["hf_clip"]), "--classes", str(tmp_path / "c.txt"), "-o",
                                 str(tmp_path / "z.pth")], terminal_width=400)
    assert r.exit_code == 0, r.output
    print(r.output)
    assert "checking prompts: 240/240 prompts (100%)" in r.output
    assert "text tower: 240/240 prompts (100%)" in r.output
    assert "comparing classes: 3/3 classes (100%)" in r.output
