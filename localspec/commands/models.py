"""`localspec models`: the catalog's pairs, and which are downloaded for each backend (no network)."""

from __future__ import annotations

import argparse
import json
import sys

from localspec.backends.registry import backend_names
from localspec.formatting import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list the catalog's model pairs and whether they are downloaded",
        description="List the target/draft pairs of the catalog (built-in models.toml plus your own file) "
        "with their download state per backend. Reads only the local Hugging Face cache.",
    )
    p.add_argument("--backend", choices=backend_names(), default=None, help="only this backend")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def model_states(backend: str | None = None) -> list[dict]:
    """One dict per (pair, backend): the data behind the listing (also handy for the TUI)."""
    from localspec.catalog import cached_model_path, disk_size, load_catalog

    rows = []
    catalog = load_catalog()
    for pair in catalog.pairs.values():
        for b, bp in pair.backends.items():
            if backend and b != backend:
                continue
            roles = {}
            for role in ("target", "draft"):
                ref = bp.role(role)
                path = cached_model_path(ref, b)
                roles[role] = {"ref": str(ref), "path": path, "bytes": disk_size(path, b)}
            have = [r for r in roles if roles[r]["path"]]
            status = "ready" if len(have) == 2 else (f"partial: {have[0]} only" if have else "not pulled")
            rows.append(
                {
                    "name": pair.name,
                    "default": pair.name == catalog.default,
                    "backend": b,
                    "status": status,
                    "bytes_on_disk": sum(r["bytes"] for r in roles.values()),
                    "size_gb": bp.size_gb,
                    "num_draft": pair.num_draft,
                    "method": pair.method,
                    "description": pair.description,
                    "hardware": pair.hardware,
                    "source": pair.source,
                    "target": roles["target"],
                    "draft": roles["draft"],
                }
            )
    return rows


def run(args: argparse.Namespace) -> int:
    from localspec.catalog import hub_cache_dir, user_catalog_path

    rows = model_states(args.backend)
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    out = sys.stdout
    last = None
    for r in rows:
        if r["name"] != last:
            if last is not None:
                out.write("\n")
            extra = "" if r["source"] == "built-in" else f"  [from {r['source']}]"
            mark = "  [default: used when no model is given]" if r["default"] else ""
            out.write(f"{r['name']}  (num_draft {r['num_draft']}){mark}{extra}\n")
            out.write(f"  {r['description']}\n")
            if r["hardware"]:
                out.write(f"  suits: {r['hardware']}\n")
            last = r["name"]
        disk = format_bytes(r["bytes_on_disk"]) + " on disk" if r["bytes_on_disk"] else "-"
        downloaded = r["status"].startswith("ready")
        size = f"~{r['size_gb']:g} GB download" if r["size_gb"] and not downloaded else ""
        out.write(f"  {r['backend']:<5}  {r['status']:<19} {disk:<18} {size}\n")
        drafter = "draft " if r["method"] == "model" else f"{r['method']} head in"  # e.g. "mtp head in"
        out.write(f"         target {r['target']['ref']}\n         {drafter:<6} {r['draft']['ref']}\n")
    out.write(
        f"\ncache: {hub_cache_dir()}\n"
        f"your pairs: {user_catalog_path()}\n"
        'download:  localspec pull NAME --backend llama|mlx   run: localspec run "PROMPT" --pair NAME '
        "(no --pair: the default, pulled on first use)\n"
    )
    return 0
