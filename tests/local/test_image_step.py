"""A failed image build step (a real process) shows its command and output with
the index credentials masked (launcher/slurm/imagebuild.py; the rest:
tests/unit/test_image_units.py)."""

from __future__ import annotations

import sys

import pytest

from launcher.slurm import imagebuild as image

TOKEN = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0" * 2


def test_failed_step_shows_its_command_and_output_masked() -> None:
    """A real failing command whose argv and output hold an index token."""
    url = f"https://build:{TOKEN}@pypi.example.org/simple"
    with pytest.raises(image.ImageError) as info:
        image._run(
            [sys.executable, "-c", "import sys; print(sys.argv[1]); sys.exit(3)", url],
            what="pip install in the image",
            capture=True,
        )
    msg = str(info.value)
    assert TOKEN not in msg and "https://***@pypi.example.org/simple" in msg, msg
    assert msg.startswith("pip install in the image failed (exit 3): ")
