"""The suite's own guard rails: a hanging test fails alone, with a traceback, and markers are checked."""

import subprocess
import sys
import textwrap

import pytest

HANGS = textwrap.dedent("""
    import threading

    def test_waits_for_an_event_nobody_sets():
        threading.Event().wait()
""")


@pytest.mark.timeout(120)
def test_a_hanging_test_fails_within_its_timeout_with_a_traceback(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGS)
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    assert True\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=2",
                           "test_hang.py", "test_fine.py"], cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Timeout" in done.stdout and "test_hang.py" in done.stdout, done.stdout[-3000:]  # where it hung
    assert "wait()" in done.stdout or "threading.py" in done.stdout, done.stdout[-3000:]  # the stack, not a bare kill
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-3000:]  # the rest of the suite still ran

