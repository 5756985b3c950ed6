"""The engines' errors and warnings beside a failed engine test (tests/conftest.py): CI shows only
what pytest prints, and a flaky engine test must be readable from it."""

from .conftest import engine_log_excerpt


def test_the_excerpt_keeps_each_logs_last_errors_and_warnings_under_its_name(tmp_path):
    (tmp_path / "jobmanager.log").write_text(
        "".join(f"2026-12-06 INFO step {i}\n" for i in range(100))
        + "2026-12-06 WARN heartbeat of TaskManager timed out\n"
        + "".join(f"2026-12-06 ERROR NoResourceAvailableException {i}\n" for i in range(30)))
    (tmp_path / "prism.log").write_text('time=x level=INFO msg="Serving"\ntime=y level=WARN msg="additional bundle"\n')
    (tmp_path / "quiet.log").write_text("INFO only\n")
    (tmp_path / "notes.txt").write_text("ERROR not a log\n")
    text = engine_log_excerpt(tmp_path, lines=25)
    lines = text.splitlines()
    assert lines[0] == "--- jobmanager.log (last 25 of 31 such lines)"
    assert lines[1:26] == [f"2026-12-06 ERROR NoResourceAvailableException {i}" for i in range(5, 30)]
    assert lines[26:] == ["--- prism.log (last 1 of 1 such lines)", 'time=y level=WARN msg="additional bundle"']
    assert engine_log_excerpt(tmp_path / "absent") == ""
