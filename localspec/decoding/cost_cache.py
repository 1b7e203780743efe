"""Auto's measured costs, remembered on disk so that no run has to learn them twice.

One small JSON file per (target file, draft file, backend build, device, threads) under the user cache
directory ($LOCALSPEC_CACHE_DIR, else $XDG_CACHE_HOME/localspec, else ~/.cache/localspec), in
costs/. A file is identified by its resolved path, size and modification time, so a re-downloaded or
converted model is measured afresh. A damaged or unreadable file counts as absent; a cache that cannot
be written is skipped silently (the next run measures again).

A stored curve is a hypothesis: CurveCheck tests it against the rounds that run, and auto drops (and
measures afresh) one they contradict.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from localspec.backends.registry import BACKENDS
from localspec.decoding.policy import CostModel

VERSION = 1  # bump when the meaning of the stored numbers changes


def cache_dir() -> Path:
    explicit = os.environ.get("LOCALSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "localspec"


def file_identity(path: str | None) -> str:
    """Resolved path, size and mtime of a model file (or directory); the path alone if it cannot be read."""
    if not path:
        return "-"
    p = Path(path).expanduser()
    try:
        st = p.resolve().stat()
    except OSError:
        return str(p)
    return f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def backend_build(backend: str) -> str:
    """The installed versions of a backend's packages (a new build can have a different cost curve)."""
    parts = []
    spec = BACKENDS.get(backend)
    for dist in spec.distributions if spec is not None else (backend,):
        try:
            parts.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}=?")
    return ",".join(parts)


MIN_BATCH_RATIO = 0.5  # a forward of n > 1 tokens never costs less than half of one token's
MAX_INVERSION = 2.0  # ... and a smaller batch never costs more than twice a larger one


def plausible(target: dict[int, float]) -> bool:
    """Whether a measured cost curve can be this machine's: one token measured, no batch cheaper than half
    a single token, and no batch dearer than twice a larger one. A calibration timed once per size on a
    busy machine can break either (seen: T(2) at 0.23 x T(1); T(3) at 18 x T(1) next to T(16) at 3.3 x);
    such a curve makes auto draft where it loses, or never where it wins, in every later run."""
    t1 = target.get(1)
    if not t1 or any(t < MIN_BATCH_RATIO * t1 for n, t in target.items() if n > 1):
        return False
    cheapest_above = float("inf")
    for n in sorted(target, reverse=True):
        if target[n] > MAX_INVERSION * cheapest_above:
            return False
        cheapest_above = min(cheapest_above, target[n])
    return True


@dataclass(frozen=True)
class CostStore:
    """Where one model pair's costs on this machine live."""

    key: str
    description: str  # what the key stands for, stored alongside the numbers for people who look
    root: Path | None = None  # the cache directory (None: cache_dir()); bench's cold and warm cases use their own

    @classmethod
    def for_models(cls, *, target: str, draft: str | None, backend: str, device: str, threads: int | None) -> CostStore:
        desc = (
            f"target={file_identity(target)} draft={file_identity(draft)} build={backend_build(backend)} "
            f"device={device} threads={threads or os.cpu_count()}"
        )
        return cls(hashlib.sha256(f"v{VERSION} {desc}".encode()).hexdigest()[:24], desc)

    @property
    def path(self) -> Path:
        return (self.root or cache_dir()) / "costs" / f"{self.key}.json"

    def load(self) -> CostModel | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") != VERSION:
                return None
            target = {int(n): float(t) for n, t in data["target_s"].items() if float(t) > 0}
            draft = data.get("draft_token_s")
            if not plausible(target):
                return None  # measured in a bad spell: measure afresh
            return CostModel(target=target, draft_token=float(draft) if draft is not None else None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def held(self) -> int:
        """How many check pairs in a row the stored curve has passed, over the runs that used it (0: none yet,
        or the last one disagreed): auto checks a curve that keeps holding less and less often."""
        try:
            held = json.loads(self.path.read_text(encoding="utf-8")).get("checks_held", 0)
            return max(int(held), 0)
        except (OSError, ValueError, TypeError, AttributeError):
            return 0

    def save(self, costs: CostModel, held: int = 0) -> None:
        """Store the costs as seconds on today's pace (the model's common scale folded in); `held`: see held()."""
        if not plausible({n: costs.target_s(n) for n in costs.target}):
            return  # one busy spell must not stand for this machine in every later run
        data = {
            "version": VERSION,
            "models": self.description,
            "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "target_s": {str(n): costs.target_s(n) for n in sorted(costs.target)},
            "draft_token_s": costs.draft_s(),
            "checks_held": held,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)  # readers never see half a file
        except OSError:
            pass

    def drop(self) -> None:
        """Forget the stored costs (contradicted by live rounds): the next run measures afresh."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


# A curve is contradicted when live rounds put T(n) / T(1) off its own by more than this factor either way,
# as the median of the last CHECK_PAIRS pairs. Wide enough for what live rounds add to a forward pass
# (sampling the rows; a few percent) and for a pair split by a busy spell (the median); narrow enough
# for the curves seen to mislead auto (16x too steep; T(1) above T(2): about 2x off).
CONTRADICTION = 1.5
CHECK_PAIRS = 3


@dataclass
class CurveCheck:
    """A cost curve tested against live rounds. Two adjacent rounds, one a 1-token pass and one a batch of
    n > 1 (verify seconds, without rollbacks), give T(n) / T(1) as the machine runs now, with a busy spell
    slowing both alike; over the curve's own T(n) / T(1) that is one deviation (1.0: the curve holds)."""

    curve: dict[int, float]  # seconds by batch size, as stored
    deviations: list[float] = field(default_factory=list)
    last: tuple[int, float] | None = None  # the previous round's (batch size, seconds)
    _shape: CostModel = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._shape = CostModel(target=self.curve)  # interpolates the sizes the curve does not hold

    def ratio(self, n: int) -> float:
        """T(n) / T(1) by the curve."""
        return self._shape.target_s(n) / self._shape.target_s(1)

    def observe(self, n: int, seconds: float) -> float | None:
        """One round; the deviation of the pair it closes with the round before (None: no pair)."""
        prev, self.last = self.last, (n, seconds)
        if prev is None or (prev[0] == 1) == (n == 1) or min(prev[1], seconds) <= 0:
            return None
        (_, t1), (nb, tb) = sorted([prev, (n, seconds)])
        deviation = (tb / t1) / self.ratio(nb)
        self.deviations = [*self.deviations[-(CHECK_PAIRS - 1) :], deviation]
        return deviation

    @property
    def deviation(self) -> float | None:
        """The median of the last CHECK_PAIRS deviations (None until there are that many)."""
        return statistics.median(self.deviations) if len(self.deviations) >= CHECK_PAIRS else None

    @property
    def contradicted(self) -> bool:
        d = self.deviation
        return d is not None and not 1 / CONTRADICTION <= d <= CONTRADICTION

    def new_generation(self) -> None:
        self.last = None  # rounds of different answers are not neighbours
