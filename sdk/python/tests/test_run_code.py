"""sandbox.run_code against a real daemon (the Python snapshot)."""

from __future__ import annotations

import os
import threading
import time
from typing import List

import pytest

import forkd
from forkd import Sandbox


def test_result_logs_and_state(py_sandbox: Sandbox) -> None:
    ex = py_sandbox.run_code("x = 20\nprint('hello')\nx + 22")
    assert ex.error is None and not ex.timed_out
    assert ex.text == "42"
    assert len(ex.results) == 1 and ex.results[0].is_main_result and ex.main_result is ex.results[0]
    r = ex.results[0]
    assert r.text == "42" and "text" in r.formats() and str(r) == "42"
    assert ex.logs.stdout == ["hello\n"] and ex.logs.stderr == []
    # Variables persist between calls.
    assert py_sandbox.run_code("x * 2").text == "40"
    # No value: no main result.
    ex = py_sandbox.run_code("y = 1")
    assert ex.results == [] and ex.text is None


def test_exception_is_returned_not_raised(py_sandbox: Sandbox) -> None:
    ex = py_sandbox.run_code("print('before')\n1/0")
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError" and "division by zero" in ex.error.value
    assert "Traceback" in ex.error.traceback
    assert ex.logs.stdout == ["before\n"]


def test_html_result(py_sandbox: Sandbox) -> None:
    ex = py_sandbox.run_code(
        "class H:\n"
        "    def _repr_html_(self): return '<b>hi</b>'\n"
        "    def __repr__(self): return 'H()'\n"
        "H()"
    )
    r = ex.main_result
    assert r is not None and r.html == "<b>hi</b>" and r.text == "H()"
    assert r.formats()[:2] == ["text", "html"] and r._repr_html_() == "<b>hi</b>"


def test_display_outputs(py_sandbox: Sandbox) -> None:
    # Contract: display() calls land in `display`, in order, before the value.
    ex = py_sandbox.run_code(
        "class H:\n"
        "    def _repr_html_(self): return '<i>shown</i>'\n"
        "display(H())\n"
        "display('plain')\n"
        "7"
    )
    assert ex.error is None, ex.error
    assert [r.is_main_result for r in ex.results] == [False, False, True]
    assert ex.results[0].html == "<i>shown</i>"
    assert ex.results[1].text == "'plain'"
    assert ex.results[2].text == "7"


def test_rich_mime_types(py_sandbox: Sandbox) -> None:
    ex = py_sandbox.run_code(
        "class R:\n"
        "    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n-fake'\n"
        "    def _repr_json_(self): return {'a': [1, 2]}\n"
        "    def _repr_markdown_(self): return '**md**'\n"
        "    def _repr_svg_(self): return '<svg/>'\n"
        "R()"
    )
    r = ex.main_result
    assert r is not None, ex
    assert r.png_bytes() == b"\x89PNG\r\n\x1a\n-fake"
    assert r.json == {"a": [1, 2]} and r.markdown == "**md**" and r.svg == "<svg/>"
    assert set(r.formats()) == {"text", "png", "json", "markdown", "svg"}


def test_matplotlib_figures(client: forkd.Client, py_sandbox: Sandbox) -> None:
    """Figures left open come back in order as display results with a PNG.
    Needs matplotlib: the test snapshot's, or else a py-pandas snapshot's."""
    probe = "import importlib.util as u\nbool(u.find_spec('matplotlib'))"
    sb, own = py_sandbox, False
    if sb.run_code(probe).text != "True":
        tag = os.environ.get("FORKD_TEST_PANDAS_TAG", "py-pandas")
        if not client.snapshots.exists(tag):
            pytest.skip("matplotlib is not in %s and there is no %s snapshot" % (py_sandbox.tag, tag))
        sb, own = Sandbox.create(tag, client=client), True
    try:
        if sb.run_code(probe).text != "True":
            pytest.skip("matplotlib is not in %s" % sb.tag)
        ex = sb.run_code(
            "import matplotlib.pyplot as plt\n"
            "plt.figure(); plt.plot([1, 2, 3])\n"
            "plt.figure(); plt.bar([1, 2], [3, 4])\n"
            "'two figures'"
        )
        assert ex.error is None, ex.error
        figs = [r for r in ex.results if not r.is_main_result]
        assert len(figs) == 2 and all(r.png for r in figs)
        assert figs[0].png_bytes().startswith(b"\x89PNG")  # type: ignore[union-attr]
        assert figs[0].png != figs[1].png
        assert ex.results[-1].is_main_result and ex.text == "'two figures'"
    finally:
        if own:
            sb.kill()


