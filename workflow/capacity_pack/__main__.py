"""``python -m capacity_pack`` is the ``capacity-pack`` command.

A plain ``analyze`` command line is answered by :mod:`capacity_pack.quick_commands` without
importing the command-line framework; every other one goes to :mod:`capacity_pack.cli`.
"""

import sys


def main() -> None:
    from capacity_pack.quick_commands import run

    status = run(sys.argv[1:])
    if status is not None:
        sys.exit(status)
    from capacity_pack.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
