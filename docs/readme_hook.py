"""MkDocs hook: the site's home page is the repository's README.md, so the front door is written once.

The README stays at the top of the repository, where a checkout, a code host and the package index
show it, and links into the manual as `docs/<page>.md`. The site's root is docs/, so on the site the
same links are `<page>.md`: the README is added as the generated page `index.md` with that one prefix
taken off, and `mkdocs build --strict` then checks its links like any other page's.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files


def on_files(files: Files, config: MkDocsConfig) -> Files:
    readme = Path(config.config_file_path).parent / "README.md"
    text = readme.read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "index.md", content=text))
    return files
