"""Fill-in-the-middle through a real `localspec serve` on the Qwen2.5-Coder fixtures: for each case, the
same request with speculative.method none, then each other method, back to back on one server (serve's
--draft-method auto); greedy, so the middles must agree. Prints decode tok/s, acceptance and tokens per pass.

    python benchmarks/fim_serve.py 0.5b none,auto,ngram
    python benchmarks/fim_serve.py 1.5b+0.5b none,auto,model
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fixture_models import fetch  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

Q05, Q15 = str(fetch("qwen-0.5b")), str(fetch("qwen-1.5b"))
CASES = {
    "add": ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"),
    "vector": (
        "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
        "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
        "    def __sub__(self, other):\n        ",
        "\n\n    def __mul__(self, k):\n        return Vector(self.x * k, self.y * k)\n\n"
        "    def __neg__(self):\n        return Vector(-self.x, -self.y)\n",
    ),
    "tests": (
        "import unittest\n\nclass TestMath(unittest.TestCase):\n    def test_add(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n        self.assertEqual(add(-1, 1), 0)\n"
        "        self.assertEqual(add(0, 0), 0)\n\n    def test_sub(self):\n        ",
        "\n\n    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
        "        self.assertEqual(mul(-1, 1), -1)\n        self.assertEqual(mul(0, 5), 0)\n",
    ),
    "config": (
        "class Config:\n    def __init__(self, host, port, user, password, database, timeout, retries):\n        ",
        "\n\n    def url(self):\n"
        '        return f"{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"\n\n'
        "    def __repr__(self):\n"
        '        return (f"Config(host={self.host!r}, port={self.port!r}, user={self.user!r}, "\n'
        '                f"timeout={self.timeout!r}, retries={self.retries!r})")\n',
    ),
}
setups = {"0.5b": ["--target", Q05], "1.5b+0.5b": ["--target", Q15, "--draft", Q05]}


def main(name: str, methods: list[str]) -> None:
    s = ServeProcess(
        *setups[name],
        "--draft-method",
        "auto",
        "--n-ctx",
        "2048",
        "--threads",
        "2",
        "--model-name",
        "m",
        "--no-suffix-memory",
    )
    try:
        c = s.client()
        c.completions.create(model="m", prompt="Hello, my name is", max_tokens=8, temperature=0)  # warm-up
        for case, (p, suf) in CASES.items():
            texts = set()
            for method in methods:
                r = c.completions.create(
                    model="m",
                    prompt=p,
                    suffix=suf,
                    max_tokens=96,
                    temperature=0,
                    stop=["\n\n"],
                    extra_body={"speculative": {"method": method}},
                )
                t = r.model_extra["timings"]
                texts.add(r.choices[0].text)
                row = {"setup": name, "method": method, "case": case, "n": t["predicted_n"],
                       "tok_s": round(t["predicted_per_second"], 1), "accept": round(t["acceptance_rate"], 2),
                       "len": round(t["mean_accepted_length"], 2), "sources": t["draft_sources"]}  # fmt: skip
                print(json.dumps(row), flush=True)
            print(json.dumps({"case": case, "same_text": len(texts) == 1, "text": sorted(texts)[0]}), flush=True)
    finally:
        s.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
