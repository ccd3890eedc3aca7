"""Ad-hoc run names are pinned: the same options name the same run directory in every later version."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from vit_lightning import ablation
from vit_lightning.commands.fit.cli import FitCLI
from vit_lightning.commands.sweep import names
from vit_lightning.model import FAMILIES
from vit_lightning.model.family import Option, added_after_earlier, trial_name
from vit_lightning.model.naming import FIRST, NAMING, NAMING_KEY

# every option changed from its default (values that build a model on the demo data)
EVERY = ["--model.variant=Ti", "--model.patch_size=4", "--model.width=48", "--model.depth=2", "--model.heads=3",
         "--model.mlp_dim=96", "--model.pos_encoding=learned_2d", "--model.pos_injection=every_layer",
         "--model.pooling=gap", "--model.head=mlp_tanh", "--model.dropout=0.1", "--model.attn_dropout=0.1",
         "--model.drop_path=0.1", "--model.init=timm", "--model.optimizer=sgd", "--model.lr=0.01",
         "--model.weight_decay=0.01", "--model.momentum=0.8", "--model.warmup_epochs=2", "--model.schedule=linear",
         "--model.label_smoothing=0.1", "--model.pos_resample=bilinear", "--data.batch_size=16",
         "--data.random_crop=false", "--trainer.max_epochs=3", "--trainer.gradient_clip_val=0.5",
         "--seed_everything=3"]
PINNED = {
    "demo ViT": ([], "mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-8302e758"),
    "demo Swin": (["--model.arch=swin"], "mnist5k-swin-micro-p2-relative_bias_2d-stem-gap-lr0.002-s0-0c458569"),
    "fine-tuning": (["--model.init_from={src}", "--data.img_size=56"],
                    "ft-mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-7e0fe79f"),
    "every option": (EVERY, "mnist5k-Ti-p4-learned_2d-every_layer-gap-lr0.01-s3-1eec9930"),
}


@pytest.fixture
def source(tmp_path):
    """A finished run directory (a record naming its trial `src`, and a checkpoint) to fine-tune from."""
    src = tmp_path / "src"
    src.mkdir()
    torch.manual_seed(0)
    from vit_lightning.run.module import Classifier

    model = Classifier(variant="micro", patch_size=7, img_size=28, in_chans=1, num_classes=10)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, src / "last.ckpt")
    (src / "results.json").write_text(json.dumps({"status": "completed", "trial": "src", "metrics": {}}))
    return src


def trial(argv: list[str], tmp_path, cls=FitCLI) -> str:
    return cls([*argv, f"--run.root={tmp_path}", "--run.wandb=off"]).flat["run.trial"]


@pytest.mark.parametrize("case", PINNED)
def test_ad_hoc_names_are_pinned(case, source, tmp_path):
    argv, name = PINNED[case]
    assert trial([a.format(src=source) for a in argv], tmp_path) == name


def test_a_new_option_with_a_default_renames_nothing(source, tmp_path):
    class Later(FitCLI):
        def add_arguments_to_parser(self, parser) -> None:
            super().add_arguments_to_parser(parser)
            parser.add_argument("--later.option", type=int, default=3)  # as if added in a later version

    for argv, name in PINNED.values():
        assert trial([a.format(src=source) for a in argv], tmp_path, Later) == name
    assert trial(["--later.option=4"], tmp_path, Later) != PINNED["demo ViT"][1]


def test_the_earlier_rule_names_as_the_previous_version_did(tmp_path):
    """Every value hashed: the demo names of the version before this rule, as that version printed them."""
    assert FitCLI([f"--run.root={tmp_path}"]).earlier_name == "mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-c7fb4914"
    swin = FitCLI(["--model.arch=swin", f"--run.root={tmp_path}"])
    assert swin.earlier_name == "mnist5k-swin-micro-p2-relative_bias_2d-stem-gap-lr0.002-s0-ff398c85"


@pytest.mark.slow
def test_an_ad_hoc_run_named_by_the_earlier_rule_is_noted_once(tmp_path, capsys):
    argv = [f"--run.root={tmp_path}", "--run.wandb=off", "--trainer.max_epochs=1", "--model.depth=1",
            "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1", "--run.fewshot_shots=[]"]
    cli = FitCLI(argv)
    earlier = cli.run_dir.parent / cli.earlier_name
    assert earlier != cli.run_dir
    earlier.mkdir(parents=True)
    capsys.readouterr()
    assert cli.fit_run() == 0
    err = capsys.readouterr().err
    assert f"an earlier version named this run {earlier.name}" in err and cli.run_dir.name in err
    assert FitCLI(argv).fit_run() == 0  # once: the run now has its directory under the new name
    assert "earlier version" not in capsys.readouterr().err


# --- the naming rule as data (model/naming.py) ---------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def later_option(monkeypatch):
    """An option added to the ViT's family in model/ alone, as a later version would."""
    vit = FAMILIES["vit"]
    options = {**vit.options, "later": Option(0, int, "vit: an option added later.")}
    monkeypatch.setitem(FAMILIES.entries, "vit", dataclasses.replace(vit, options=options))
    return "model.later"


