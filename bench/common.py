"""What the Python benchmarks under bench/ share (import with bench/ on sys.path)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def vigil_binary():
    """$VIGIL, or the release build of `vigil` (built first when missing)."""
    path = os.environ.get("VIGIL")
    if path:
        return path
    path = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "vigil")
    if not os.path.exists(path):
        subprocess.run(["cargo", "build", "--release", "-p", "vigil-cli", "--bin", "vigil"], cwd=ROOT, check=True,
                       stdout=sys.stderr)
    return path


def stop(proc, grace=10):
    """SIGTERM, then SIGKILL after `grace` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
