"""`vit-ablate names`: check run folders and stored records against the naming rule that named them, and give the
records that predate the rule's version field that field (the rule that named them: FIRST)."""

from __future__ import annotations

import json
from pathlib import Path

from vit_lightning.ablation import available, load
from vit_lightning.commands.sweep import yamls
from vit_lightning.core.files import write_atomic
from vit_lightning.core.identity import plain, world_size
from vit_lightning.core.names import RECORD
from vit_lightning.core.parser import CommandParser
from vit_lightning.model.family import trial_name
from vit_lightning.model.naming import FIRST, NAMING_KEY
from vit_lightning.run.transfer import named_by_source

FIELD = "naming"  # the record's field: the naming rule version that named it


def record_files(paths: list[Path]) -> list[Path]:
    """The records under `paths`: a .json file itself; in a folder, each run's results.json and records/*.json."""
    out: list[Path] = []
    for path in map(Path, paths):
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out += sorted(path.rglob(RECORD)) + sorted(p for p in path.rglob("*.json") if p.parent.name == "records")
        else:
            raise ValueError(f"{path}: no such file or folder (give run folders, records or folders of them)")
    return list(dict.fromkeys(out))


class Designs:
    """Each (ablation, profile)'s swept and fixed keys and naming rule version, read once from its sweep configs."""

    def __init__(self):
        self.known, self.cache = set(available()), {}

    def keys(self, ablation: str, profile: str) -> tuple[int, tuple[str, ...]] | str:
        """(the profile's rule version, the parameters its sweep hands each trial) or why there are none."""
        if ablation not in self.known:
            return f"ablation {ablation!r} is not one of ours (an ad hoc run or another checkout's)"
        if (ablation, profile) not in self.cache:
            design = load(ablation)
            if profile not in design.profiles:
                return f"ablation {ablation!r} has no profile {profile!r}"
            configs = [config for _, config in yamls.sweep_configs(design, profile)]
            keys = tuple(dict.fromkeys(key for config in configs for key in config["parameters"]))
            self.cache[(ablation, profile)] = (design.profiles[profile].fixed.get(NAMING_KEY, FIRST), keys)
        return self.cache[(ablation, profile)]


def check(record: dict, designs: Designs) -> str | None:
    """Why a record's name is not the one its rule gives the parameters its sweep handed it (read back from its
    config: a selected or searched value as it trained), or None; a record no profile of ours made: a note."""
    version, trial, config = record.get(FIELD, FIRST), record.get("trial") or record.get("name"), record.get("config")
    found = designs.keys(record.get("ablation"), record.get("profile"))
    if isinstance(found, str):
        return f"not checked: {found}"
    rule, keys = found
    if version != rule:
        return f"named by rule {version}, its profile names by rule {rule}"
    compute = record.get("compute") or {}
    gpus = int(compute.get("num_devices") or 0) if compute.get("device") == "cuda" else 0
    params = {key: config[key] for key in keys if key in (config or {})}
    want = trial_name(named_by_source(params), world_size(params, gpus), version=rule)
    return None if want == trial else f"{trial!r}: rule {rule} names its parameters {want!r}"


def read(path: Path) -> tuple[str, dict | str]:
    """A record file's text and record, or why it holds none (unreadable, not JSON, not an object)."""
    try:
        text = path.read_text()
        record = json.loads(text)
    except (OSError, ValueError) as error:
        return "", str(error).splitlines()[0]
    return text, record if isinstance(record, dict) else "not a JSON object"


def migrated(text: str, record: dict) -> str:
    """The record's text with the naming field after its trial's name, and nothing else changed."""
    keys = list(record)
    at = keys.index("trial") + 1 if "trial" in keys else len(keys)
    new = dict([*record.items()][:at] + [(FIELD, FIRST)] + [*record.items()][at:])
    out = json.dumps(plain(new), indent=2, allow_nan=False) + "\n"
    if json.dumps(plain(record), indent=2, allow_nan=False) + "\n" != text:
        raise ValueError("its text is not the record writer's: left as it is")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="vit-ablate names", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run folders, records, or folders holding them")
    parser.add_argument("--migrate", action="store_true", help=f"write `{FIELD}: {FIRST}` into each consistent record "
                        "without the field (nothing else changes); without it, only check")
    args = parser.parse_args(argv)
    try:
        files = record_files(args.paths)
    except ValueError as error:
        parser.exit(2, f"vit-ablate names: error: {error}\n")
    designs, bad, moved, notes = Designs(), 0, 0, 0
    for path in files:
        text, record = read(path)
        problem = check(record, designs) if isinstance(record, dict) else f"not checked: no record ({record})"
        if problem:
            print(f"{path}: {problem}")
            notes, bad = (notes + 1, bad) if problem.startswith("not checked") else (notes, bad + 1)
        elif args.migrate and FIELD not in record:  # only a record its rule is known to have named
            try:
                write_atomic(path, migrated(text, record).encode())
                moved += 1
            except ValueError as error:
                print(f"{path}: not migrated: {error}")
    print(f"vit-ablate names: {len(files)} record(s), {len(files) - bad - notes} consistent with their naming rule, "
          f"{bad} not, {notes} not checked" + (f"; {moved} given `{FIELD}: {FIRST}`" if args.migrate else ""))
    return 1 if bad else 0
