"""``python -m capacity_pack.sim``: the ``sim`` command group without the top-level CLI."""

from capacity_pack.sim.cli import sim

if __name__ == "__main__":
    sim(prog_name="capacity-pack sim")
