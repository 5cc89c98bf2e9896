"""The quickstart's first line: what it takes on a quiet machine and how busy this one is (pipelines.quickstart)."""

from pipelines.quickstart import QUIET_SECONDS, expected_time


def test_the_expected_time_names_the_quiet_figure_and_a_busy_load():
    quiet = expected_time(0.5, 2)
    assert f"{QUIET_SECONDS // 60} min {QUIET_SECONDS % 60} s" in quiet and "load now 0.5 on 2 cores" in quiet
    busy = expected_time(9.0, 2)
    assert "9.0 on 2 cores" in busy and "many times longer" in busy and "hsk doctor" in busy
    assert "load" not in expected_time(None, 2)
