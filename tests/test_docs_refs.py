"""Docs the code refers to live in this repository: every ``<name>.md`` a source or doc file mentions must exist.

A mention resolves relative to the repository root, to the mentioning file's directory, or as ``docs/<name>.md``.
Mentions inside URLs, runtime file names and other projects' files (``NOT_DOCS``) are not documents. Nothing may point
at the design notes outside the repository (the ``shared`` docs directory). A reference that names a section,
``docs/<name>.md, "Section"``, must name one of that document's ``##`` headings.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("services", "libs", "cli", "schemas", "bench", "deploy", "tests", "docs")
SUFFIXES = {".py", ".toml", ".sh", ".md"}
SKIPPED_DIRS = {".venv", "node_modules", ".floe", "__pycache__", ".git"}
NOT_DOCS = {
    ".floe-prompt.md",  # the session runner writes the prompt there at run time
    "TASK.md",  # written into the toy tasks' repositories (libs/tasks/tools/build_toy.py)
    "SECURITY.md",  # bubblewrap's, quoted by libs/sandbox/README.md
}

URL = re.compile(r"https?://\S+")
MENTION = re.compile(r"(?<![\w./{}-])[\w.][\w./-]*\.md\b")  # not a generated path such as {out}/README.md
OUTSIDE = "shared" + "/docs"  # split so that this file does not mention it
SECTION_REF = re.compile(r"docs/([\w-]+\.md)`?,\s+\"([^\"]+)\"")


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            rel = path.relative_to(ROOT)
            if path.is_file() and path.suffix in SUFFIXES and not SKIPPED_DIRS.intersection(rel.parts):
                files.append(path)
    return files


def mentions(text: str) -> list[str]:
    """The ``.md`` paths a text mentions, outside URLs."""
    found = MENTION.findall(URL.sub(" ", text))
    return [m for m in found if Path(m).name not in NOT_DOCS]


def resolves(mention: str, source: Path) -> bool:
    candidates = (ROOT / mention, source.parent / mention, ROOT / "docs" / Path(mention).name)
    return any(c.is_file() for c in candidates)


def headings(doc: Path) -> set[str]:
    return {m.strip() for m in re.findall(r"^## (.+)$", doc.read_text(), flags=re.M)}


def test_mentions_resolve_on_samples(tmp_path: Path) -> None:
    text = "see docs/harnesses.md §3, README.md and https://example.com/guide.md; prompt in .floe-prompt.md"
    assert mentions(text) == ["docs/harnesses.md", "README.md"]
    assert mentions("report: {out}/README.md") == []
    assert resolves("harnesses.md", ROOT / "services" / "x.py")  # found as docs/harnesses.md
    missing = "no-such-doc" + ".md"
    assert mentions(f"(see {missing} §3.2)") == [missing]
    assert not resolves(missing, ROOT / "services" / "x.py")


def test_every_mentioned_doc_exists() -> None:
    broken = []
    for path in scanned_files():
        text = path.read_text(errors="replace")
        for mention in mentions(text):
            if not resolves(mention, path):
                broken.append(f"{path.relative_to(ROOT)}: {mention}")
    assert not broken, "documents mentioned but not in the repository:\n" + "\n".join(sorted(set(broken)))


def test_nothing_points_outside_the_repository() -> None:
    outside = [str(p.relative_to(ROOT)) for p in scanned_files() if OUTSIDE in p.read_text(errors="replace")]
    assert not outside, f"files pointing at {OUTSIDE}: {outside}"


def test_named_sections_exist() -> None:
    missing = []
    for path in scanned_files():
        for name, section in SECTION_REF.findall(path.read_text(errors="replace")):
            doc = ROOT / "docs" / name
            title = " ".join(section.split())
            if doc.is_file() and title not in headings(doc):
                missing.append(f'{path.relative_to(ROOT)}: docs/{name}, "{title}"')
    assert not missing, "sections named but not in their document:\n" + "\n".join(missing)
