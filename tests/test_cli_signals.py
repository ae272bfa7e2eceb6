"""The command line's SIGINT and SIGTERM handlers: theirs while a command runs, and only
then (the stopping itself is tested per command, on real processes: test_metrics for
``metrics --serve`` and ``status --watch``, test_cli_simulate for ``simulate``)."""

from __future__ import annotations

import signal

from kvcache.cli import run


def test_a_command_run_in_process_gives_back_the_handlers_it_found(capsys) -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    assert run(["policies"]) == 0
    assert {signum: signal.getsignal(signum) for signum in before} == before
    assert "lru" in capsys.readouterr().out
