"""``python -m capacity_pack`` is the ``capacity-pack`` command."""

from capacity_pack.cli import main

main()
