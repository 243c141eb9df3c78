"""The import graph of launcher/, train/ and hydra_plugins/, read from the
code (ast, every import: top level, inside functions, under TYPE_CHECKING),
checked against the layer rules of docs/ARCHITECTURE.md, and the size of
every function and module (a newcomer reads a function on one screen).

``python scripts/import_graph.py`` prints every violation and exits 1 when
there is one; ``--dot FILE`` writes the package graph as Graphviz text;
``--svg FILE`` draws it (needs ``dot``). tests/local/test_layers.py runs the check.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "train", "hydra_plugins")

# Layers, bottom first: a module may import its own layer and any layer below.
LAYERS = [
    ("launcher.config",),  # the contract: schema, spec, validation, run files, data formats
    ("launcher.perf",),  # the performance model: prices a Layout, never plans
    ("launcher.plan",),  # layout, memory, job kinds, stop lead, QOS fit
    ("launcher.slurm",),  # render, submit, cluster queries, containers, QOS admin
    ("launcher.run",),  # run dir, prepare, local launch
    ("launcher.nodecheck",),  # node checks: preflight on every node, host probes, the ledger's view
    ("launcher.taskwrap",),  # job=script's task wrapper: a team's program under meshrun
    ("launcher.views",),  # at a desk: status, fleet, goodput, forecasts, reports, diffs
    ("launcher.selfheal",),  # inside the allocation: supervisor, hang watch, attribution, restarts
    ("launcher.entry",),  # how a composed run enters: dry run, local launch, Slurm submission
    ("launcher.commands",),  # every `meshrun X`: one module each with main(argv)
    ("launcher",),  # commands: __main__, cli, one module per `meshrun X`
    ("hydra_plugins",),  # the sweep launcher (Hydra plugin)
]
# Sizes a reader takes in at once (lines, docstrings and comments included).
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 550
# The trainer reads the contract only: it is launched from a spec.
TRAIN_MAY_IMPORT = ("launcher.config", "train")
# train/'s packages by role, bottom first (the same rule as LAYERS); the
# top-level modules (``python -m train``) sit above them all.
TRAIN_LAYERS = [
    "train.models",  # architectures, HF weights in/out
    "train.parallel",  # ranks, the DeviceMesh, apply_* in a fixed order, pipeline stages
    "train.observe",  # metrics, tracking, run log, heartbeats, lifeline, preflight all-reduce
    "train.data",  # loaders
    "train.checkpoint",  # tiered async checkpoints
    "train.inprocess",  # in-process recovery: peer copies in host memory, the rendezvous generations
    "train.loop",  # a trainer assembled, one step, optimizer, state, stop flag, starting weights
    "train.jobs",  # what each job kind runs
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            out[module_name(p)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``name`` imports (resolved to a known module)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # "from pkg import mod" imports pkg.mod; "from pkg import name" imports pkg
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):
                targets.append(base)
        for t in targets:
            # the longest known module prefix of the target
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in known:
                    if cand != name:
                        found.add(cand)
                    break
    return found


def layer_of(mod: str) -> int | None:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def train_layer_of(mod: str) -> int:
    for i, p in enumerate(TRAIN_LAYERS):
        if mod == p or mod.startswith(p + "."):
            return i
    return len(TRAIN_LAYERS)  # train itself: __main__


def _package(mod: str) -> str:
    """A package for the picture: launcher.<sub> or the top package."""
    parts = mod.split(".")
    if (
        parts[0] == "launcher"
        and len(parts) > 1
        and f"launcher.{parts[1]}" in {p for ps in LAYERS for p in ps}
    ):
        return f"launcher.{parts[1]}"
    if parts[0] == "train" and ".".join(parts[:2]) in TRAIN_LAYERS:
        return ".".join(parts[:2])
    return parts[0]


def violations(g: dict[str, set[str]]) -> list[str]:
    out = []
    for comp in cycles(g):
        out.append("import circle: " + " -> ".join(comp))
    for m, deps in sorted(g.items()):
        for d in sorted(deps):
            if m.startswith("train"):
                if not d.startswith(TRAIN_MAY_IMPORT):
                    out.append(f"train imports above the contract: {m} -> {d}")
                elif d.startswith("train") and train_layer_of(d) > train_layer_of(m):
                    lm, ld = train_layer_of(m), train_layer_of(d)
                    out.append(f"upward import: {m} -> {d} ({TRAIN_LAYERS[lm]} is below {TRAIN_LAYERS[ld]})")
                continue
            if m.startswith("launcher") and d.startswith("train"):
                out.append(f"launcher imports train: {m} -> {d}")
                continue
            lm, ld = layer_of(m), layer_of(d)
            if lm is not None and ld is not None and ld > lm:
                out.append(f"upward import: {m} -> {d} ({LAYERS[lm][0]} is below {LAYERS[ld][0]})")
    pg: dict[str, set[str]] = defaultdict(set)
    for m, deps in g.items():
        for d in deps:
            if _package(m) != _package(d):
                pg[_package(m)].add(_package(d))
    for comp in cycles(pg):
        out.append("package circle: " + " -> ".join(comp))
    return out


def oversized(max_function: int = MAX_FUNCTION_LINES, max_module: int = MAX_MODULE_LINES) -> list[str]:
    """Every function over ``max_function`` lines and module over
    ``max_module`` lines in launcher/, train/ and hydra_plugins/."""
    out = []
    for name, path in sorted(modules().items()):
        text = path.read_text()
        n = len(text.splitlines())
        if n > max_module:
            out.append(f"module over {max_module} lines: {name} ({n})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > max_function:
                    out.append(f"function over {max_function} lines: {name}:{node.name} ({size})")
    return out


# Every folder whose modules may import one another (tests and scripts too).
ENTRY_SCAN = ("launcher", "train", "hydra_plugins", "tests", "scripts")


def _is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` at module level."""
    t = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(t, ast.Compare)
        and isinstance(t.left, ast.Name)
        and t.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in t.comparators)
    )


