"""What ``import ferroloader`` does to torch: nothing. torch's ``DataLoader``
keeps its signature and its help text; once a ferroloader loader is built
(or a patch entered) the class gets its hook, and ``inspect.signature``
still answers for it and its subclasses as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import inspect, pydoc
    import torch.utils.data as tud

    class Mine(tud.DataLoader):
        def __init__(self, dataset, scale=2):
            super().__init__(dataset)

    class Inherits(Mine):
        pass

    def snapshot():
        return [str(inspect.signature(c)) for c in (tud.DataLoader, Mine, Inherits)]

    before = snapshot()
    doc = pydoc.render_doc(tud.DataLoader, renderer=pydoc.plaintext)
    import ferroloader
    assert "__new__" not in vars(tud.DataLoader), "the import changed torch's class"
    assert snapshot() == before, (snapshot(), before)
    assert pydoc.render_doc(tud.DataLoader, renderer=pydoc.plaintext) == doc
    print("import: unchanged")

    ferroloader.DataLoader(list(range(4)), batch_size=2)
    assert snapshot() == before, (snapshot(), before)
    with ferroloader.patch():
        built = tud.DataLoader(list(range(4)), batch_size=2)
        assert type(built) is ferroloader.DataLoader
        assert snapshot() == before
    assert type(Inherits(list(range(4)))) is Inherits
    assert "seed" in inspect.signature(ferroloader.DataLoader).parameters
    print("hooked: signatures unchanged")
    """
)


def test_import_leaves_torch_dataloader_signature_and_help() -> None:
    """Importing ferroloader changes neither the signature nor the help of
    torch's class; building a ferroloader loader and patching keep every
    signature (torch's class, a subclass, a subclass of that)."""
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr
    assert "import: unchanged" in out.stdout
    assert "hooked: signatures unchanged" in out.stdout


_REBIND = textwrap.dedent(
    """
    import torch, torch.utils.data, torch.utils.data.dataloader
    import ferroloader

    # the swap people make in code they cannot edit
    torch.utils.data.dataloader.DataLoader = ferroloader.DataLoader
    torch.utils.data.DataLoader = ferroloader.DataLoader
    for nw, method in ((0, "multiprocessing"), (2, "multiprocessing"), (2, "thread"),
                       (5, "multiprocessing")):
        extra = {"worker_method": method} if nw else {}
        loader = torch.utils.data.DataLoader(torch.arange(8), batch_size=4, num_workers=nw,
                                             **extra)
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    print("rebound: loads")
    """
)


def test_torch_names_rebound_to_ferroloader_load_without_recursion() -> None:
    """torch's names rebound to ferroloader's class: every loader still
    loads (torch's own methods are looked up on the class captured at
    import, not through the names)."""
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _REBIND], capture_output=True, text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rebound: loads" in out.stdout


_LIVE_AT_EXIT = textwrap.dedent(
    """
    import ferroloader
    loader = ferroloader.DataLoader(list(range(10)), batch_size=2)
    it = iter(loader)
    next(it)
    auto = iter(ferroloader.DataLoader(list(range(10)), batch_size=2, num_workers="auto"))
    next(auto)
    kept = ferroloader.DataLoader(list(range(40)), batch_size=4, num_workers=2,
                                  persistent_workers=True)
    for _ in range(2):
        for _ in kept:
            pass
    live = iter(ferroloader.DataLoader(list(range(40)), batch_size=4, num_workers=2))
    next(live)
    """
)


def test_an_iterator_alive_at_exit_says_nothing() -> None:
    """A script that ends with its iterators alive exits as torch's does:
    no "Exception ignored in ... __del__" on stderr (one process, "auto",
    persistent workers between epochs, workers mid-epoch)."""
    out = subprocess.run([sys.executable, "-c", _LIVE_AT_EXIT], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
