"""The shape of ``src/tinymt``, read from the source with ``ast`` (nothing is imported).

Rules (docs/architecture.md):

(a) no import cycle between modules (module-level imports of ``tinymt.*``, relative ones
    resolved; a package's ``__init__`` importing its own submodules is not a cycle: only
    the imports written in the source are edges, none are implied by the package tree);
(b) no function-local import of a ``tinymt`` module (they hide cycles and layer breaks);
(c) imports follow ``LAYERS`` below, module-level and function-local alike: a module may
    import its own layer, lower layers and the shared leaves; a shared leaf imports only
    shared leaves (``SHARED_MAY_IMPORT`` lists the documented exceptions: none today);
    every module must belong to a layer or be a shared leaf;
(d) size is budgeted per subsystem, not per module (``BUDGETS``: the teaching core, the
    benchmark, ``src/tinymt`` as a whole);
(e) no function over ``MAX_FUNCTION_LINES`` lines (``def`` line to last line, decorators
    not counted) unless the comment block directly above it (above its first decorator, if
    it has any) holds a line ``# long: <reason>``; the ``TABLES`` files are exempt here too.

The last tests run the checker on small planted trees, so it can be seen to fail.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "src" / "tinymt"

# Layers, lowest first. A name is a top-level module or package of tinymt (``data`` is
# tinymt/data/ with all its submodules). Names in one row share a rank: they may import
# each other (cycles are still errors) and anything in an earlier row.
LAYERS: list[tuple[str, ...]] = [
    ("corpus",),  # the built-in zh-en grammar
    ("tokenizer",),  # sentencepiece wrapper, special ids
    ("data",),  # loading, cleaning, tokenizing, the cache
    ("batching",),  # token-budget batches, collate
    ("attention",),  # multi-head attention
    ("layers",),  # positions, feed-forward, encoder and decoder layers
    ("model", "step", "speed"),  # the encoder-decoder Transformer; one training step; the
    # CPU step's fast paths (fused loss, bit-level dropout), tested equal to the core
    ("words", "relations", "labels"),  # pieces -> words (gold alignments and relations are
    # between words); which relation each head tracks; what each head does, in a word
    ("attention_maps", "rundir", "viewer"),  # built on a model: maps, a run on disk, the
    # interactive attention viewer (its data, TensorBoard plugin, HTML file)
    ("decoding",),  # greedy and beam search, translate_ids
    ("ct2",),  # export to CTranslate2 (a run's model) and translating with it (its length rule)
    ("text",),  # real text in: sentences, language identification, the spacing put back
    ("translate", "serve", "bench"),  # translating a run; serving it over HTTP; the benchmark
    # (its nn.Transformer peer, times decoding and the server, loads runs)
    ("trainer",),  # train(cfg)
    ("heads",),  # head analysis of a trained run
]
# Shared leaves: any module may import them.
SHARED: tuple[str, ...] = (
    "errors", "cli", "config", "runtime", "plotting", "metrics", "loss", "checkpoint",
    "files",  # the one write path, and the one bounded reader of each file kind
    "fonts",  # Noto Sans CJK SC for the viewer, the server page and the figures
    "__init__",  # the root package, tinymt/__init__.py
)
# Layered modules a shared leaf may import anyway, {leaf: {layer, ...}}. Today no leaf
# imports a layered module: config, checkpoint, files, plotting, fonts, cli
# and runtime import errors (and each other) only, and metrics and loss no tinymt module.
SHARED_MAY_IMPORT: dict[str, set[str]] = {}

# the teaching core: what a learner reads, in this order (README, "Read the code")
CORE = ("attention.py", "layers.py", "model.py", "loss.py", "step.py", "decoding/greedy.py")
# lines of Python: a subsystem's files (globs under src/tinymt) -> the most it may hold.
# A limit binds: it is raised only by an issue that asks for it, never to fit a change; a
# change that needs room deletes first (docs/architecture.md, "Size").
BUDGETS = {"the teaching core": (CORE, 1_500), "the benchmark": (("bench/*.py",), 1_200),
           "src/tinymt": (("**/*.py",), 13_500)}
# the corpus's word lists, grammar and rendering tables: exempt from the function limit
TABLES = {"corpus/lexicon.py", "corpus/grammar.py", "corpus/render.py"}
MAX_FUNCTION_LINES = 80
LONG_MARK = re.compile(r"^\s*#\s*long:\s*\S")  # "# long: <reason>"

RANK = {name: rank for rank, row in enumerate(LAYERS) for name in row}


# ----------------------------------------------------------------------------- checker
@dataclass
class Module:
    name: str  # tinymt.data.cache
    rel: str  # data/cache.py, relative to the package folder
    is_package: bool  # an __init__.py
    lines: list[str]
    tree: ast.Module


@dataclass
class Import:
    source: str  # importing module
    target: str  # imported tinymt module
    line: int
    local: bool  # inside a function


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)  # files that do not parse
    cycles: list[str] = field(default_factory=list)
    local_imports: list[str] = field(default_factory=list)
    layer_breaks: list[str] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)
    over_budget: list[str] = field(default_factory=list)
    long_functions: list[str] = field(default_factory=list)


def load_modules(package: Path, report: Report) -> dict[str, Module]:
    """Every ``*.py`` under ``package``, by dotted name (``data/__init__.py``: ``tinymt.data``)."""
    mods = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        parts = [package.name, *rel[: -len(".py")].split("/")]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as e:
            report.errors.append(f"{rel}:{e.lineno}: {e.msg}")
            continue
        mods[".".join(parts)] = Module(".".join(parts), rel, is_package, text.splitlines(), tree)
    return mods


def _known(name: str, mods) -> str | None:
    """The longest prefix of ``name`` that is one of our modules."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in mods:
            return ".".join(parts[:n])
    return None


