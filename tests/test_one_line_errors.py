"""Every command answers a bad option or value in one line naming it (and the valid choices), exits 2 and writes
nothing; --help keeps argparse's usage block."""

from __future__ import annotations

import pytest

from vit_lightning import cli
from vit_lightning.core.parser import CommandParser


def run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """`vit-ablate ARGV` in this process: its exit code, its stderr's lines, its stdout."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out = capsys.readouterr()
    return code, out.err.splitlines(), out.out


# (argv, words the one line must hold: the option, and the valid choices or the nearest option where there are some)
BAD = {
    "sweep count": (["sweep", "pos_encoding", "--count", "0"], ["--count", "'0'"]),
    "sweep choice": (["sweep", "pos_encoding", "--backend", "slurm"], ["--backend", "'slurm'", "auto", "local", "wandb"]),
    "sweep unknown": (["sweep", "pos_encoding", "--dryrun"], ["unknown option --dryrun", "did you mean --dry-run?"]),
    "sweeps": (["sweeps", "--chek", "--out", "out"], ["unknown option --chek", "--check"]),
    "table": (["table", "pos_encoding", "--metrc", "val/acc"], ["unknown option --metrc", "did you mean --metric?"]),
    "viz": (["viz", "run", "--images", "-1"], ["--images", "-1"]),
    "fewshot": (["fewshot", "run", "--estimator", "ridge"], ["--estimator", "'ridge'", "paper", "big_vision"]),
    "eval": (["eval", "run", "--view", "crop"], ["--view", "'crop'", "tokens", "zoom", "both"]),
    "eval unknown": (["eval", "run", "--shotz", "5"], ["unknown option --shotz", "--shots"]),
    "reproduce": (["reproduce", "rope_vit", "--imagenet-val", "val", "--sizes", "100"], ["--sizes", "100", "224"]),
    "bench": (["bench", "--variant", "XL", "--json"], ["--variant", "'XL'", "micro", "Ti"]),
    "gpu-check": (["gpu-check", "--dry-run", "--trials-per-gpu", "0", "--out", "r.md"], ["--trials-per-gpu", "'0'"]),
    "names": (["names", "runs", "--migrte"], ["unknown option --migrte", "did you mean --migrate?"]),
    "docs": (["docs", "--out", "ref", "--results", "results", "--chek"], ["unknown option --chek", "--check"]),
    "missing": (["table"], ["required", "ablation"]),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_option_is_one_line_naming_it_and_nothing_is_written(case, tmp_path, monkeypatch, capsys):
    argv, words = BAD[case]
    monkeypatch.chdir(tmp_path)  # every relative path above (outputs, run roots) lies here
    code, err, out = run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err) == 1, err
    assert err[0].startswith(f"vit-ablate {argv[0]}: error: "), err
    assert all(word in err[0] for word in words), err
    assert list(tmp_path.iterdir()) == []


def test_every_argparse_command_is_covered():
    """Each command of the dispatcher but fit (LightningCLI's, tested below) has a case above."""
    assert {argv[0] for argv, _ in BAD.values()} == set(cli.COMMANDS) - {"fit"}


def test_help_keeps_the_usage_block(capsys):
    code, err, out = run(["sweep", "--help"], capsys)
    assert code == 0 and err == []
    assert out.startswith("usage: vit-ablate sweep") and "--dry-run" in out and "examples:" in out


def tiny_parser() -> CommandParser:
    p = CommandParser(prog="vit-ablate demo")
    p.add_argument("name")
    p.add_argument("--count", type=int)
    p.add_argument("--colour", choices=("red", "blue"))
    p.add_argument("--dry-run", action="store_true")
    return p


@pytest.mark.parametrize("argv, line", [
    (["a", "--colour", "green"],
     "vit-ablate demo: error: argument --colour: invalid choice: 'green' (choose from 'red', 'blue')"),
    (["a", "--count", "x"], "vit-ablate demo: error: argument --count: invalid int value: 'x'"),
    (["a", "--dryrun"], "vit-ablate demo: error: unknown option --dryrun (did you mean --dry-run?)"),
    # far from every option: all of them (--help aside); the word after an unknown option is its value
    (["a", "--zzz", "3"], "vit-ablate demo: error: unknown option --zzz (options: --colour, --count, --dry-run)"),
    (["a", "--zzz=3", "b"],
     "vit-ablate demo: error: unknown option --zzz (options: --colour, --count, --dry-run); unexpected argument 'b'"),
    (["a", "b"], "vit-ablate demo: error: unexpected argument 'b'"),
    ([], "vit-ablate demo: error: the following arguments are required: name"),
])
def test_the_parser_says_what_is_wrong_in_one_line_and_exits_2(argv, line, capsys):
    with pytest.raises(SystemExit) as stop:
        tiny_parser().parse_args(argv)
    assert stop.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_the_parser_reads_good_arguments_and_its_help_has_the_usage():
    args = tiny_parser().parse_args(["a", "--count", "3", "--colour", "red", "--dry-run"])
    assert (args.name, args.count, args.colour, args.dry_run) == ("a", 3, "red", True)
    assert tiny_parser().format_help().startswith("usage: vit-ablate demo [-h]")


# fit's model options out of their range, of the wrong type or unknown: named in full (model.X), one line
FIT_BAD = {
    "--model.reg_tokens=1000000": ["model.reg_tokens", "1000000", "1024"],
    "--model.dropout=2": ["model.dropout=2.0", "[0, 1)"],
    "--model.depth=0": ["model.depth", "positive", "got 0"],  # 0 is not the variant's depth
    "--model.layer_scale=-1": ["model.layer_scale", "-1.0"],
    "--model.arch=conv2": ["model.arch='conv2'", "vit", "swin"],
    "--model.variant=XL": ["model.variant='XL'", "micro", "Ti"],
    "--model.img_size=56": ['"model.img_size" must be given via "data.img_size"'],  # the data's, linked
}


@pytest.mark.parametrize("option", FIT_BAD)
def test_fit_names_a_bad_model_option_in_full(option, tmp_path, capsys):
    # a tiny budget: were the option read as valid, the run would end in seconds
    argv = ["fit", option, f"--run.root={tmp_path}", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=1", "--run.fewshot_shots=[]", "--run.shuffle_perms=0"]
    code, err, _ = run(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("vit-ablate fit: error: ") and all(word in err[0] for word in FIT_BAD[option]), err
    assert list(tmp_path.iterdir()) == []


def test_an_abbreviated_option_is_refused_with_its_full_name():
    """argparse would read `--shot` as `--shots`; every command takes option names exactly, as fit does."""
    from vit_lightning.core.parser import CommandParser
    parser = CommandParser(prog="vit-ablate eval")
    parser.add_argument("--shots", type=int)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--shot", "3"])
    assert stop.value.code == 2
    assert parser.parse_args(["--shots", "3"]).shots == 3
