"""pytest setup: the package from this source tree, the library from
$BATCHKV_LIBRARY (run_tests.py sets it; run by hand: BATCHKV_LIBRARY=
build/lib/libbatchkv.so /usr/bin/python3 -m pytest bindings/python/tests)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
