"""``python -m sendonce.cli``: the same as the ``sendonce`` command."""

from . import main

main()
