"""RunSpec: the typed hand-off from the launcher to every training task.

Written once per run as ``<run_dir>/spec.json`` (plus human-readable
``config.yaml`` and ``plan.json``); a task loads it with :func:`load_spec`.
Plain, versioned JSON (``{"version": 1, "run_dir", "cfg", "plan"}``), never a
pickle: a spec in a shared run directory is data, and loading it cannot run
code. Reading checks every key and type against the dataclasses, so a
hand-edited, truncated or foreign spec fails with one clear line
(:class:`SpecError`) instead of a crash deep inside training.
Standard library only, so ``train`` can read it without Hydra.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.plandata import Plan
from launcher.config.runfiles import (
    ATTEMPT_PLANS_DIR,
    LEGACY_SPEC_FILE,
    METRICS_FILE,
    SPEC_FILE,
)
from launcher.config.runid import claim_run_id, read_run_id, run_name
from launcher.config.schema import RunConfig
from launcher.config.validate import ConfigError

# Written by the trainer's rank 0 after every save's outcome (committed or
# failed: counts, newest committed step, the last failure's cause); read by
# ``meshrun status``.
# A local launcher exports its pid to its ranks (train/observe/lifeline.py: they die with it).
LAUNCHER_PID_ENV = "MESHRUN_LAUNCHER_PID"
SPEC_VERSION = 1
# Set by the batch-level supervisor (launcher/selfheal/supervisor.py) for an attempt
# that runs another layout than spec.json's (fewer nodes after a failure: a
# smaller data-parallel degree): the path of that attempt's plan file
# (:func:`save_attempt_plan`). :func:`load_spec` takes the plan from it;
# spec.json itself is never rewritten.
PLAN_FILE_ENV = "MESHRUN_PLAN_FILE"
# Written by meshrun before the JSON spec; never loaded (a pickle can run code).


class SpecError(ConfigError):
    """A run spec that cannot be read: missing, another version, or malformed."""


@dataclass
class RunSpec:
    cfg: RunConfig
    plan: Plan
    run_dir: str
    # launcher/config/runid.py: given at the run's first start (save_spec), kept in
    # <run_dir>/run_id; names every location the run shares with others.
    run_id: str = ""
    # Set by load_spec when $MESHRUN_PLAN_FILE replaced spec.json's plan: that
    # file, and why (e.g. "shrunk from 2 to 1 node(s): ...").
    plan_file: str = ""
    plan_why: str = ""

    @property
    def checkpoint_dir(self) -> str:
        """Tier-1 checkpoint directory (node-local NVMe on clusters): the run's
        own subdirectory of ``storage.local_dir``, named by its run id (as
        ``train.checkpoint.tiers.local_root``), else ``<run_dir>/checkpoints``."""
        local_dir = self.cfg.storage.local_dir
        if not local_dir:
            return os.path.join(self.run_dir, "checkpoints")
        # Environment variables name per-node directories; this process's view.
        local_dir = os.path.expandvars(os.path.expanduser(local_dir))
        return os.path.join(local_dir, self.run_id or read_run_id(self.run_dir))

    @property
    def metrics_path(self) -> str:
        return os.path.join(self.run_dir, METRICS_FILE)

    def config_hash(self) -> str:
        """Hash of what the training computes: model, data, optimisation. Not
        the layout (a checkpoint reloads at other dp/tp degrees), nor where
        or how long it runs."""
        keep = training_config(dataclasses.asdict(self.cfg))
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of this spec (plain values only)."""
        return {
            "version": SPEC_VERSION,
            "run_dir": self.run_dir,
            "run_id": self.run_id,
            "cfg": dataclasses.asdict(self.cfg),
            "plan": dataclasses.asdict(self.plan),
        }

    @classmethod
    def from_dict(cls, doc: Any, where: str = SPEC_FILE) -> RunSpec:
        """Check a spec document and build the RunSpec; :class:`SpecError` otherwise."""
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        version = doc.get("version")
        if version != SPEC_VERSION:
            raise SpecError(
                f"{where}: spec version {version!r} is not supported (this meshrun reads version "
                f"{SPEC_VERSION}); re-create the run dir with this meshrun's `python -m launcher`"
            )
        unknown = sorted(set(doc) - {"version", "run_dir", "run_id", "cfg", "plan"})
        if unknown:
            raise SpecError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for key in ("run_dir", "cfg", "plan"):
            if key not in doc:
                raise SpecError(f"{where}: missing key {key!r}")
        return cls(
            cfg=_build(RunConfig, doc["cfg"], "cfg", where),
            plan=_build(Plan, doc["plan"], "plan", where),
            run_dir=_value(str, doc["run_dir"], "run_dir", where),
            # Optional: version-1 specs written before run ids lack it (the
            # run dir's run_id file then names the run, train/checkpoint/tiers.py).
            run_id=_value(str, doc.get("run_id", ""), "run_id", where),
        )


