"""`streameval stream --window` also takes the library's window strings (issue 21 item 7: the docs
wrote `1h/10m` and `session:30m`, which the command refused with "cannot parse window").

Each written form must give the same WindowSpec as the long form (`--window 1h --every 10m`,
`--sessions 30m [--session-key request]`) and as the library's `WindowSpec.parse`, and the checks
that depend on the window kind (the columnar engine's refusal) must see the rewritten options."""
import pytest

from streameval.jobs import stream, stream_args
from streameval.plan.windows import WindowSpec

H, M = 3_600_000_000, 60_000_000  # an hour and a minute in microseconds


def _spec(*argv):
    args, _ = stream_args.build_arg_parser().parse_known_args(["--replay", "--impressions", "x.avro", *argv])
    return stream_args.window_spec(args), args


@pytest.mark.parametrize("short, long, expected", [
    ("1h/10m", ["--window", "1h", "--every", "10m"], WindowSpec("sliding", H, 10 * M)),
    ("1h/1h", ["--window", "1h", "--every", "1h"], WindowSpec("fixed", H, H)),
    ("session:30m", ["--sessions", "30m"], WindowSpec("sessions", 30 * M, 0, "user")),
    ("Session:30m/request", ["--sessions", "30m", "--session-key", "request"],
     WindowSpec("sessions", 30 * M, 0, "request")),
    ("1d", ["--window", "1d"], WindowSpec("fixed", 24 * H, 24 * H)),
])
def test_short_forms_equal_long_forms(short, long, expected):
    got, args = _spec("--window", short)
    assert got == expected
    assert got == _spec(*long)[0]
    assert got == WindowSpec.parse(short)
    assert stream_args.window_spec(args) == expected  # the rewrite is idempotent (main calls it twice)


def test_columnar_refusal_sees_the_short_form():
    _, args = _spec("--window", "1h/10m")
    assert stream.columnar_refusal(args) == "the columnar engine has fixed windows only"
    _, args = _spec("--window", "session:30m")
    assert stream.columnar_refusal(args) == "the columnar engine has fixed windows only"


@pytest.mark.parametrize("argv, message", [
    (["--window", "1h/10m", "--every", "5m"], "excludes --every"),
    (["--window", "session:30m", "--sessions", "10m"], "excludes --sessions"),
    (["--window", "session:30m/device"], "per 'user' or per 'request'"),
    (["--window", "1h/7m"], "must be a multiple of its period"),
    (["--window", "1h/xx"], "cannot parse --every 'xx'"),  # the option named
])
def test_bad_forms_are_one_line_errors(argv, message, capsys):
    assert stream.main(["--replay", "--impressions", "x.avro", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("window", ["session:30m", "session:30m/request"])
def test_batch_names_the_streaming_job_for_session_windows(window, capsys):
    """The batch job has fixed and sliding windows (tests/test_batch_sliding.py): its one-line error
    for sessions says where they are."""
    from streameval.jobs import batch
    assert batch.main(["--impressions", "x.avro", "--output", "out", "--window", window]) == 2
    err = capsys.readouterr().err
    assert "the streaming job's" in err and err.count("\n") == 1, err
