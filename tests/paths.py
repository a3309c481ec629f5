"""Where the tests find the checkout: the repository root, its default pack and test data."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "config" / "config.yaml"
DATA = ROOT / "tests" / "data"
DEFAULT = DEFAULT_CONFIG
TUTORIAL = ROOT / "config" / "packs" / "tutorial-70b.yaml"
