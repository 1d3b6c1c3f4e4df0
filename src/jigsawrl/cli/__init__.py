"""Band 3 — the ``jigsawrl`` command line (thin: parse, call, print). The app is in
:mod:`jigsawrl.cli.main`; the real-engine commands in :mod:`jigsawrl.cli.real`."""

from jigsawrl.cli.main import app, main

__all__ = ["app", "main"]
