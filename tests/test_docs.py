"""The documentation's code runs as written: every ```python block of the
README and of docs/ is run, each page's blocks in order in one fresh
interpreter (a page builds on its earlier blocks), in an empty directory
(pages make their own small data there). A block that cannot run here is
preceded by ``<!-- not run: why -->`` and the reason must be given.

Also: the pages link to files that exist, and ``python -m ferroloader``
prints the report the README's bug section asks for."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import time_limit

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """``(line, language, code)`` of each fenced block; the language of a
    python block preceded by a ``not run`` comment becomes ``skip:<why>``."""
    lines = page.read_text().splitlines()
    out: list[tuple[int, str, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            start, lang = i + 1, m.group(1)
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP.search(prev)
            if lang == "python" and skip:
                lang = f"skip:{skip.group(1)}"
            out.append((start, lang, "\n".join(lines[i + 1 : j]) + "\n"))
            i = j + 1
        else:
            i += 1
    return out


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _param(page: Path) -> Any:
    """A page whose code starts a Ray cluster runs with the Ray tests
    (``ray_cluster``: one cluster at a time on this machine, not beside the
    other tests' processes), with room for Ray's start on a busy machine
    (17 s here when quiet, over 120 s beside two busy processes). Beside
    three other pytest processes and two busy ones, its actors' processes
    once took over the 120 s a loader waits for them to start."""
    if "ray.init(" not in page.read_text():
        return page
    marks = [pytest.mark.xdist_group("ray"), pytest.mark.ray_cluster, time_limit(360)]
    return pytest.param(page, marks=marks)


@pytest.mark.parametrize("page", [_param(p) for p in PAGES], ids=page_id)
def test_page_code_runs(page: Path, tmp_path: Path) -> None:
    """Every python block of the page runs without error, in order."""
    found = blocks(page)
    skipped = [(line, lang) for line, lang, _ in found if lang.startswith("skip:")]
    for line, lang in skipped:
        assert lang[len("skip:") :].strip(), f"{page_id(page)}:{line}: 'not run' needs a reason"
    code = [(line, src) for line, lang, src in found if lang == "python"]
    if not code:
        assert not any(lang == "py" for _, lang, _ in found), "use ```python for Python"
        return
    # One script: each block marked with its line, so a failure names it.
    # The pages' examples are scripts without a __main__ guard, as a reader
    # tries them: under forkserver (Python 3.14's default) or spawn, each
    # worker would import the script and run it again (the guide's README
    # says so). They run with fork here.
    script = ["import multiprocessing\nmultiprocessing.set_start_method('fork')\n"]
    origin = [(0, 0)]
    for line, src in code:
        script.append(f"# --- {page_id(page)}:{line}\n")
        origin.append((sum(s.count("\n") for s in script), line))
        script.append(src)
    path = tmp_path / "page.py"
    path.write_text("".join(script))
    # (a page's ray.init() starts its own local cluster, as on a reader's
    # machine: never a cluster another test started here, which Ray would
    # otherwise find and join, where num_cpus= is refused)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), RAY_ADDRESS="local")
    out = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=330,
    )
    if out.returncode != 0:
        failed = [int(n) for n in re.findall(r'File ".*page\.py", line (\d+)', out.stderr)]
        where = "?"
        if failed:
            at = failed[-1]
            base, md = max((o for o in origin if o[0] <= at), default=(0, 0))
            where = f"{page_id(page)}:{md + at - base}"
        pytest.fail(f"the block at {where} failed:\n{out.stderr[-4000:]}")


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_links_resolve(page: Path) -> None:
    """Every relative link of the page names a file of the repository."""
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        assert (page.parent / target).exists(), f"{page_id(page)} links to missing {target}"


def test_python_m_ferroloader_reports_versions() -> None:
    """The bug report's versions: ferroloader's, torch's, the facilities."""
    out = subprocess.run(
        [sys.executable, "-m", "ferroloader"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    import ferroloader
    import torch

    assert f"ferroloader: {ferroloader.__version__}" in out.stdout
    assert f"torch: {torch.__version__}" in out.stdout
    assert re.search(r"^memfd: (available|missing)", out.stdout, re.M)


def test_no_file_outside_the_repository_is_cited() -> None:
    """The project stands on its own: no page or source cites a design
    document that is not in the repository."""
    for path in [*PAGES, *(ROOT / "src").rglob("*.rs"), *(ROOT / "python").rglob("*.py")]:
        text = path.read_text()
        assert "DESIGN.md" not in text, f"{path.relative_to(ROOT)} cites DESIGN.md"


def _names_beyond_torch() -> list[str]:
    """ferroloader's public names that torch.utils.data does not have
    (``collate`` and ``default_collate_fn_map`` are torch's own objects)."""
    import ferroloader
    import torch.utils.data as tud

    return sorted(
        n
        for n in set(ferroloader.__all__) - set(tud.__all__)
        if n not in ("__version__", "collate", "default_collate_fn_map")
    )


@pytest.mark.parametrize("name", [*_names_beyond_torch(), "DataLoader"])
def test_public_name_has_a_docstring_with_a_working_example(name: str) -> None:
    """Each public name beyond torch's says what it is and shows it in an
    example (``>>>``), and the example runs as shown."""
    import doctest

    import ferroloader

    obj = getattr(ferroloader, name)
    assert obj.__doc__ and ">>>" in obj.__doc__, f"ferroloader.{name} has no example"
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    # (an example's classes live in no module a worker could import: they
    # reach workers only by fork)
    was = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("fork", force=True)
    try:
        for test in finder.find(obj, f"ferroloader.{name}", globs={}):
            runner.run(test)
    finally:
        multiprocessing.set_start_method(was, force=True)
    assert runner.failures == 0, f"the example of ferroloader.{name} failed (output above)"


def test_dataloader_help_documents_every_argument_torch_lacks() -> None:
    """``help(ferroloader.DataLoader)`` documents each argument torch's
    ``DataLoader`` does not have, and the methods it adds."""
    import inspect

    import ferroloader
    import torch.utils.data as tud

    doc = ferroloader.DataLoader.__doc__ or ""
    ours = inspect.signature(ferroloader.DataLoader).parameters
    theirs = inspect.signature(tud.DataLoader).parameters
    for name in set(ours) - set(theirs):
        assert re.search(rf"^\s+{name} \(", doc, re.M), f"DataLoader's doc lacks {name}"
    for method in ("state_dict", "load_state_dict", "stats"):
        assert f"{method}(" in doc