def test_an_option_added_in_model_alone_renames_no_run(later_option, source, tmp_path):
    """Ad hoc names (and the earlier rule's) stay pinned; the option still counts when it is set."""
    for argv, name in PINNED.values():
        assert trial([a.format(src=source) for a in argv], tmp_path) == name
    assert FitCLI([f"--run.root={tmp_path}"]).earlier_name == "mnist5k-micro-p7-learned_1d-stem-cls-lr0.002-s0-c7fb4914"
    assert trial(["--model.later=1"], tmp_path) != PINNED["demo ViT"][1]
    assert later_option in added_after_earlier()


def cells_by_readable_name(ab, prof, version: int) -> dict[str, list]:
    """Each readable name (the name without its hash) of a profile's seed-0 cells under a rule version."""
    out: dict[str, list] = {}
    for cell in ab.table_profile(prof.name).cells():
        name = trial_name({**prof.fixed, **cell, "seed_everything": 0}, version=version)
        out.setdefault(name.rsplit("-", 1)[0], []).append(cell)
    return out


def test_rule_2_names_every_swept_key_in_words_and_rule_1_is_as_it_was():
    """Under rule 2 no two cells of a committed profile share their readable name (rule 1's pos_diagnostic cells
    differ by their hash alone), and a value's rule-2 name hashes as its rule-1 name does."""
    shared = 0
    for ab in map(ablation.load, ablation.available()):
        for prof in ab.profiles.values():
            assert all(len(cells) == 1 for cells in cells_by_readable_name(ab, prof, NAMING).values()), prof.name
            shared += sum(len(cells) > 1 for cells in cells_by_readable_name(ab, prof, FIRST).values())
    assert shared > 0
    params = {"data.name": "glyphs", "data.task": "relative", "model.head": "mlp_tanh", "seed_everything": 0}
    first, second = trial_name(params), trial_name({**params, NAMING_KEY: NAMING})
    assert first == "glyphs-s0-" + first[-8:] and second == "glyphs-relative-mlp_tanh-s0-" + first[-8:]


def test_a_naming_rule_version_is_checked():
    with pytest.raises(ValueError, match="run.naming=7 is not a naming rule version; choose from 0, 1, 2"):
        trial_name({NAMING_KEY: 7})
    demo = ablation.load("hybrid")
    with pytest.raises(ValueError, match="run.naming=9"):
        dataclasses.replace(demo, naming=9)
    renamed = dataclasses.replace(demo, naming=NAMING).profile("demo")
    assert renamed.fixed[NAMING_KEY] == NAMING and NAMING_KEY not in demo.profile("demo").fixed


