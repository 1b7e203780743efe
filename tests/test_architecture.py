"""The layering rules of docs/architecture.md, checked on the source: no import cycle among localspec's modules,
imports only go down the layers (lazy imports inside functions count the same; `if TYPE_CHECKING:` imports,
which never run, do not), and no backend is named by a string outside its home."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "localspec"

# Top to bottom; a module belongs to the first layer one of whose prefixes it starts with.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("front ends", ("localspec.cli", "localspec.commands", "localspec.tui", "localspec.server")),
    ("pipeline", ("localspec.pipeline", "localspec.options", "localspec.bench", "localspec.report")),
    ("catalog and hub", ("localspec.catalog", "localspec.hub")),
    ("families", ("localspec.families",)),
    ("engine and backends", ("localspec.decoding", "localspec.backends", "localspec.convert_gguf")),
    ("bottom", ("localspec",)),  # errors, vocab, gguf_meta, formatting, sampling, draft, recurrent, fim, ...
]


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        out[name] = path
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child):
            yield from (n for c in child.orelse for n in _walk_self(c))
            continue
        yield child
        yield from _walk(child)


def _walk_self(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    yield from _walk(node)


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's own modules `name` imports (`from a.b import c` counts a.b.c when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(name)


def test_no_import_cycles() -> None:
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_only_go_down() -> None:
    up = [
        f"{name} ({LAYERS[layer(name)][0]}) imports {dep} ({LAYERS[layer(dep)][0]})"
        for name, deps in graph().items()
        for dep in sorted(deps)
        if layer(dep) < layer(name) and not (dep == "localspec" or name.startswith(dep + "."))
    ]
    assert not up, "\n".join(up)


BACKEND_NAME = re.compile(r"""(?:==|!=|\bin\b)\s*\(?\s*["'](llama|mlx)["']|["'](llama|mlx)["']\s*(?:==|!=)""")
BACKEND_HOMES = ("localspec/backends/",)  # where a backend may be named; everyone else asks the backend table


def test_no_backend_is_named_outside_its_home() -> None:
    """Comparisons with a backend's name ("llama", "mlx") are the table's business (backends/registry.py)."""
    found = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel.startswith(BACKEND_HOMES):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if (
                BACKEND_NAME.search(code)
                and "model_type" not in code
                and "tokenizer" not in code
                and "arch" not in code
            ):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


BACKEND_LIBRARIES = ("llama_cpp", "mlx", "mlx_lm")  # what a backend's folder may import, and nothing shared


def _imported_names(path: Path) -> set[str]:
    """Every module name `path` imports, lazy imports included (`if TYPE_CHECKING:` ones left out)."""
    out: set[str] = set()
    for node in _walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_each_backend_lives_in_its_own_folder() -> None:
    """What every backend shares (localspec/backends/*.py: the protocol, the table, heads.py) imports no backend's
    folder and no backend library; one backend's folder never imports another's. A new backend is a new folder."""
    backends = PKG / "backends"
    folders = sorted(p.name for p in backends.iterdir() if (p / "__init__.py").is_file())
    assert {"llama", "mlx"} <= set(folders), folders
    found = []
    for path in sorted(backends.rglob("*.py")):
        rel = path.relative_to(backends)
        own = rel.parts[0] if len(rel.parts) > 1 else None
        for name in sorted(_imported_names(path)):
            top = name.split(".")[0]
            folder = name.split(".")[2] if name.startswith("localspec.backends.") and name.count(".") >= 2 else None
            if own is None and (top in BACKEND_LIBRARIES or folder in folders):
                found.append(f"{rel} (shared) imports {name}")
            elif own is not None and folder in folders and folder != own:
                found.append(f"{rel} ({own}) imports {name}")
    assert not found, "\n".join(found)


def test_the_families_name_no_backend() -> None:
    """A head family reaches each backend through the table (BackendSpec.heads_module): the families import no
    backend's folder and no backend's descriptor (LLAMA, MLX) to compare with."""
    from localspec.backends import registry

    folders = {p.name for p in (PKG / "backends").iterdir() if (p / "__init__.py").is_file()}
    found = []
    for path in sorted((PKG / "families").rglob("*.py")):
        for name in sorted(_imported_names(path)):
            parts = name.split(".")
            in_folder = name.startswith("localspec.backends.") and len(parts) >= 3 and parts[2] in folders
            descriptor = name.startswith("localspec.backends.registry.") and isinstance(
                getattr(registry, parts[-1], None), registry.BackendSpec
            )
            if in_folder or descriptor:
                found.append(f"{path.relative_to(PKG.parent)} imports {name}")
    assert not found, "\n".join(found)