def _targets(node: ast.Import | ast.ImportFrom, mod: Module, mods) -> list[str]:
    """The tinymt modules an import statement names (``from p import sub`` -> ``p.sub``)."""
    if isinstance(node, ast.Import):
        found = [_known(a.name, mods) for a in node.names]
    else:
        if node.level:  # relative: from the module's package, one level up per extra dot
            package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
            base_parts = package[: len(package) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        found = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else _known(base, mods)
                 for a in node.names]
    return list(dict.fromkeys(t for t in found if t and t != mod.name))


def collect_imports(mod: Module, mods) -> list[Import]:
    out: list[Import] = []

    def walk(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.extend(Import(mod.name, t, child.lineno, local)
                           for t in _targets(child, mod, mods))
            walk(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                    ast.Lambda)))

    walk(mod.tree, False)
    return out


def layer_of(name: str) -> str:
    """``tinymt.data.cache`` -> ``data``; the root package -> ``__init__``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    cycles = []
    for comp in components:
        start = min(comp)
        paths = {start: [start]}  # breadth first, inside the component, back to start
        frontier = [start]
        cycle = None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w == start:
                        cycle = paths[v] + [start]
                        break
                    if w in comp and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if cycle:
                    break
            frontier = nxt
        cycles.append(cycle)
    return sorted(cycles)


def _is_long_ok(mod: Module, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The comment block directly above the function (above its first decorator) holds a
    line ``# long: <reason>``."""
    i = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 2  # line above, 0-based
    block = []
    while i >= 0 and mod.lines[i].lstrip().startswith("#"):
        block.insert(0, mod.lines[i])
        i -= 1
    return any(LONG_MARK.match(line) for line in block)


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def check(package: Path) -> Report:
    report = Report()
    mods = load_modules(package, report)
    edges: dict[str, dict[str, int]] = defaultdict(dict)  # module-level: {a: {b: line}}
    for mod in mods.values():
        key = layer_of(mod.name)
        if key not in RANK and key not in SHARED:
            report.unclassified.append(
                f"{mod.rel}: layer {key!r} is in neither LAYERS nor SHARED")
        for imp in collect_imports(mod, mods):
            where = f"{mod.rel}:{imp.line}"
            if imp.local:
                report.local_imports.append(f"{where}: {imp.target} imported inside a function")
            else:
                edges[mod.name].setdefault(imp.target, imp.line)
            tkey = layer_of(imp.target)
            if tkey == key or tkey in SHARED or key not in RANK and key not in SHARED:
                continue  # same layer, a shared leaf, or reported as unclassified
            if key in SHARED:
                if tkey not in SHARED_MAY_IMPORT.get(key, set()):
                    report.layer_breaks.append(f"{where}: shared leaf {key} imports "
                                               f"{imp.target} (layer {tkey})")
            elif tkey not in RANK:
                report.layer_breaks.append(f"{where}: {imp.target} is in no layer")
            elif RANK[tkey] > RANK[key]:
                report.layer_breaks.append(f"{where}: {key} imports {imp.target}, a higher "
                                           f"layer ({key} < {tkey} in LAYERS)")
    for cycle in find_cycles(edges):
        hops = [f"{mods[a].rel}:{edges[a][b]}" for a, b in zip(cycle, cycle[1:])]
        report.cycles.append(" -> ".join(cycle) + f" (imports at {', '.join(hops)})")
    for what, (globs, limit) in BUDGETS.items():
        n = subsystem_lines(package, globs)
        if n > limit:
            report.over_budget.append(f"{what}: {n:,} lines (budget {limit:,})")
    for mod in mods.values():
        for qualname, node in _functions(mod.tree):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES and mod.rel not in TABLES and not _is_long_ok(mod, node):
                report.long_functions.append(
                    f"{mod.rel}:{node.lineno} {qualname}: {n} lines (limit "
                    f"{MAX_FUNCTION_LINES}; or put '# long: <reason>' on the line above)")
    return report