def entry_violations(root: Path = ROOT) -> list[str]:
    """A module run as ``__main__`` (an ``if __name__ == "__main__"`` block, or
    a ``__main__.py``) that another project module imports: run, it would be
    loaded twice (as ``__main__`` and by name: two copies of its state); its
    code belongs in a module both import. And a ``python -m launcher.X``
    alias (launcher/X.py) imported anywhere: code imports launcher.commands.X."""
    paths: dict[str, Path] = {}
    for top in ENTRY_SCAN:
        for p in sorted((root / top).rglob("*.py")):
            paths[".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")] = p
    known = set(paths)
    trees = {m: ast.parse(p.read_text(), str(p)) for m, p in paths.items()}
    # Run with python -m: launcher/, train/, hydra_plugins/ (scripts and test
    # workers are run by path, and import one another by their file's name).
    mains = {
        m
        for m, t in trees.items()
        if m.startswith(PACKAGES) and (m.endswith(".__main__") or any(map(_is_main_block, t.body)))
    }
    # launcher/X.py run as python -m launcher.X (cli, __main__ and api are not aliases)
    aliases = {m for m in mains if paths[m].parent == root / "launcher" and paths[m].stem != "__main__"}
    out = []
    for m, p in sorted(paths.items()):
        found = imports(m, p, known)
        if m.startswith(("tests.", "scripts.")):
            # tests/ and scripts/ put their own folder on sys.path: a bare name is a sibling.
            top = m.split(".")[0]
            bare = {a.name for n in ast.walk(trees[m]) if isinstance(n, ast.Import) for a in n.names}
            bare |= {n.module for n in ast.walk(trees[m]) if isinstance(n, ast.ImportFrom) and n.module}
            found |= {f"{top}.{b}" for b in bare if f"{top}.{b}" in known}
        for d in sorted(found & mains):
            if d in aliases:
                out.append(f"alias imported: {m} -> {d} (a python -m alias; import launcher.commands.*)")
            else:
                out.append(
                    f"__main__ module imported: {m} -> {d} (it runs as __main__: move what is shared out)"
                )
    return out