def test_timeout_keeps_session(py_sandbox: Sandbox) -> None:
    py_sandbox.run_code("kept = 'yes'")
    t0 = time.monotonic()
    with pytest.raises(forkd.Timeout) as ei:
        py_sandbox.run_code("import time\nprint('started', flush=True)\ntime.sleep(30)", timeout=0.5)
    assert time.monotonic() - t0 < 25  # not the 30 s of the sleep
    ex = ei.value.execution
    assert ex is not None and ex.timed_out
    assert py_sandbox.run_code("kept").text == "'yes'"


def test_streaming_callbacks(py_sandbox: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    got_a = threading.Event()
    gate = "/tmp/gate-" + os.urandom(4).hex()

    def on_stdout(s: str) -> None:
        out.append(s)
        got_a.set()

    # The code goes on past "a" only once "a" reached the callback (a
    # thread opens the gate with a command): it was streamed while the
    # code ran, however slow the host.
    def release() -> None:
        if got_a.wait(60):
            py_sandbox.commands.run(["touch", gate])

    opener = threading.Thread(target=release, daemon=True)
    opener.start()
    ex = py_sandbox.run_code(
        "import os, sys, time\n"
        "print('a', flush=True)\n"
        "end = time.time() + 60\n"
        "while not os.path.exists(%r):\n"
        "    if time.time() > end: raise TimeoutError('a was not streamed while the code ran')\n"
        "    time.sleep(0.02)\n"
        "print('b', file=sys.stderr, flush=True)\n"
        "'done'" % gate,
        on_stdout=on_stdout,
        on_stderr=err.append,
    )
    opener.join()
    assert ex.error is None, ex.error
    assert "".join(out) == "a\n" and "".join(err) == "b\n"
    assert ex.logs.stdout_text == "a\n" and ex.logs.stderr_text == "b\n"
    assert ex.text == "'done'"
    ex = py_sandbox.run_code("raise ValueError('streamed')", on_stdout=print)
    assert ex.error is not None and ex.error.name == "ValueError"


def test_streaming_timeout(py_sandbox: Sandbox) -> None:
    # Seconds: "x" is out before the timeout on a loaded host too.
    with pytest.raises(forkd.Timeout) as ei:
        py_sandbox.run_code("import time\nprint('x', flush=True)\ntime.sleep(30)", timeout=3, on_stdout=lambda s: None)
    assert ei.value.execution is not None and ei.value.execution.logs.stdout_text == "x\n"


def test_run_code_without_python(sandbox: Sandbox) -> None:
    with pytest.raises(forkd.Conflict) as ei:
        sandbox.run_code("1")
    assert ei.value.code == "failed_precondition" and "Python" in ei.value.detail


def test_stream_cut_when_sandbox_killed(client: forkd.Client, py_tag: str) -> None:
    import threading

    sb = Sandbox.create(py_tag, client=client)
    try:
        # Killed once output arrived, so that there is some before the cut.
        ticked = threading.Event()

        def kill_after_tick() -> None:
            ticked.wait(60)
            sb.kill()

        threading.Thread(target=kill_after_tick, daemon=True).start()
        with pytest.raises(forkd.StreamInterrupted) as ei:
            sb.run_code("import time\nwhile True:\n    print('t', flush=True)\n    time.sleep(0.2)", on_stdout=lambda s: ticked.set())
        assert sb.id in str(ei.value)
        partial = ei.value.partial
        assert partial is not None and "t\n" in partial.logs.stdout_text
    finally:
        sb.kill()