def copy_records(tmp_path, count: int = 3, field: bool = True) -> list[Path]:
    """`count` committed records in tmp_path/records; field=False: as the record writer wrote them before they
    stored their naming rule (the field's line left out, every other byte as it is)."""
    folder = tmp_path / "records"
    folder.mkdir()
    sources = sorted((REPO / "results" / "hybrid" / "records").glob("*.json"))[:count]
    for path in sources:
        if field:
            shutil.copy(path, folder)
        else:
            record = {k: v for k, v in json.loads(path.read_text()).items() if k != names.FIELD}
            (folder / path.name).write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    return sorted(folder.glob("*.json"))


def test_every_committed_record_stores_the_rule_that_named_it():
    """Each committed record carries its naming rule's version (`vit-ablate names --migrate` gave the older ones
    theirs), and only the line of that field tells it from the record without it."""
    paths = sorted((REPO / "results").rglob("records/*.json"))
    assert len(paths) > 900
    records = {path: json.loads(path.read_text()) for path in paths}
    assert [str(p) for p, r in records.items() if r.get(names.FIELD) not in (FIRST, NAMING)] == []
    path, record = paths[0], records[paths[0]]
    without = {k: v for k, v in record.items() if k != names.FIELD}
    assert names.migrated(json.dumps(without, indent=2) + "\n", without) == path.read_text()


def test_names_checks_and_migrates_records_by_the_version_field_alone(tmp_path, capsys):
    files = copy_records(tmp_path, field=False)
    before = {path: path.read_text() for path in files}
    assert names.main([str(tmp_path)]) == 0
    assert f"{len(files)} record(s), {len(files)} consistent" in capsys.readouterr().out
    assert {path: path.read_text() for path in files} == before  # check mode writes nothing
    assert names.main(["--migrate", str(tmp_path)]) == 0
    for path in files:
        added = [line for line in path.read_text().splitlines() if line not in before[path].splitlines()]
        assert added == ['  "naming": 1,'] and json.loads(path.read_text())["naming"] == 1
        assert {k: v for k, v in json.loads(path.read_text()).items() if k != "naming"} == json.loads(before[path])
    migrated = {path: path.read_text() for path in files}
    assert names.main(["--migrate", str(tmp_path)]) == 0 and {p: p.read_text() for p in files} == migrated


def test_names_fails_a_name_its_rule_does_not_give(tmp_path, capsys):
    wrong, other = copy_records(tmp_path, 2)
    record = json.loads(wrong.read_text())
    wrong.write_text(json.dumps({**record, "trial": record["trial"][:-8] + "00000000"}, indent=2) + "\n")
    other.write_text(json.dumps({**json.loads(other.read_text()), "naming": 2}, indent=2) + "\n")
    assert names.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"'{record['trial'][:-8]}00000000': rule 1 names its parameters '{record['trial']}'" in out
    assert "named by rule 2, its profile names by rule 1" in out and "2 not" in out
    with pytest.raises(SystemExit):
        names.main([str(tmp_path / "missing")])


@pytest.mark.slow
def test_every_committed_record_is_named_as_its_rule_names_it(capsys):
    assert names.main([str(REPO / "results")]) == 0
    assert " 0 not, 0 not checked" in capsys.readouterr().out


def test_rule_2_reaches_an_ad_hoc_fit(tmp_path):
    first = trial(["--model.head=mlp_tanh"], tmp_path)
    second = trial(["--model.head=mlp_tanh", f"--{NAMING_KEY}=2"], tmp_path)
    assert "mlp_tanh" not in first and "-cls-mlp_tanh-lr0.002-s0-" in second and first[-8:] == second[-8:]


def test_names_leaves_what_no_profile_of_ours_made_unchecked_and_unmigrated(tmp_path, capsys):
    [path] = copy_records(tmp_path, 1, field=False)
    ad_hoc = {**json.loads(path.read_text()), "ablation": "adhoc"}
    path.write_text(json.dumps(ad_hoc, indent=2) + "\n")
    (tmp_path / "records" / "broken.json").write_text("{")
    assert names.main(["--migrate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ablation 'adhoc' is not one of ours" in out and "broken.json: not checked: no record" in out
    assert "2 not checked; 0 given" in out and "naming" not in json.loads(path.read_text())