def subsystem_lines(package: Path, globs) -> int:
    """Lines of the ``*.py`` files under ``package`` matching any of ``globs``."""
    files = {p for g in globs for p in package.glob(g)}
    return sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)


def _fail_if(items: list[str], what: str) -> None:
    if items:
        pytest.fail(f"{len(items)} {what}:\n  " + "\n  ".join(items), pytrace=False)


# ----------------------------------------------------------------------------- the rules
@pytest.fixture(scope="module")
def report() -> Report:
    r = check(PACKAGE)
    _fail_if(r.errors, "files that do not parse")
    return r


@pytest.mark.slow
def test_checker_sees_the_package(report):
    mods = load_modules(PACKAGE, Report())
    assert {"tinymt", "tinymt.model", "tinymt.decoding", "tinymt.corpus"} <= mods.keys()
    # the checker finds real edges: the layers import attention, at module level
    edges = {(i.source, i.target) for m in mods.values() for i in collect_imports(m, mods)}
    assert ("tinymt.layers", "tinymt.attention") in edges


@pytest.mark.parametrize("rule, what", [
    ("cycles", "import cycles"),
    ("local_imports", "function-local imports"),
    ("unclassified", "modules outside LAYERS/SHARED"),
    ("layer_breaks", "imports against the layer order"),
    ("over_budget", "subsystems over their line budget"),
    ("long_functions", "functions too long"),
])
def test_rule(report, rule, what):
    _fail_if(getattr(report, rule), what)


# ----------------------------------------------------------------------------- the checker
CLEAN = {
    "__init__.py": "",
    "errors.py": "class TinyMTError(Exception):\n    pass\n",
    "config.py": "from tinymt.errors import TinyMTError\n",
    "corpus/__init__.py": "from tinymt.corpus.pair import Pair\n",  # own submodule: no cycle
    "corpus/pair.py": "from .lexicon import WORDS\n\nclass Pair:\n    pass\n",
    "corpus/lexicon.py": "WORDS = [\n" + "    'w',\n" * 600 + "]\n",  # a table: exempt
    "tokenizer.py": "import tinymt.errors\nfrom tinymt.corpus import Pair\n",
    "data/__init__.py": "from .cache import load\nfrom . import pipeline\n",
    "data/cache.py": "from ..tokenizer import Tokenizer\nfrom tinymt import config\n",
    "data/pipeline.py": "from tinymt.data.cache import load\n",
    "model.py": "import torch\n\n\n# --- the model\n# long: kept whole so it reads\n# top to bottom\n"
                "@staticmethod\ndef forward():\n" + "    x = 1\n" * 90,
    "decoding.py": "from tinymt.model import forward\n\n\ndef search():\n"
                   + "    x = 1\n" * 79,  # 80 lines: at the limit
    "trainer/__init__.py": "from tinymt.trainer.loop import train\n",
    "trainer/loop.py": "from tinymt.decoding import search\nfrom tinymt.data import load\n",
}


def plant(tmp_path: Path, **files: str) -> Path:
    """A tinymt package of the CLEAN files, with ``files`` (``data__cache=...``) replaced."""
    tree = {**CLEAN, **{k.replace("__", "/") + ".py": v for k, v in files.items()}}
    package = tmp_path / "tinymt"
    for rel, text in tree.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    return package


def test_checker_passes_a_clean_tree(tmp_path):
    package = plant(tmp_path)
    mods = load_modules(package, Report())
    assert {"tinymt", "tinymt.corpus", "tinymt.data", "tinymt.data.cache"} <= mods.keys()
    imports = {(i.source, i.target) for m in mods.values() for i in collect_imports(m, mods)}
    assert {("tinymt.data.cache", "tinymt.tokenizer"),  # from ..tokenizer
            ("tinymt.data", "tinymt.data.cache"),  # from .cache (in the package's __init__)
            ("tinymt.data", "tinymt.data.pipeline"),  # from . import pipeline
            ("tinymt.data.cache", "tinymt.config"),  # from tinymt import config
            ("tinymt.corpus.pair", "tinymt.corpus.lexicon"),
            ("tinymt.tokenizer", "tinymt.corpus")} <= imports
    assert check(package) == Report()


