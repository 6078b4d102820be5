"""run_tests.py LIBBATCHKV BKV_LAYOUT [pytest args] - the meson test 'python'.

Runs pytest over bindings/python/tests against the library meson built (the
BATCHKV_LIBRARY the package loads) and the layout program (BKV_LAYOUT_EXE).
Exit 77 (meson: skipped) when this interpreter has no numpy or pytest
(Debian: apt-get install python3-numpy python3-pytest).
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print("python: %s (%s); skipped" % (e, sys.executable))
    sys.exit(77)
os.environ["BATCHKV_LIBRARY"] = os.path.abspath(sys.argv[1])
os.environ["BKV_LAYOUT_EXE"] = os.path.abspath(sys.argv[2])
sys.path.insert(0, here)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", here,
                      os.path.join(here, "tests")] + sys.argv[3:]))
