import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SETTLE = """
import gc
from brim.proxy.app import settle_startup_objects
before = gc.get_threshold()
settle_startup_objects()
print(gc.get_freeze_count(), *before, *gc.get_threshold())
"""


def test_a_serving_process_exempts_start_up_objects_and_collects_the_young_less_often() -> None:
    # In a process of its own: the test process keeps its collector as it was.
    done = subprocess.run(
        [sys.executable, "-c", SETTLE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    frozen, *thresholds = map(int, done.stdout.split())
    young_before, older_before, oldest_before, young, older, oldest = thresholds
    assert frozen > 10_000  # the imports: the collector no longer walks them
    assert young_before == 700 and young == 10_000
    assert (older, oldest) == (older_before, oldest_before)