def test_checker_reports_a_cycle(tmp_path):
    package = plant(tmp_path, data__cache="from tinymt.data.pipeline import step\n")
    r = check(package)
    assert r.cycles == ["tinymt.data.cache -> tinymt.data.pipeline -> tinymt.data.cache "
                        "(imports at data/cache.py:1, data/pipeline.py:1)"]
    assert r == Report(cycles=r.cycles)
    # a longer one, through a package and a relative import
    package = plant(tmp_path, tokenizer="from .data import load\n",
                    data__cache="from tinymt.tokenizer import Tokenizer\n")
    assert check(package).cycles == [
        "tinymt.data -> tinymt.data.cache -> tinymt.tokenizer -> tinymt.data "
        "(imports at data/__init__.py:1, data/cache.py:1, tokenizer.py:1)"]


def test_checker_reports_a_local_import(tmp_path):
    package = plant(tmp_path, decoding="import os\n\n\ndef search():\n"
                                       "    from tinymt.model import forward\n"
                                       "    import json\n")
    r = check(package)
    assert r == Report(local_imports=["decoding.py:5: tinymt.model imported inside a function"])


def test_checker_reports_upward_imports(tmp_path):
    package = plant(tmp_path,
                    tokenizer="import tinymt.errors\n\n\nclass T:\n    import tinymt.model\n",
                    corpus__pair="from ..decoding import search\n",
                    config="from tinymt.model import forward\n")
    r = check(package)
    assert r.layer_breaks == [
        "config.py:1: shared leaf config imports tinymt.model (layer model)",
        "corpus/pair.py:1: corpus imports tinymt.decoding, a higher layer "
        "(corpus < decoding in LAYERS)",
        "tokenizer.py:5: tokenizer imports tinymt.model, a higher layer "
        "(tokenizer < model in LAYERS)",
    ]
    assert r == Report(layer_breaks=r.layer_breaks)


def test_checker_reports_unknown_modules_and_sizes(tmp_path, monkeypatch):
    monkeypatch.setitem(BUDGETS, "data", (("data/*.py",), 450))
    package = plant(tmp_path, newthing="x = 1\n", data__pipeline="x = 1\n" * 451,
                    model="import torch\n\n\n# long:\ndef forward():\n" + "    x = 1\n" * 90,
                    decoding="def search():\n" + "    x = 1\n" * 80)
    assert check(package) == Report(
        unclassified=["newthing.py: layer 'newthing' is in neither LAYERS nor SHARED"],
        over_budget=["data: 455 lines (budget 450)"],
        long_functions=[
            "decoding.py:1 search: 81 lines (limit 80; or put '# long: <reason>' on the "
            "line above)",
            "model.py:5 forward: 91 lines (limit 80; or put '# long: <reason>' on the "
            "line above)",  # a mark without a reason does not count
        ])


# ----------------------------------------------------------------------------- the doc
def doc_layers(text: str) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """docs/architecture.md's layer picture: its rows (names before the two-space gap, down
    to the ``▼`` line) and the shared leaves (its last line)."""
    block = text.split("## Layers: imports run one way", 1)[1].split("```")[1]
    lines = [line for line in block.splitlines() if line.strip()]
    rows = [tuple(n.strip() for n in re.split(r"\s{2,}", line)[0].split("·"))
            for line in lines[:[line.strip() for line in lines].index("▼")]]
    return rows, tuple(n.strip() for n in lines[-1].split("·"))


def test_the_architecture_doc_draws_these_layers():
    rows, leaves = doc_layers((REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert rows == LAYERS, "docs/architecture.md's layer picture: one row per LAYERS entry"
    assert leaves == tuple(name for name in SHARED if name != "__init__")


def test_the_readme_lists_the_teaching_core_with_its_line_counts():
    """README's "Read the code": the core's files in order, each with its true line count,
    and their total; the core within its budget."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Read the code", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \d+ \| \[`src/tinymt/([^`]+)`\][^|]*\|[^|]*\| (\d+) \|$", section,
                      flags=re.M)
    assert [f for f, _ in rows] == list(CORE)
    counts = {f: len((PACKAGE / f).read_text(encoding="utf-8").splitlines()) for f in CORE}
    assert {f: int(n) for f, n in rows} == counts
    total = re.search(r"the teaching core \| (\d+) \|", section)
    assert total and int(total.group(1)) == sum(counts.values()) <= BUDGETS["the teaching core"][1]
