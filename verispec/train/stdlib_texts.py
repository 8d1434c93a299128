"""English passages and code read from the Python standard library installed on this machine.

The training prompt sources (``verispec.train.sources``) quote them: long docstrings to
summarise, extract from or translate, and functions or classes to explain or rewrite. The
text is the Python Software Foundation's (PSF License), read from the ``.py`` files under
``sysconfig``'s stdlib path with ``ast``, in sorted file order, so the same Python version
gives the same index on any machine.

Terms:

- a *passage* is a module, class or function docstring of at least ``MIN_DOC_CHARS``
  characters (cleaned by ``ast.get_docstring``), cut at paragraph or sentence boundaries to at
  most ``MAX_PASSAGE_CHARS``;
- a *snippet* is a function or class of ``MIN_CODE_LINES`` to ``MAX_CODE_LINES`` lines (at
  module level or a method), dedented, at most ``MAX_CODE_CHARS`` long;
- a *reserved* module is one whose top-level package hashes into the held-out slice
  (``is_reserved``): its texts make the held-out scoring prompts and never training ones.
  Training texts that share an eight-word run with a reserved text are dropped too (the
  stdlib repeats docstrings between a module and its pure-Python twin).

Parsing the whole library takes several seconds, so the index is kept in the cache directory
(keyed by the Python version, the stdlib path, every file's size and modification time, and
this module's source)
and in this module once loaded.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import re
import sysconfig
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from verispec.cache import cache_root

PYTHON_VERSION = platform.python_version()
MIN_DOC_CHARS = 400
MAX_PASSAGE_CHARS = 1600
MIN_CODE_LINES, MAX_CODE_LINES = 10, 60
MAX_CODE_CHARS = 1800
RESERVED_SLICE = 12  # one top-level package in about this many is held out for scoring
MIN_TRANSLATE_CHARS = 150  # a passage's opening to translate is at least this long, if it can be
SHINGLE = 8  # words: a run this long in common means a copied phrase, not shared idiom

# Directories whose files are tests, demos, bundled data or tools rather than library text.
SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "ensurepip",
     "pydoc_data", "venv", "__pycache__"}
)  # fmt: skip
# Docstrings that are licence or copyright notices, not prose to work on.
NOTICE = re.compile(r"copyright|all rights reserved|licen[cs]e", re.IGNORECASE)


@dataclass(frozen=True)
class StdlibText:
    """One passage or snippet: the module it comes from, the dotted name of the class or
    function inside it ("" for the module docstring), and the text."""

    module: str
    name: str
    text: str


@dataclass(frozen=True)
class StdlibIndex:
    """Training passages and snippets, and the reserved ones kept for held-out scoring."""

    passages: tuple[StdlibText, ...]
    snippets: tuple[StdlibText, ...]
    reserved_passages: tuple[StdlibText, ...]
    reserved_snippets: tuple[StdlibText, ...]


def shingles(text: str, size: int = SHINGLE) -> set[tuple[str, ...]]:
    """Every run of ``size`` consecutive words of ``text`` (lower-cased, split on whitespace)."""
    words = text.lower().split()
    return {tuple(words[i : i + size]) for i in range(len(words) - size + 1)}


def is_reserved(module: str) -> bool:
    """Whether a module belongs to the held-out slice: decided by a stable hash of its
    top-level package, so a package's modules (which share docstrings) fall on one side."""
    top = module.split(".")[0]
    return hashlib.sha256(top.encode()).digest()[0] % RESERVED_SLICE == 0


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """The library's .py files in sorted order, without the SKIP_DIRS trees."""
    files: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIP_DIRS and not d.startswith((".", "config-")))
        files.extend(Path(directory) / name for name in sorted(names) if name.endswith(".py"))
    return files


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def cut_passage(text: str, limit: int = MAX_PASSAGE_CHARS) -> str:
    """The longest run of whole paragraphs from the start that fits ``limit``; if the first
    paragraph alone is too long, its longest run of whole sentences that fits."""
    text = re.sub(r"^(?:[^\w\n]*\n)+", "", text.strip())  # leading lines of bare punctuation
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    kept: list[str] = []
    for paragraph in paragraphs:
        if len("\n\n".join([*kept, paragraph])) > limit:
            break
        kept.append(paragraph)
    if kept:
        return "\n\n".join(kept)
    sentences = re.split(r"(?<=[.!?])\s+", paragraphs[0])
    out = ""
    for sentence in sentences:
        if len(out) + len(sentence) + 1 > limit:
            break
        out = f"{out} {sentence}" if out else sentence
    return out


