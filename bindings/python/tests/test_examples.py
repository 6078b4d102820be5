"""examples/python/minimal.py prints what examples/minimal.c prints."""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_minimal_example_matches_minimal_c():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "minimal.py")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines.count("request 3: token 110") == 1
    assert "request 3: finished (stop token)" in lines
    assert "request 1: finished (length)" in lines and "request 2: finished (length)" in lines
    assert [l for l in lines if l.startswith("request 1: token")] == \
        ["request 1: token 105", "request 1: token 106"]
    assert len([l for l in lines if "token" in l and "finished" not in l]) == 2 + 4 + 6
