"""Fail when the built wheel lacks a module or data file of the source tree (`localspec/`)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("*.py", "*.toml", "*.tcss", "*.txt")  # code and the data files read at run time


def expected() -> set[str]:
    pkg = ROOT / "localspec"
    return {
        p.relative_to(ROOT).as_posix()
        for pattern in SHIPPED
        for p in pkg.rglob(pattern)
        if "__pycache__" not in p.parts
    }


def main() -> None:
    wheel = Path(sys.argv[1])
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(expected() - names)
    if missing:
        sys.exit(f"{wheel.name} lacks {len(missing)} file(s) of the source tree: " + ", ".join(missing[:20]))
    print(f"{wheel.name}: {len(expected())} modules and data files, all present")


if __name__ == "__main__":
    main()
