"""The documents the code cites are in the repository, with the sections it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r'(docs/[\w-]+\.md)(?:,\s+"([^"]+)")?')


def citations() -> list[tuple[str, str, str | None]]:
    found = []
    for path in sorted((ROOT / "src" / "linattn").rglob("*")):
        if path.suffix in (".py", ".cpp", ".h"):
            # a citation may wrap across lines, of a comment too
            text = re.sub(r"\n\s*(#|//)?\s*", " ", path.read_text())
            found += [(str(path.relative_to(ROOT)), m[1], m[2]) for m in CITATION.finditer(text)]
    return found


def test_the_cited_documents_and_sections_exist():
    cited = citations()
    assert len(cited) > 20  # the code does cite them
    missing = []
    for where, document, section in cited:
        path = ROOT / document
        if not path.is_file():
            missing.append(f"{where}: {document}")
            continue
        headings = {line.lstrip("#").strip() for line in path.read_text().splitlines()
                    if line.startswith("#")}  # fmt: skip
        if section is not None and section not in headings:
            missing.append(f'{where}: {document}, "{section}"')
    assert not missing, "\n".join(sorted(set(missing)))
