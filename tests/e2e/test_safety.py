"""Safety end to end: the dashboard is served to this machine alone unless --host says otherwise."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.support.studies import dashboard_server

# ---------------------------------------------------------------- the dashboard


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the sockets listening on `port` (from /proc/net/tcp and tcp6), in the
    kernel's hex notation: 0100007F is 127.0.0.1, 00000000 is every address."""
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                addresses.add(address)
    return addresses


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_the_dashboard_listens_on_this_machine_alone_by_default(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/board.db"
    optuna.create_study(study_name="board", storage=storage)
    with dashboard_server("--storage", storage, cwd=tmp_path) as (_, port):
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and no other address