# launcher/selfheal's parts are plain objects the supervisor composes: none
# inherits a project class, save kinds of value Python builds by subclassing
# (exceptions, Protocols, NamedTuples, Enums, TypedDicts), or a project class
# that is itself one of those.
COMPOSED = "launcher.selfheal"
VALUE_KINDS = {"Protocol", "NamedTuple", "TypedDict", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def composition_violations(sources: dict[str, str] | None = None) -> list[str]:
    """Each class in launcher/selfheal that inherits from a class defined in
    the project (``sources``: module -> its text; the tree's by default).
    A base is followed through the module's imports (the project imports
    absolutely), as ``Name`` or ``module.Name``."""
    if sources is None:
        sources = {m: p.read_text() for m, p in modules().items()}
    trees = {m: ast.parse(text, m) for m, text in sources.items()}
    classes = {(m, n.name): n for m, t in trees.items() for n in t.body if isinstance(n, ast.ClassDef)}
    imported: dict[str, dict[str, str]] = defaultdict(dict)  # module -> local name -> what it is, dotted
    for m, t in trees.items():
        for node in ast.walk(t):
            if isinstance(node, ast.Import):
                for a in node.names:  # import a.b as c: c is a.b; import a.b: a is a
                    local = a.asname or a.name.split(".")[0]
                    imported[m][local] = a.name if a.asname else local
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported[m].update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})

    def resolve(m: str, base: ast.expr) -> tuple[str, str] | str:
        """(module, class) when ``base`` (as written in ``m``) is a project class, else its text."""
        text = ast.unparse(base)
        head, _, rest = text.partition(".")
        target = imported[m].get(head, f"{m}.{head}" if (m, head) in classes else head)
        mod, _, name = (f"{target}.{rest}" if rest else target).rpartition(".")
        return (mod, name) if (mod, name) in classes else text

    def value_kind(key: tuple[str, str], depth: int = 0) -> bool:
        for b in classes[key].bases:
            r = resolve(key[0], b)
            if isinstance(r, str):  # from outside the project: an exception, a Protocol...
                name = r.rpartition(".")[2]
                builtin = getattr(builtins, name, None)
                if name in VALUE_KINDS or (isinstance(builtin, type) and issubclass(builtin, BaseException)):
                    return True
            if isinstance(r, tuple) and depth < 20 and value_kind(r, depth + 1):
                return True
        return False

    out = []
    for (m, name), node in sorted(classes.items()):
        if m != COMPOSED and not m.startswith(COMPOSED + "."):
            continue
        for b in node.bases:
            r = resolve(m, b)
            if isinstance(r, tuple) and not value_kind(r):
                out.append(f"inherits, not composed: {m}.{name} subclasses {r[0]}.{r[1]} (hold it as a part)")
    return out


def dot(g: dict[str, set[str]]) -> str:
    pg: dict[str, set[str]] = defaultdict(set)
    size: dict[str, int] = defaultdict(int)
    mods = modules()
    for m, p in mods.items():
        size[_package(m)] += len(p.read_text().splitlines())
    for m, deps in g.items():
        for d in deps:
            if _package(m) != _package(d):
                pg[_package(m)].add(_package(d))
    lines = ["digraph meshrun {", "  rankdir=BT;", '  node [shape=box, fontname="Helvetica"];']
    for p in sorted(size):
        lines.append(f'  "{p}" [label="{p}\\n{size[p]} lines"];')
    for a in sorted(pg):
        for b in sorted(pg[a]):
            lines.append(f'  "{a}" -> "{b}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/import_graph.py", description=__doc__.splitlines()[0])
    ap.add_argument("--dot", help="write the package graph (Graphviz text) here")
    ap.add_argument("--svg", help="draw the package graph here (runs dot)")
    args = ap.parse_args(argv)
    g = graph()
    if args.dot or args.svg:
        text = dot(g)
        if args.dot:
            Path(args.dot).write_text(text)
        if args.svg:
            subprocess.run(["dot", "-Tsvg", "-o", args.svg], input=text, text=True, check=True)
    bad = violations(g) + oversized()
    bad += entry_violations()
    bad += composition_violations()
    for line in bad:
        print(line)
    print(f"import_graph: {len(g)} modules, {sum(map(len, g.values()))} imports, {len(bad)} violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