def _build(cls: type, data: Any, path: str, where: str) -> Any:
    """A dataclass from a dict, every key and value type checked."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: {path} must be an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) in {path}: {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if has_default:
                continue  # a field added later, with a default: older specs of this version lack it
            raise SpecError(f"{where}: missing key {path}.{name}")
        kwargs[name] = _value(hints[name], data[name], f"{path}.{name}", where)
    return cls(**kwargs)


def _value(tp: Any, v: Any, path: str, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, v, path, where)
    if dataclasses.is_dataclass(tp):
        return _build(tp, v, path, where)  # type: ignore[arg-type]
    if tp is typing.Any:  # an int-or-word field (storage.save_every_steps: N or "auto")
        if isinstance(v, int | str) and not isinstance(v, bool):
            return v
        raise SpecError(f"{where}: {path} must be an integer or a string, got {v!r}")
    if origin is list:
        if not isinstance(v, list):
            raise SpecError(f"{where}: {path} must be a list, got {v!r}")
        return [_value(args[0], x, f"{path}[{i}]", where) for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise SpecError(f"{where}: {path} must be an object, got {v!r}")
        return {k: _value(args[1], x, f"{path}.{k}", where) for k, x in v.items()}
    ok = {
        bool: isinstance(v, bool),
        int: isinstance(v, int) and not isinstance(v, bool),
        float: isinstance(v, int | float) and not isinstance(v, bool),
        str: isinstance(v, str),
    }.get(tp)
    if ok is None:  # pragma: no cover - a new field type must be added here
        raise AssertionError(f"spec field {path} has unsupported type {tp!r}")
    if not ok:
        raise SpecError(f"{where}: {path} must be {tp.__name__}, got {v!r}")
    return float(v) if tp is float else v


# Fields of model/data/train that do not change what is computed: how long
# it runs, what is logged or where, preset names, and loader mechanics that
# yield the same samples in the same order. Changing them on resume is fine.
NOT_TRAINING = {
    "model": {"name"},
    "data": {"name", "num_workers", "use_dali"},
    "train": {
        "steps",
        "log_every_steps",
        "checkpoint_at_end",
        "target_tokens",
        "tensorboard",
        "wandb",
        "wandb_project",
        "wandb_entity",
    },
}


def training_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of a config (as plain dicts: ``dataclasses.asdict`` or a run
    dir's config.yaml) that :meth:`RunSpec.config_hash` covers and a resume
    must keep (launcher/run/rundir.py: check_resume)."""
    return {
        group: {k: v for k, v in cfg.get(group, {}).items() if k not in skip}
        for group, skip in NOT_TRAINING.items()
    }


def save_spec(spec: RunSpec) -> Path:
    path = Path(spec.run_dir) / SPEC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if not spec.run_id:
        spec.run_id = claim_run_id(spec.run_dir, run_name(spec.cfg))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)  # atomic: a task never reads half a spec
    return path


def load_spec(run_dir: str | os.PathLike[str]) -> RunSpec:
    """The spec of ``run_dir``; :class:`SpecError` names what is wrong."""
    path = Path(run_dir) / SPEC_FILE
    if not path.is_file():
        if (Path(run_dir) / LEGACY_SPEC_FILE).is_file():
            raise SpecError(
                f"{Path(run_dir) / LEGACY_SPEC_FILE}: a pickled spec from an older meshrun (version 0); "
                "it is not loaded (a pickle can run code). Re-create the run with `python -m launcher` "
                f"(launcher.run_dir={run_dir} keeps its checkpoints)"
            )
        raise SpecError(f"{path}: no run spec here (is {run_dir} a meshrun run dir?)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{path}: not a readable JSON spec ({e})") from e
    spec = RunSpec.from_dict(doc, str(path))
    if os.environ.get(PLAN_FILE_ENV):
        return with_attempt_plan(spec, os.environ[PLAN_FILE_ENV])
    return spec


def saved_login(run_dir: str | os.PathLike[str]) -> str:
    """The ``cluster.login`` a run was made with: where its Slurm jobs are
    asked about (launcher/slurm/remote.py); "" for this machine's Slurm, or
    when the run dir has no readable spec."""
    try:
        doc = json.loads((Path(run_dir) / SPEC_FILE).read_text())
        login = doc["cfg"]["cluster"].get("login", "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    return login if isinstance(login, str) else ""


def save_attempt_plan(spec: RunSpec, plan: Plan, tag: str, why: str) -> Path:
    """Write ``plan`` (another layout of ``spec``'s run) for the attempt
    ``tag`` to ``<run_dir>/attempt_plans/<tag>.json``; tasks started with
    $MESHRUN_PLAN_FILE set to it run that plan."""
    path = Path(spec.run_dir) / ATTEMPT_PLANS_DIR / f"{tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": SPEC_VERSION, "run_dir": spec.run_dir, "why": why, "plan": dataclasses.asdict(plan)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


# What an attempt's plan may not change: the training itself stays the same.
KEPT_BY_ATTEMPT_PLANS = ("global_batch_size", "micro_batch_size", "tp", "pp", "ranks_per_node", "device")


def with_attempt_plan(spec: RunSpec, plan_file: str) -> RunSpec:
    """``spec`` with the plan of ``plan_file`` (:func:`save_attempt_plan`);
    :class:`SpecError` when it is unreadable, of another run, or changes
    what the run computes."""
    where = f"{PLAN_FILE_ENV}={plan_file}"
    try:
        doc = json.loads(Path(plan_file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"{where}: not a readable attempt plan ({e})") from e
    if not isinstance(doc, dict) or doc.get("version") != SPEC_VERSION or "plan" not in doc:
        raise SpecError(f"{where}: not an attempt plan of version {SPEC_VERSION} with a 'plan'")
    if os.path.realpath(str(doc.get("run_dir"))) != os.path.realpath(spec.run_dir):
        raise SpecError(f"{where}: written for run dir {doc.get('run_dir')!r}, not {spec.run_dir!r}")
    plan = _build(Plan, doc["plan"], "plan", where)
    for key in KEPT_BY_ATTEMPT_PLANS:
        if getattr(plan, key) != getattr(spec.plan, key):
            raise SpecError(
                f"{where}: plan.{key}={getattr(plan, key)!r} differs from spec.json's "
                f"{getattr(spec.plan, key)!r}; an attempt's plan may change only the data-parallel degree "
                "and what follows from it"
            )
    why = _value(str, doc.get("why", ""), "why", where)
    return dataclasses.replace(spec, plan=plan, plan_file=plan_file, plan_why=why)