def first_paragraph(text: str) -> str:
    """The first paragraph, joined with the next ones while shorter than MIN_TRANSLATE_CHARS
    (a one-line summary alone is too little to translate)."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    out = paragraphs[0]
    for paragraph in paragraphs[1:]:
        if len(out) >= MIN_TRANSLATE_CHARS:
            break
        out = f"{out}\n\n{paragraph}"
    return out


def is_prose(text: str) -> bool:
    """Mostly English sentences: not a notice, not doctest sessions or tables."""
    if NOTICE.search(text):
        return False
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    code_like = sum(line.startswith((">>>", "...", "|", "+-", "$")) for line in lines)
    letters = sum(c.isalpha() or c == " " for c in text)
    return code_like <= len(lines) // 5 and letters >= 0.8 * len(text)


def texts_of(root: Path, path: Path) -> tuple[list[StdlibText], list[StdlibText]]:
    """The passages and snippets of one file (module level, its classes and their methods;
    nested functions are left out)."""
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a file for another Python version (lib2to3 fixtures and the like)
        return [], []
    module = module_name(root, path)
    # Split once (ast.get_source_segment splits the file again for every node), on "\n" only:
    # ast numbers lines that way, str.splitlines would also split at form feeds.
    lines = source.split("\n")
    passages: list[StdlibText] = []
    snippets: list[StdlibText] = []

    def visit(node: ast.AST, prefix: str) -> None:
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_DOC_CHARS and is_prose(doc):
                passage = cut_passage(doc)
                if len(passage) >= MIN_DOC_CHARS // 2:
                    passages.append(StdlibText(module, prefix, passage))
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first, last = node.lineno, node.end_lineno or node.lineno  # the def line, after decorators
            if MIN_CODE_LINES <= last - first + 1 <= MAX_CODE_LINES:
                code = textwrap.dedent("\n".join(lines[first - 1 : last])).strip("\n")
                if len(code) <= MAX_CODE_CHARS and code.isascii():
                    snippets.append(StdlibText(module, prefix, code))
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for child in node.body:
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, f"{prefix}.{child.name}" if prefix else child.name)

    visit(tree, "")
    return passages, snippets


def build_index(root: Path) -> StdlibIndex:
    """Parse the library (seconds): split reserved from training texts, drop training texts
    that share an eight-word run with a reserved one, and repeated texts."""
    passages: list[StdlibText] = []
    snippets: list[StdlibText] = []
    for path in stdlib_files(root):
        found_passages, found_snippets = texts_of(root, path)
        passages.extend(found_passages)
        snippets.extend(found_snippets)

    def split(texts: list[StdlibText]) -> tuple[tuple[StdlibText, ...], tuple[StdlibText, ...]]:
        first_of: dict[str, StdlibText] = {}  # a text that appears twice is kept once
        for text in texts:
            first_of.setdefault(text.text, text)
        unique = list(first_of.values())
        reserved = [t for t in unique if is_reserved(t.module)]
        held = set().union(*(shingles(t.text) for t in reserved)) if reserved else set()
        training = [t for t in unique if not is_reserved(t.module) and not shingles(t.text) & held]
        return tuple(training), tuple(reserved)

    train_passages, reserved_passages = split(passages)
    train_snippets, reserved_snippets = split(snippets)
    return StdlibIndex(train_passages, train_snippets, reserved_passages, reserved_snippets)


def index_key(root: Path) -> str:
    """What the index depends on: Python version, path, each file's size and mtime, and the
    selection rules (this module's own source)."""
    digest = hashlib.sha256(f"{PYTHON_VERSION}|{root}|".encode())
    digest.update(Path(__file__).read_bytes())
    for path in stdlib_files(root):
        stat = path.stat()
        digest.update(f"|{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


def _to_json(index: StdlibIndex) -> str:
    fields = ("passages", "snippets", "reserved_passages", "reserved_snippets")
    return json.dumps({f: [[t.module, t.name, t.text] for t in getattr(index, f)] for f in fields})


def _from_json(text: str) -> StdlibIndex:
    data = json.loads(text)
    return StdlibIndex(**{f: tuple(StdlibText(*row) for row in rows) for f, rows in data.items()})


@functools.cache
def stdlib_index() -> StdlibIndex:
    """The index of this machine's standard library, from the cache when it is there."""
    root = stdlib_root()
    path = cache_root() / "prompt-sources" / f"stdlib-{index_key(root)}.json"
    if path.is_file():
        try:
            return _from_json(path.read_text())
        except (ValueError, TypeError):  # a damaged cache file: rebuild it below
            pass
    index = build_index(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=".staging-", dir=path.parent)
    with os.fdopen(handle, "w") as file:
        file.write(_to_json(index))
    os.replace(staging, path)  # atomic: a concurrent builder writes the same content
    return index
