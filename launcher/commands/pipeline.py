"""``python -m launcher.pipeline FILE`` (``meshrun pipeline``): named stages
submitted by one command that returns at once, each waiting for the stages
it depends on (``launcher.after``: ``--dependency=afterok``; a failed stage
makes Slurm cancel its dependants, and ``meshrun status <pipeline dir>``
says which and why).

The file (YAML)::

    overrides: [cluster=testcluster, model=tiny]   # every stage's, first
    stages:
      pretrain:
        overrides: [train.steps=200]
      eval:
        overrides: [job=eval, "job.checkpoint={run:pretrain}/checkpoints"]
        depends_on: [pretrain]

``{run:NAME}`` is stage NAME's run dir (``<pipeline dir>/<NAME>``); a stage
may name only stages it depends on. Every stage is composed and checked
before any is submitted: an unknown stage, a cycle, or a stage's bad config
is refused with nothing written. ``<pipeline dir>/pipeline.json`` lists the
stages, their run dirs and job ids.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from launcher.config.compose import compose
from launcher.config.prog import describe, prog
from launcher.config.runfiles import PIPELINE_FILE
from launcher.config.validate import ConfigError
from launcher.plan.jobs import awaiting
from launcher.run.prepare import prepare

NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
RUN_REF = re.compile(r"\{run:([^}]*)\}")


def load_stages(path: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(common overrides, stage -> {"overrides", "depends_on"}); ConfigError names what is wrong."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"pipeline file {path!r} is unreadable: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("stages"), dict) or not doc["stages"]:
        raise ConfigError(f"pipeline file {path!r} is invalid: it needs a 'stages:' mapping of named stages")
    common = _strings(doc.get("overrides", []), "overrides")
    stages: dict[str, dict[str, Any]] = {}
    for name, body in doc["stages"].items():
        name = str(name)
        if not NAME.match(name):
            raise ConfigError(f"pipeline stage name {name!r} is invalid: letters, digits, '_', '.', '-'")
        body = body or {}
        if not isinstance(body, dict) or set(body) - {"overrides", "depends_on"}:
            raise ConfigError(f"pipeline stage {name!r} is invalid: give only 'overrides' and 'depends_on'")
        stages[name] = {
            "overrides": _strings(body.get("overrides", []), f"stages.{name}.overrides"),
            "depends_on": _strings(body.get("depends_on", []), f"stages.{name}.depends_on"),
        }
    return common, stages


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ConfigError(f"pipeline {where}={value!r} is invalid: a list of strings")
    return [str(v) for v in value]


def order(stages: dict[str, dict[str, Any]]) -> list[str]:
    """Stages in submission order (each after what it depends on); refuses
    unknown stages, references to stages not depended on, and cycles."""
    for name, s in stages.items():
        for dep in s["depends_on"]:
            if dep not in stages:
                raise ConfigError(
                    f"pipeline stage {name!r} depends on {dep!r}, which is not a stage "
                    f"(stages: {', '.join(stages)})"
                )
        for ref in RUN_REF.findall(" ".join(s["overrides"])):
            if ref not in s["depends_on"]:
                raise ConfigError(
                    f"pipeline stage {name!r} uses {{run:{ref}}} but does not depend on {ref!r}: "
                    "add it to its depends_on"
                )
    done: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            cycle = [*visiting[visiting.index(name) :], name]
            raise ConfigError(f"pipeline has a cycle: {' -> '.join(cycle)}; a stage cannot wait for itself")
        visiting.append(name)
        for dep in stages[name]["depends_on"]:
            visit(dep)
        visiting.pop()
        done.append(name)

    for name in stages:
        visit(name)
    return done


def stage_overrides(common: list[str], stage: dict[str, Any], pipeline_dir: Path, name: str) -> list[str]:
    def run_dir(m: re.Match[str]) -> str:
        return str(pipeline_dir / m.group(1))

    own = [RUN_REF.sub(run_dir, o) for o in stage["overrides"]]
    after = ",".join(str(pipeline_dir / d) for d in stage["depends_on"])
    extra = [f"launcher.after='{after}'"] if after else []
    return [*common, *own, *extra, f"launcher.run_dir={pipeline_dir / name}"]


def check_all(
    common: list[str], stages: dict[str, dict[str, Any]], names: list[str], pipeline_dir: Path
) -> dict:
    """Every stage composed and checked (nothing written); each must be a Slurm run."""
    specs = {}
    for name in names:
        overrides = stage_overrides(common, stages[name], pipeline_dir, name)
        try:
            cfg = compose(overrides)
            if cfg.cluster.kind != "slurm" or cfg.launcher.dry_run:
                raise ConfigError(
                    f"cluster={cfg.cluster.name}: a pipeline's stages are Slurm jobs (dependencies are Slurm's)"
                )
            after, cfg.launcher.after = cfg.launcher.after, ""  # its dependencies are not submitted yet
            # Nor have they run: their checkpoints (job.checkpoint={run:NAME}) do not exist yet.
            with awaiting([str(pipeline_dir / d) for d in stages[name]["depends_on"]]):
                spec = prepare(cfg, overrides[-1].split("=", 1)[1])
            spec.cfg.launcher.after = after
        except ConfigError as e:
            raise ConfigError(f"pipeline stage {name!r}: {e}") from e
        specs[name] = (spec, overrides)
    return specs


def submit_all(specs: dict, names: list[str], pipeline_dir: Path, source: str) -> dict[str, Any]:
    from launcher.entry.launch import submit_slurm
    from launcher.slurm.cluster import cancel
    from launcher.slurm.submit import read_job_id

    record: dict[str, Any] = {
        "pipeline": source,
        "dir": str(pipeline_dir),
        "created": time.time(),
        "stages": [],
    }
    for name in names:
        spec, overrides = specs[name]
        try:
            print(f"meshrun: pipeline stage {name}:", flush=True)
            code = submit_slurm(spec, overrides, stage=name)
        except BaseException as e:
            done = [s for s in record["stages"] if s.get("job_id")]
            for s in done:
                cancel(s["job_id"])
            said = ", ".join(f"{s['stage']} (job {s['job_id']})" for s in done) or "none"
            raise ConfigError(
                f"pipeline stage {name!r} was not submitted: {e}; cancelled the stages before it: {said}"
            ) from e
        job = read_job_id(spec.run_dir) if code == 0 else None
        record["stages"].append(
            {
                "stage": name,
                "run_dir": spec.run_dir,
                "job_id": job,
                "depends_on": specs[name][0].cfg.launcher.after,
            }
        )
    return record


def _over_ssh(path: str, spec: Any, pipeline_dir: str) -> int:
    """A pipeline for a cluster behind its login node (cluster.login):
    checked here, submitted there (launcher/entry/sshsubmit.py)."""
    from launcher.entry.sshsubmit import submit_pipeline_over_ssh
    from launcher.slurm.remote import RemoteError

    try:
        return submit_pipeline_over_ssh(spec, yaml.safe_load(Path(path).read_text()), pipeline_dir)
    except RemoteError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog("python -m launcher.pipeline"), description=describe(__doc__))
    ap.add_argument("file", help="the pipeline YAML")
    ap.add_argument(
        "--dir", default="", help="the pipeline dir (default <runs root>/pipelines/<file>-<time>)"
    )
    args = ap.parse_args(argv)
    try:
        common, stages = load_stages(args.file)
        names = order(stages)
        stamp = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(2)}"
        first = compose(common)
        root = first.launcher.runs_root if not args.dir else ""
        typed = Path(args.dir or os.path.join(root, "pipelines", f"{Path(args.file).stem}-{stamp}"))
        pipeline_dir = typed.resolve()
        # Over SSH (cluster.login) --dir is the cluster's path: checked there, not on this machine.
        if not first.cluster.login and (pipeline_dir / PIPELINE_FILE).exists():
            raise ConfigError(f"--dir={str(pipeline_dir)!r} already holds a pipeline; give a new one")
        specs = check_all(common, stages, names, pipeline_dir)
        if specs[names[0]][0].cfg.cluster.login:  # the whole pipeline runs on the login node
            return _over_ssh(args.file, specs[names[0]][0], str(typed))
        record = submit_all(specs, names, pipeline_dir, str(Path(args.file).resolve()))
    except ConfigError as e:
        print(f"meshrun: error: {e}", file=sys.stderr)
        return 2
    (pipeline_dir / PIPELINE_FILE).write_text(json.dumps(record, indent=1) + "\n")
    stages_said = ", ".join(f"{s['stage']} (job {s['job_id']})" for s in record["stages"])
    print(f"meshrun: pipeline of {len(names)} stage(s) submitted: {stages_said}")
    print(f"meshrun: pipeline dir {pipeline_dir}  (status: meshrun status {pipeline_dir})")
    return 0
