"""``python -m umsearch`` is the ``umsearch`` command."""

from umsearch.cli import main

main()
