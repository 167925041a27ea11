"""docs/interop.md ("Using taskgrove from ADK, pydantic-ai and other agents") shows the code `make
interop` runs, and the versions it is pinned to: the marked blocks of interop/*.py appear on that
page word for word, and every pin of interop/pins/*.txt is named on it and in interop/README.md."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INTEROP = REPO / "interop"
PAGE = REPO / "docs" / "interop.md"
BLOCK = re.compile(r"^# docs/interop.md: (?P<name>[\w-]+)\n(?P<code>.*?)^# docs/interop.md: end$", re.S | re.M)


def test_every_marked_block_of_the_interop_scripts_is_on_the_page_word_for_word() -> None:
    page = PAGE.read_text()
    blocks = {m["name"]: m["code"].rstrip("\n") for script in INTEROP.glob("*.py")
              for m in BLOCK.finditer(script.read_text())}
    assert set(blocks) == {"adk-client", "adk-server", "pydantic-server"}
    for name, code in blocks.items():
        assert f"```python\n{code}\n" in page, f"docs/interop.md's {name} snippet differs from the interop script"


def test_the_pinned_versions_are_the_ones_the_page_and_the_interop_readme_name() -> None:
    texts = [" ".join(p.read_text().split()) for p in (PAGE, INTEROP / "README.md")]
    pins = [line.split("==") for pins in (INTEROP / "pins").glob("*.txt")
            for line in pins.read_text().splitlines() if "==" in line and not line.startswith("#")]
    named = [(re.sub(r"\[.*\]", "", name), version) for name, version in pins
             if not name.startswith(("uvicorn", "httpx"))]  # servers' plumbing, not the subject
    assert {n for n, _ in named} >= {"google-adk", "pydantic-ai-slim", "fasta2a", "a2a-sdk", "a2a-lint"}
    for text in texts:
        for name, version in named:
            assert f"{name} {version}" in text, f"{name} {version} is pinned but not named"
